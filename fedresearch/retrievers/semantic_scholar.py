"""Semantic Scholar's Academic Graph: `GET {SEMANTIC_SCHOLAR_API_BASE_URL}/graph/v1/paper/search`.

An API key (`x-api-key`) is optional: without one, requests share a pool with every keyless client
and 429s are common, so a 429 pauses the upstream for every task with a doubling backoff (the
runner's limiter) instead of hammering it. A key's published rate is 1 request/s.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, SecretStr

from fedresearch.core.settings import secret
from fedresearch.core.text import author_names
from fedresearch.federation.contract import (
    About,
    Answer,
    Hits,
    HttpAnswer,
    HttpRequest,
    RetrieverFailed,
    SearchOptions,
    UpstreamSettings,
    first_text,
)
from fedresearch.federation.ratelimit import Rate
from fedresearch.retrievers.scholarly import Paper, as_dict, papers_to_hits, year_of


class SemanticScholarSettings(UpstreamSettings):
    """Semantic Scholar's: the optional API key (a request's own overrides it) and where the API is."""

    semantic_scholar_api_key: SecretStr | None = Field(None, validation_alias="SEMANTIC_SCHOLAR_API_KEY")
    semantic_scholar_api_base_url: str = Field(
        "https://api.semanticscholar.org", validation_alias="SEMANTIC_SCHOLAR_API_BASE_URL"
    )


about = About(
    website="https://www.semanticscholar.org/product/api",
    kind="scholarly",
    needs_key=False,
    needs_user=False,
    credentials=("semantic_scholar_api_key",),
    rate=Rate(1, backoff_s=2),
    settings=SemanticScholarSettings,
)

PATH = "/graph/v1/paper/search"
_LIMIT = 100
FIELDS = "title,abstract,authors,year,venue,externalIds,url,openAccessPdf"


def build_request(options: SearchOptions, base_url: str, api_key: str | None) -> HttpRequest:
    params = {"query": options.query, "limit": str(min(options.max_results, _LIMIT)), "fields": FIELDS}
    headers = {"x-api-key": api_key} if api_key else {}
    return HttpRequest("GET", base_url.rstrip("/") + PATH, params=params, headers=headers)


def _paper(item: Any) -> Paper | None:
    if not isinstance(item, dict):
        return None
    ids, pdf = as_dict(item.get("externalIds")), as_dict(item.get("openAccessPdf"))
    arxiv = first_text(ids, ("ArXiv",))
    return Paper(
        title=first_text(item, ("title",)) or "",
        url=first_text(item, ("url",)),
        doi=first_text(ids, ("DOI",)),
        authors=author_names(item.get("authors")),
        year=year_of(item.get("year")),
        venue=first_text(item, ("venue",)),
        abstract=first_text(item, ("abstract",)),
        pdf_url=first_text(pdf, ("url",)),
        arxiv_id=arxiv.lower() if arxiv else None,
        extra={"paper_id": item.get("paperId"), "pmid": first_text(ids, ("PubMed",))},
    )


def parse_response(payload: Any, retriever: str = "semantic_scholar") -> Hits:
    if not isinstance(payload, dict):
        raise RetrieverFailed("Semantic Scholar answered JSON that is not an object")
    data = payload.get("data", [])  # no matches: {"total": 0, "offset": 0} without data
    if not isinstance(data, list):
        raise RetrieverFailed("Semantic Scholar answered `data` that is not a list")
    results, warnings = papers_to_hits([_paper(item) for item in data], retriever, "Semantic Scholar")
    return Hits(results, warnings)


def describe_error(status: int, payload: Any) -> str:
    detail = first_text(payload, ("message", "error")) if isinstance(payload, dict) else None
    if status == 429:
        return "Semantic Scholar rate limit (429): the keyless pool is busy; set SEMANTIC_SCHOLAR_API_KEY"
    if status == 403:
        return "Semantic Scholar rejected the API key (403)" + (f": {detail}" if detail else "")
    return f"Semantic Scholar answered HTTP {status}" + (f": {detail}" if detail else "")


class SemanticScholar:
    name = "semantic_scholar"
    label = "Semantic Scholar"
    about = about

    def __init__(self, settings: SemanticScholarSettings) -> None:
        self.settings = settings

    def missing_setup(self) -> str | None:
        return None

    def build_request(self, options: SearchOptions) -> HttpRequest:
        api_key = options.credential("semantic_scholar_api_key") or secret(self.settings.semantic_scholar_api_key)
        return build_request(options, self.settings.semantic_scholar_api_base_url, api_key)

    def parse_response(self, answer: Answer, options: SearchOptions) -> Hits:
        assert isinstance(answer, HttpAnswer)
        return parse_response(answer.payload, self.name)

    def describe_error(self, answer: HttpAnswer) -> str:
        return describe_error(answer.status, answer.payload)


def adapters(settings: SemanticScholarSettings) -> list[SemanticScholar]:
    return [SemanticScholar(settings)]
