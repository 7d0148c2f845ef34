"""OpenAlex works search: `GET {OPENALEX_API_BASE_URL}/works?search=...&per-page=N&api_key=KEY`.

A free API key is required since February 2026 (openalex.org/settings/api); without one the adapter
is skipped with that reason. The published limit is 100 requests/s; 403 means that was exceeded and
429 that the day's allowance is spent. Abstracts come as an inverted index (word -> positions).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, SecretStr

from fedresearch.core.identifiers import arxiv_id_of
from fedresearch.core.settings import secret
from fedresearch.federation.contract import (
    About,
    Answer,
    Hits,
    HttpAnswer,
    HttpRequest,
    RetrieverFailed,
    RetrieverSkipped,
    SearchOptions,
    UpstreamSettings,
    first_text,
)
from fedresearch.federation.ratelimit import Rate
from fedresearch.retrievers.scholarly import Paper, as_dict, papers_to_hits, year_of


class OpenAlexSettings(UpstreamSettings):
    """OpenAlex's: the API key (a request's own overrides it) and where the API is."""

    openalex_api_key: SecretStr | None = Field(None, validation_alias="OPENALEX_API_KEY")
    openalex_api_base_url: str = Field("https://api.openalex.org", validation_alias="OPENALEX_API_BASE_URL")


about = About(
    website="https://developers.openalex.org",
    kind="scholarly",
    needs_key=True,
    needs_user=False,
    credentials=("openalex_api_key",),
    rate=Rate(100),
    settings=OpenAlexSettings,
)

PATH = "/works"
_PER_PAGE = 100
_NO_KEY = "OpenAlex needs a free API key since February 2026: set OPENALEX_API_KEY (openalex.org/settings/api)"


def build_request(options: SearchOptions, base_url: str, api_key: str) -> HttpRequest:
    params = {"search": options.query, "per-page": str(min(options.max_results, _PER_PAGE)), "api_key": api_key}
    return HttpRequest("GET", base_url.rstrip("/") + PATH, params=params)


def abstract_of(inverted: object) -> str:
    """The abstract rebuilt from OpenAlex's inverted index."""
    if not isinstance(inverted, dict):
        return ""
    placed = [
        (position, word)
        for word, positions in inverted.items()
        if isinstance(positions, list)
        for position in positions
        if isinstance(position, int)
    ]
    return " ".join(word for _, word in sorted(placed))


def _arxiv_id(work: dict[str, Any]) -> str | None:
    for location in work.get("locations") or []:
        page = as_dict(location).get("landing_page_url")
        if isinstance(page, str) and (found := arxiv_id_of(page)):
            return found
    return None


def _paper(work: Any) -> Paper | None:
    if not isinstance(work, dict):
        return None
    primary = as_dict(work.get("primary_location"))
    authors = [
        as_dict(a.get("author")).get("display_name") for a in work.get("authorships") or [] if isinstance(a, dict)
    ]
    pdf = first_text(as_dict(work.get("best_oa_location")), ("pdf_url",))
    pmid = str(as_dict(work.get("ids")).get("pmid") or "").rstrip("/").rpartition("/")[2]
    return Paper(
        title=first_text(work, ("title", "display_name")) or "",
        url=first_text(primary, ("landing_page_url",)) or first_text(work, ("id",)),
        doi=first_text(work, ("doi",)),
        authors=[name for name in authors if isinstance(name, str) and name.strip()],
        year=year_of(work.get("publication_year")),
        venue=first_text(as_dict(primary.get("source")), ("display_name",)),
        abstract=abstract_of(work.get("abstract_inverted_index")),
        pdf_url=pdf,
        arxiv_id=_arxiv_id(work),
        extra={"openalex_id": work.get("id"), "pmid": pmid or None, "cited_by_count": work.get("cited_by_count")},
    )


def parse_response(payload: Any, retriever: str = "openalex") -> Hits:
    works = payload.get("results") if isinstance(payload, dict) else None
    if not isinstance(works, list):
        raise RetrieverFailed("OpenAlex answered JSON without a results list")
    results, warnings = papers_to_hits([_paper(work) for work in works], retriever, "OpenAlex")
    return Hits(results, warnings)


def describe_error(status: int, payload: Any) -> str:
    detail = ": ".join(
        text for text in (first_text(as_dict(payload), ("error",)), first_text(as_dict(payload), ("message",))) if text
    )
    reason = {
        401: "rejected the API key",
        403: "rate limit exceeded (100 requests/s)",
        429: "daily allowance spent",
    }.get(status, "answered")
    return f"OpenAlex {reason} (HTTP {status})" + (f": {detail}" if detail else "")


class OpenAlex:
    name = "openalex"
    label = "OpenAlex"
    about = about

    def __init__(self, settings: OpenAlexSettings) -> None:
        self.settings = settings

    def missing_setup(self) -> str | None:
        return None if secret(self.settings.openalex_api_key) else _NO_KEY

    def build_request(self, options: SearchOptions) -> HttpRequest:
        api_key = options.credential("openalex_api_key") or secret(self.settings.openalex_api_key)
        if not api_key:
            raise RetrieverSkipped(_NO_KEY)
        return build_request(options, self.settings.openalex_api_base_url, api_key)

    def parse_response(self, answer: Answer, options: SearchOptions) -> Hits:
        assert isinstance(answer, HttpAnswer)
        return parse_response(answer.payload, self.name)

    def describe_error(self, answer: HttpAnswer) -> str:
        return describe_error(answer.status, answer.payload)


def adapters(settings: OpenAlexSettings) -> list[OpenAlex]:
    return [OpenAlex(settings)]
