"""What a reference says about its source, in one typed record, whatever found it.

Sources carry what their upstream knew in `metadata` (retrievers/scholarly.py for OpenAlex,
Crossref, Semantic Scholar, arXiv, PubMed and Europe PMC; retrievers/internal_api.py for the
user's library; the web adapters for pages): `citation_of` reads those keys once, so the reference
styles (report/styles.py) and the BibTeX and RIS files (report/bibfiles.py) read one shape.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import date
from typing import Any, Literal
from urllib.parse import urlsplit

from fedresearch.core.identifiers import doi_of, doi_url, is_url
from fedresearch.core.models import FusedResult

# what kind of thing is cited: it decides the entry's form in every style and file
CitedKind = Literal["journal", "proceedings", "preprint", "paper", "webpage", "note", "file", "document"]

_PROCEEDINGS_TYPES = {"proceedings-article", "proceedings", "inproceedings", "conference"}
_JOURNAL_TYPES = {"journal-article", "article", "journal"}
# a venue named like a conference ("SIGIR", "Proceedings of …", "EMNLP 2020", "NeurIPS Datasets and Benchmarks")
_CONFERENCE = re.compile(
    r"\b(proceedings|conference|symposium|workshop|sigir|cikm|icml|neurips|nips|emnlp|acl|eacl|naacl|kdd|"
    r"www|wsdm|ecir|iclr|aaai|ijcai|trec)\b",
    re.IGNORECASE,
)
_PREPRINT = re.compile(r"\b(arxiv|biorxiv|medrxiv|ssrn|preprint)\b", re.IGNORECASE)
_SECTION_MARK = " › "  # how a library hit's title joins a note's title and its section (library/search.py)


@dataclass(frozen=True)
class Person:
    """An author as a citation style wants one: family and given names, or one literal name (an
    organisation, or a name in a script without that split, such as Chinese)."""

    family: str = ""
    given: str = ""
    literal: str = ""

    @property
    def display(self) -> str:
        return self.literal or " ".join(part for part in (self.given, self.family) if part)

    @property
    def inverted(self) -> str:
        """Family first, as BibTeX and RIS write a name: `Cormack, Gordon V.`."""
        if self.literal:
            return self.literal
        return f"{self.family}, {self.given}" if self.given else self.family


@dataclass(frozen=True)
class Citation:
    """One cited source: what a reference entry, a BibTeX entry and an RIS record are made from.
    A passage of the user's library also says where in the document it is (`section`, `page`),
    the file it was read from (`file`) and which document of the library holds it (`document_id`)."""

    kind: CitedKind
    title: str
    authors: tuple[Person, ...] = ()
    year: int | None = None
    venue: str | None = None
    doi: str | None = None
    url: str | None = None  # the link a reader follows: the DOI's address for a paper that has one
    site: str | None = None  # a web page's site
    accessed: date | None = None  # when a web page was read
    document: str | None = None  # the paper a highlight is in, when the title names the highlight
    file: str | None = None  # the name of the file a library passage was read from
    section: str | None = None
    page: int | None = None
    document_id: str | None = None
    location: str | None = None  # where a source without an address is, as the report names it (`note:3`)
    # for the BibTeX and RIS files; left out of equality and hashing, so that the entries written
    # once per process (report/styles.py) are not remembered by a paper's whole abstract
    abstract: str | None = field(default=None, compare=False)

    @property
    def link(self) -> str | None:
        return doi_url(self.doi) if self.doi else self.url

    @property
    def in_library(self) -> bool:
        return self.kind in ("note", "file") or self.document_id is not None


def citation_of(source: FusedResult, accessed: date | None = None) -> Citation:
    return citation_from(source.title, source.href, source.metadata, accessed)


def citation_from(title: str, href: str, metadata: dict[str, Any], accessed: date | None = None) -> Citation:
    """The record of a source known by its title, address and metadata (a saved report's `sources`
    list has just these, so a report saved earlier gives its BibTeX as a live one does)."""
    kind_field = str(metadata.get("type") or "")
    doi = _doi(metadata.get("doi")) or _doi(href)
    url = href.strip() if is_url(href) else _text(metadata.get("url"))
    title = " ".join(str(metadata.get("title") or title).split())
    common: dict[str, Any] = {
        "authors": tuple(person(name) for name in _names(metadata.get("authors"))),
        "year": _year(metadata.get("year")),
        "doi": doi,
        "url": url if url and is_url(url) else None,
        "abstract": _text(metadata.get("abstract")),
        "document_id": _text(metadata.get("document_id")),
        "location": None if is_url(href) else href.strip() or None,
    }
    if kind_field in ("highlight", "note", "file"):
        section = _text(metadata.get("section"))
        document = title
        if section and title.endswith(f"{_SECTION_MARK}{section}"):
            document = title[: -len(_SECTION_MARK + section)]
        paper_doi = _doi(metadata.get("paper_doi"))
        return Citation(
            kind="file" if kind_field == "file" else "note",
            title=document or section or "Untitled",
            section=section if section != document else None,
            page=_page(metadata.get("page")),
            document=_text(metadata.get("paper_title")),
            file=_text(metadata.get("file")),
            **{**common, "doi": common["doi"] or paper_doi},
        )
    venue = _text(metadata.get("venue")) or _text(metadata.get("journal"))
    if kind_field in ("paper", "biblio") or doi or metadata.get("authors"):
        return Citation(kind=_paper_kind(metadata, venue, doi), title=title or "Untitled", venue=venue, **common)
    site = _text(metadata.get("display_link")) or _site(url)
    if url:
        return Citation(kind="webpage", title=title or url, site=site, accessed=accessed, **common)
    return Citation(kind="document", title=title or href or "Untitled", venue=venue, **common)


def person(name: str) -> Person:
    """`Cormack, Gordon V.` or `Gordon V. Cormack` as family and given names; a name in one
    piece, or in Chinese, Japanese or Korean characters, as it is written."""
    name = " ".join(name.split())
    if "," in name:
        family, _, given = name.partition(",")
        return Person(family=family.strip(), given=given.strip())
    parts = name.split(" ")
    if len(parts) == 1 or any(ord(character) > 0x2E7F for character in name):
        return Person(literal=name)
    return Person(family=parts[-1], given=" ".join(parts[:-1]))


def _paper_kind(metadata: dict[str, Any], venue: str | None, doi: str | None) -> CitedKind:
    work_type = str(metadata.get("work_type") or metadata.get("publication_type") or "").lower()
    if work_type in _PROCEEDINGS_TYPES:
        return "proceedings"
    if work_type in _JOURNAL_TYPES:
        return "journal"
    if metadata.get("arxiv_id") or (venue and _PREPRINT.search(venue)) or (doi and doi.startswith("10.48550/")):
        return "preprint"
    if venue:
        return "proceedings" if _CONFERENCE.search(venue) else "journal"
    return "paper"


def _names(value: object) -> list[str]:
    if isinstance(value, str):
        return [name.strip() for name in re.split(r";| and ", value) if name.strip()]
    if isinstance(value, list):
        return [" ".join(str(name).split()) for name in value if isinstance(name, str) and name.strip()]
    return []


def _doi(value: object) -> str | None:
    return doi_of(value) if isinstance(value, str) and value.strip() else None


def _text(value: object) -> str | None:
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        text = " ".join(str(value).split())
        return text or None
    return None


def _year(value: object) -> int | None:
    match = re.search(r"\b(1[5-9]\d\d|20\d\d)\b", str(value)) if isinstance(value, (str, int)) else None
    return int(match.group(1)) if match else None


def _page(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return int(value) if isinstance(value, str) and value.strip().isdecimal() else None


def _site(url: str | None) -> str | None:
    host = (urlsplit(url).hostname or "") if url else ""
    return host.removeprefix("www.") or None
