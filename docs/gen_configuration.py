"""Writes docs/configuration.md, the reference of every setting, from the code.

    python docs/gen_configuration.py            # (re)write docs/configuration.md; `make docs` runs it
    python docs/gen_configuration.py --check    # exit 1 when the committed file differs

The settings are the fields of the server's `Settings` (fedresearch/core/settings.py) and of each
upstream's settings class, found through the registry tuple `fedresearch.retrievers.ADAPTERS` (each
entry's `about.settings`): name, default and accepted values come from the fields. What a setting
means comes from `.env.example`: the comment lines right above a setting's line, which also cover
the settings that follow it until the next comment or blank line.
"""

from __future__ import annotations

import argparse
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from fedresearch.core.settings import Settings
from fedresearch.retrievers import ADAPTERS

ROOT = Path(__file__).resolve().parents[1]
ENV_EXAMPLE = ROOT / ".env.example"
TARGET = ROOT / "docs" / "configuration.md"

HEAD = """\
# Configuration reference

<!-- Written by docs/gen_configuration.py (`make docs`) from the code and .env.example: edit those,
not this file. tests/cli/test_docs.py fails when this file is not what the generator writes. -->

Every setting is an environment variable or a line in `.env`, read from the folder a command is
started in (`.env.example`, at the repository's root, lists every setting with its default: copy it
to `.env` and change what you need). The environment wins over `.env`. An empty value (`NAME=`) leaves a setting
that is unset by default unset. A value the server cannot use stops it at start with the setting's
name and what is wrong, never the value (a URL may hold a password).

This page is generated from the code: the server's own settings (`Settings` in
`fedresearch/core/settings.py`) and each upstream's settings class (named by its `About` in
`fedresearch/retrievers/`); the meanings are the comments of `.env.example`. Settings that one
comment describes together share a row.
"""


def comments(path: Path = ENV_EXAMPLE) -> dict[str, str]:
    """Each setting's meaning: the comment block above its line in `.env.example` (a block also
    covers the settings right after the first, until a comment or a blank line comes)."""
    meanings: dict[str, str] = {}
    block: list[str] = []
    current = ""
    previous_was_setting = False
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line:
            block, current, previous_was_setting = [], "", False
        elif line.startswith("#"):
            if previous_was_setting:
                block = []
            block.append(line.lstrip("#").strip())
            previous_was_setting = False
        elif "=" in line:
            if block:
                current = " ".join(block)
                block = []
            meanings[line.split("=", 1)[0].strip()] = current
            previous_was_setting = True
    return meanings


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        if field.default_factory in (list, dict):
            return "empty"
        return "unset"  # computed when read: the meaning says what unset means
    value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    if isinstance(value, list | tuple):
        return f"`{','.join(map(str, value))}`" if value else "empty"
    if isinstance(value, dict):
        return "empty" if not value else f"`{','.join(f'{k}={v}' for k, v in value.items())}`"
    return f"`{value}`"


_KINDS: dict[Any, str] = {
    bool: "true or false",
    int: "integer",
    float: "number",
    str: "text",
    SecretStr: "text (secret)",
    Path: "path",
}


def _kind(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        parts = [_kind(arg) for arg in typing.get_args(annotation) if arg is not type(None)]
        return " or ".join(parts)
    if origin is typing.Literal:
        return " or ".join(f"`{arg}`" for arg in typing.get_args(annotation))
    if origin is list:
        return "comma list"
    if origin is dict:
        return "name=value pairs, comma-separated"
    if origin is typing.Annotated:
        return _kind(typing.get_args(annotation)[0])
    return _KINDS.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _values(field: FieldInfo) -> str:
    bounds = []
    for rule in field.metadata:
        if isinstance(rule, Ge):
            bounds.append(f"≥ {rule.ge:g}")
        elif isinstance(rule, Gt):
            bounds.append(f"> {rule.gt:g}")
        elif isinstance(rule, Le):
            bounds.append(f"≤ {rule.le:g}")
        elif isinstance(rule, Lt):
            bounds.append(f"< {rule.lt:g}")
    kind = _kind(field.annotation)
    return f"{kind}, {' and '.join(bounds)}" if bounds else kind


def _rows(settings: type[BaseModel], meanings: dict[str, str]) -> Iterator[str]:
    """One table row per run of settings that `.env.example` describes together, in its order."""
    order = list(meanings)
    fields = sorted(
        ((str(field.validation_alias), field) for field in settings.model_fields.values()),
        key=lambda named: order.index(named[0]) if named[0] in order else len(order),
    )
    groups: list[tuple[str, list[tuple[str, FieldInfo]]]] = []
    for name, field in fields:
        meaning = meanings.get(name, "")
        if not meaning:
            raise SystemExit(f"{name} ({settings.__name__}) has no comment in .env.example: say what it means there")
        if groups and groups[-1][0] == meaning and order.index(name) == order.index(groups[-1][1][-1][0]) + 1:
            groups[-1][1].append((name, field))
        else:
            groups.append((meaning, [(name, field)]))
    for meaning, members in groups:
        cells = (
            "<br>".join(f"`{name}`" for name, _ in members),
            "<br>".join(_default(field) for _, field in members),
            "<br>".join(_values(field) for _, field in members),
            meaning.replace("|", "\\|").replace("*", "\\*"),
        )
        yield "| " + " | ".join(cells) + " |"


def _table(settings: type[BaseModel], meanings: dict[str, str]) -> str:
    head = "| setting | default | values | meaning |\n|---|---|---|---|\n"
    return head + "\n".join(_rows(settings, meanings)) + "\n"


def _doc(cls: type) -> str:
    return " ".join((cls.__doc__ or "").split())


def render() -> str:
    meanings = comments()
    parts = [HEAD]
    parts.append("\n## The server\n\n")
    parts.append(f"`{Settings.__name__}` (`fedresearch/core/settings.py`): the server's own settings.\n\n")
    parts.append(_table(Settings, meanings))
    parts.append("\n## Upstreams\n\n")
    parts.append(
        "Each upstream reads its own settings, and its adapters see nothing else. In the order of the\n"
        "registry tuple `ADAPTERS` (`fedresearch/retrievers/__init__.py`):\n"
    )
    for upstream in ADAPTERS:
        settings = upstream.about.settings
        module = settings.__module__
        path = module.replace(".", "/") + ".py"
        parts.append(f"\n### {module.rsplit('.', 1)[-1]}\n\n")
        website = upstream.about.website
        site = f"<{website}>" if website.startswith("https://") else website
        parts.append(f"{_doc(settings)} Kind: {upstream.about.kind}; {site}; `{settings.__name__}` in `{path}`.\n\n")
        parts.append(_table(settings, meanings))
    return "".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/configuration.md is not up to date")
    args = parser.parse_args()
    text = render()
    if args.check:
        if TARGET.read_text(encoding="utf-8") != text:
            print(f"{TARGET.relative_to(ROOT)} is out of date: run `make docs`", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text, encoding="utf-8")
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
