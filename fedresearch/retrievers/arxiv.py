"""arXiv's Atom API: `GET {ARXIV_API_BASE_URL}/api/query?search_query=all:...&max_results=N`.

arXiv asks for at most one request every three seconds over a single connection (its API terms);
`About.rate` says so and the runner keeps every task of the process to it. An entry's `arxiv:doi` is
the journal version's DOI, which is how fusion joins the preprint with the published paper.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from pydantic import Field

from fedresearch.core.identifiers import arxiv_id_of
from fedresearch.federation.contract import (
    About,
    Answer,
    Hits,
    HttpAnswer,
    HttpRequest,
    RetrieverFailed,
    SearchOptions,
    UpstreamSettings,
)
from fedresearch.federation.ratelimit import Rate
from fedresearch.retrievers.scholarly import Paper, papers_to_hits, parse_xml, xml_text, year_of


class ArxivSettings(UpstreamSettings):
    """arXiv's: where the API is."""

    arxiv_api_base_url: str = Field("https://export.arxiv.org", validation_alias="ARXIV_API_BASE_URL")


about = About(
    website="https://info.arxiv.org/help/api/",
    kind="scholarly",
    needs_key=False,
    needs_user=False,
    results="XML",
    rate=Rate(1, per_s=3, connections=1, backoff_s=3),
    settings=ArxivSettings,
)

PATH = "/api/query"
_MAX_RESULTS = 50
_NS = {"atom": "http://www.w3.org/2005/Atom", "arxiv": "http://arxiv.org/schemas/atom"}


def build_request(options: SearchOptions, base_url: str) -> HttpRequest:
    params = {
        "search_query": f"all:{options.query}",
        "start": "0",
        "max_results": str(min(options.max_results, _MAX_RESULTS)),
        "sortBy": "relevance",
    }
    return HttpRequest("GET", base_url.rstrip("/") + PATH, params=params)


def _error_of(feed: ET.Element) -> str | None:
    """arXiv reports a bad query as a feed whose one entry has an .../api/errors id."""
    for entry in feed.findall("atom:entry", _NS):
        if "/api/errors" in xml_text(entry.find("atom:id", _NS)):
            return xml_text(entry.find("atom:summary", _NS)) or "unknown error"
    return None


def _paper(entry: ET.Element) -> Paper:
    page = xml_text(entry.find("atom:id", _NS))
    category = entry.find("arxiv:primary_category", _NS)
    pdf = next((link.get("href") for link in entry.findall("atom:link", _NS) if link.get("title") == "pdf"), None)
    return Paper(
        title=xml_text(entry.find("atom:title", _NS)),
        url=page or None,
        doi=xml_text(entry.find("arxiv:doi", _NS)) or None,
        authors=[xml_text(name) for name in entry.findall("atom:author/atom:name", _NS) if xml_text(name)],
        year=year_of(xml_text(entry.find("atom:published", _NS))),
        venue=xml_text(entry.find("arxiv:journal_ref", _NS)) or "arXiv",
        abstract=xml_text(entry.find("atom:summary", _NS)),
        pdf_url=pdf,
        arxiv_id=arxiv_id_of(page),
        extra={"primary_category": category.get("term")} if category is not None else {},
    )


def parse_response(payload: Any, retriever: str = "arxiv") -> Hits:
    feed = parse_xml(payload, "arXiv")
    if feed.tag != "{http://www.w3.org/2005/Atom}feed":
        raise RetrieverFailed("arXiv answered XML that is not an Atom feed")
    if (error := _error_of(feed)) is not None:
        raise RetrieverFailed(f"arXiv rejected the query: {error}")
    results, warnings = papers_to_hits([_paper(entry) for entry in feed.findall("atom:entry", _NS)], retriever, "arXiv")
    return Hits(results, warnings)


def describe_error(status: int, payload: Any) -> str:
    if status == 429:
        return "arXiv rate limit exceeded (429): it allows one request every 3 s"
    try:
        error = _error_of(ET.fromstring(payload)) if isinstance(payload, str) and payload.strip() else None
    except ET.ParseError:
        error = None
    return f"arXiv answered HTTP {status}" + (f": {error}" if error else "")


class Arxiv:
    name = "arxiv"
    label = "arXiv"
    about = about

    def __init__(self, settings: ArxivSettings) -> None:
        self.settings = settings

    def missing_setup(self) -> str | None:
        return None

    def build_request(self, options: SearchOptions) -> HttpRequest:
        return build_request(options, self.settings.arxiv_api_base_url)

    def parse_response(self, answer: Answer, options: SearchOptions) -> Hits:
        assert isinstance(answer, HttpAnswer)
        return parse_response(answer.payload, self.name)

    def describe_error(self, answer: HttpAnswer) -> str:
        return describe_error(answer.status, answer.payload)


def adapters(settings: ArxivSettings) -> list[Arxiv]:
    return [Arxiv(settings)]
