"""A report's references as files a reference manager imports: BibTeX (bibtexparser) and RIS
(rispy), made from the saved record's `sources` (each source's title, address and metadata, as
report/task.py saves them), so a report saved before these files existed has them too.

Zotero, Mendeley, JabRef and EndNote import both. Every entry's type is one they know, every
BibTeX key is unique within the file, and text stays as it was written (UTF-8, non-ASCII kept);
BibTeX's own braces and backslashes, which would change what a field says, are replaced.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from datetime import date, datetime
from typing import Any

import rispy
from bibtexparser.entrypoint import write_string
from bibtexparser.library import Library
from bibtexparser.model import Entry, Field

from fedresearch.core.text import STOPWORDS
from fedresearch.report.bibliography import Citation, CitedKind, citation_from

# the kinds as BibTeX entry types and RIS reference types (Zotero: journalArticle, conferencePaper,
# preprint / manuscript, webpage, document)
_BIBTEX_TYPES: dict[CitedKind, str] = {
    "journal": "article",
    "proceedings": "inproceedings",
    "preprint": "misc",
    "paper": "misc",
    "webpage": "misc",
    "note": "misc",
    "file": "misc",
    "document": "misc",
}
_RIS_TYPES: dict[CitedKind, str] = {
    "journal": "JOUR",
    "proceedings": "CPAPER",
    "preprint": "UNPB",
    "paper": "GEN",
    "webpage": "ELEC",
    "note": "GEN",
    "file": "GEN",
    "document": "GEN",
}
_BRACES = str.maketrans({"{": "(", "}": ")", "\\": "/"})
_KEY_WORD = re.compile(r"[A-Za-z0-9]+")


def record_citations(record: dict[str, Any]) -> list[Citation]:
    """The cited sources of a saved report's record, in the report's order; a web page as read on
    the day the report was written."""
    accessed = _day(record.get("created_at"))
    sources: list[dict[str, Any]] = [s for s in record.get("sources") or [] if isinstance(s, dict)]
    sources.sort(key=_number)
    return [
        citation_from(str(source.get("title") or ""), str(source.get("href") or ""), _metadata(source), accessed)
        for source in sources
    ]


def _number(source: dict[str, Any]) -> int:
    number = source.get("number")
    return number if isinstance(number, int) else 0


def _metadata(source: dict[str, Any]) -> dict[str, Any]:
    metadata = source.get("metadata")
    return metadata if isinstance(metadata, dict) else {}


def bibtex(citations: Sequence[Citation]) -> str:
    library = Library()
    for key, citation in zip(_keys(citations), citations, strict=True):
        fields = [Field(name, _braced(value)) for name, value in _bibtex_fields(citation) if value]
        library.add(Entry(_BIBTEX_TYPES[citation.kind], key, fields))
    return str(write_string(library))


class _RisWriter(rispy.RisWriter):  # type: ignore[misc]  # rispy is untyped
    """rispy's writer without the `1.` line it puts before each record, which is no RIS tag."""

    def set_header(self, count: int) -> str:
        return ""


def ris(citations: Sequence[Citation]) -> str:
    return str(rispy.dumps([_ris_record(citation) for citation in citations], implementation=_RisWriter))


def _bibtex_fields(citation: Citation) -> list[tuple[str, str | None]]:
    authors = " and ".join(person.inverted for person in citation.authors)
    venue_field = {"journal": "journal", "proceedings": "booktitle"}.get(citation.kind, "howpublished")
    return [
        ("title", citation.title),
        ("author", authors or None),
        ("year", str(citation.year) if citation.year else None),
        (venue_field, citation.venue or citation.site),
        ("doi", citation.doi),
        ("url", citation.url if not citation.doi else None),
        ("urldate", citation.accessed.isoformat() if citation.accessed else None),
        ("note", _library_note(citation)),
        ("abstract", citation.abstract),
    ]


def _ris_record(citation: Citation) -> dict[str, Any]:
    record: dict[str, Any] = {"type_of_reference": _RIS_TYPES[citation.kind], "title": citation.title}
    if citation.authors:
        record["authors"] = [person.inverted for person in citation.authors]
    if citation.year:
        record["year"] = str(citation.year)
    if citation.venue:
        record["journal_name" if citation.kind == "journal" else "secondary_title"] = citation.venue
    elif citation.site:
        record["secondary_title"] = citation.site
    if citation.doi:
        record["doi"] = citation.doi
    if citation.link:
        record["urls"] = [citation.link]
    if citation.accessed:
        record["access_date"] = citation.accessed.strftime("%Y/%m/%d")
    if note := _library_note(citation):
        record["notes"] = [note]
    if citation.abstract:
        record["abstract"] = citation.abstract
    return record


def _library_note(citation: Citation) -> str | None:
    """Where a passage of the user's library is, in words a reference manager keeps as a note."""
    if citation.kind not in ("note", "file"):
        return None
    parts = ["Note in your library" if citation.kind == "note" else "File in your library"]
    if citation.document:
        parts.append(f"on {citation.document}")
    if citation.file:
        parts.append(f"file {citation.file}")
    if citation.section:
        parts.append(f"section “{citation.section}”")
    if citation.page is not None:
        parts.append(f"p. {citation.page}")
    if citation.location:
        parts.append(f"({citation.location})")
    return ", ".join(parts)


def _keys(citations: Sequence[Citation]) -> list[str]:
    """BibTeX keys as reference managers make them (`cormack2009reciprocal`), unique in the file."""
    keys: list[str] = []
    taken: set[str] = set()
    for citation in citations:
        family = citation.authors[0].family or citation.authors[0].literal if citation.authors else ""
        title_word = next(
            (w for w in _KEY_WORD.findall(_ascii(citation.title).lower()) if w not in STOPWORDS and len(w) > 2), ""
        )
        base = "".join(_KEY_WORD.findall(_ascii(family).lower())) + str(citation.year or "") + title_word
        base = base or "ref"
        key, suffix = base, 0
        while key in taken:
            suffix += 1
            key = f"{base}{_letters(suffix)}"
        taken.add(key)
        keys.append(key)
    return keys


def _letters(number: int) -> str:
    """1 -> a, 26 -> z, 27 -> aa: the suffixes reference managers give keys that collide."""
    out = ""
    while number:
        number, rest = divmod(number - 1, 26)
        out = chr(ord("a") + rest) + out
    return out


def _ascii(text: str) -> str:
    return unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()


def _braced(value: str) -> str:
    return " ".join(value.translate(_BRACES).split())


def _day(value: object) -> date | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).date()
    except ValueError:
        return None
