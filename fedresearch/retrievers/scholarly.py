"""What every scholarly adapter shares: one paper as a normalized result, the scholarly metadata
fields (doi, title, authors, year, venue, abstract, pdf_url, arxiv_id) named once, abstract markup
(JATS, HTML) turned into text, and XML answers parsed safely."""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

from fedresearch.core.identifiers import arxiv_id_of, doi_of, doi_url
from fedresearch.core.models import SearchResult
from fedresearch.federation.contract import RetrieverFailed

_TAG = re.compile(r"<[^>]{0,500}>")
_SPACE_BEFORE_PUNCTUATION = re.compile(r"\s+([.,;:!?)])")
_YEAR = re.compile(r"\b(1[5-9]\d\d|20\d\d)\b")


def as_dict(value: object) -> dict[str, Any]:
    """`value` if it is a JSON object, else an empty one (absent and malformed read alike)."""
    return value if isinstance(value, dict) else {}


def plain_text(value: object) -> str:
    """Markup-free text: JATS or HTML tags dropped, entities decoded, whitespace collapsed."""
    if not isinstance(value, str):
        return ""
    # a tag may separate words (<p>) or sit inside one's sentence (<b>): space, then mend punctuation
    return _SPACE_BEFORE_PUNCTUATION.sub(r"\1", " ".join(html.unescape(_TAG.sub(" ", value)).split()))


def year_of(value: object) -> int | None:
    """A publication year from a number or the first plausible year in a date string."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if 1500 <= value <= 2100 else None
    match = _YEAR.search(value) if isinstance(value, str) else None
    return int(match.group(1)) if match else None


@dataclass
class Paper:
    """One scholarly record as an adapter read it; `result` makes it the normalized result."""

    title: str
    url: str | None = None  # the upstream's landing page
    doi: str | None = None
    authors: list[str] = field(default_factory=list)
    year: int | None = None
    venue: str | None = None
    abstract: str | None = None
    pdf_url: str | None = None
    arxiv_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def result(self, retriever: str, rank: int) -> SearchResult | None:
        """The result, linked by its DOI when it has one (the stable link), else by its page; None
        when it has neither a title nor a link."""
        doi = doi_of(self.doi) if self.doi else None
        if doi is not None and (arxiv := arxiv_id_of(doi)) is not None:
            doi, self.arxiv_id = None, self.arxiv_id or arxiv  # arXiv's own DOI names the preprint
        title = plain_text(self.title)
        href = doi_url(doi) if doi else (self.url or "").strip()
        if not href or not title:
            return None
        abstract = plain_text(self.abstract)
        metadata: dict[str, Any] = {
            "type": "paper",
            "doi": doi,
            "title": title,
            "authors": self.authors,
            "year": self.year,
            "venue": plain_text(self.venue) or None,
            "abstract": abstract or None,
            "pdf_url": self.pdf_url or None,
            "arxiv_id": self.arxiv_id,
            "url": self.url,
            **self.extra,
        }
        metadata = {name: value for name, value in metadata.items() if value not in (None, "", [])}
        body = abstract or _citation(title, self.authors, metadata.get("venue"), self.year)
        return SearchResult(href=href, body=body, title=title, retriever=retriever, rank=rank, metadata=metadata)


def _citation(title: str, authors: list[str], venue: object, year: int | None) -> str:
    """What stands for a paper with no abstract: its reference line."""
    who = ", ".join(authors[:3]) + (" et al." if len(authors) > 3 else "")
    where = ", ".join(str(part) for part in (venue, year) if part)
    return " ".join(part for part in (f"{title}.", f"{who}." if who else "", f"{where}." if where else "") if part)


def papers_to_hits(papers: list[Paper | None], retriever: str, label: str) -> tuple[list[SearchResult], list[str]]:
    """Results ranked 1..n, and a warning for each record that had neither title nor link."""
    results: list[SearchResult] = []
    warnings: list[str] = []
    for paper in papers:
        result = paper.result(retriever, len(results) + 1) if paper is not None else None
        if result is None:
            warnings.append(f"skipped a {label} record without title or link")
        else:
            results.append(result)
    return results, warnings


def parse_xml(text: object, label: str) -> ET.Element:
    """An XML answer's root. The standard library's parser is safe here: it never fetches external
    entities, and expat >= 2.4 (CPython bundles 2.5+) refuses entity-expansion bombs (tested)."""
    if not isinstance(text, str):
        raise RetrieverFailed(f"{label} answered no XML")
    try:
        return ET.fromstring(text)
    except ET.ParseError as error:
        raise RetrieverFailed(f"{label} answered malformed XML ({error})") from error


def xml_text(element: ET.Element | None) -> str:
    """All the text inside `element` (inline markup such as <i> included), whitespace collapsed."""
    return " ".join("".join(element.itertext()).split()) if element is not None else ""
