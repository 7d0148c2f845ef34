"""A self-hosted SearxNG instance's JSON API: `GET {SEARXNG_URL}/search?q=...&format=json`.

SearxNG answers JSON only when its settings.yml lists `json` under `search.formats`; otherwise it
answers 403, and the failure says so. Engines that failed inside SearxNG come back as
`unresponsive_engines` and are reported as warnings; science engines add doi, journal and pdf_url.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from fedresearch.core.models import SearchResult
from fedresearch.core.text import author_names
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
from fedresearch.retrievers.google import with_sites
from fedresearch.retrievers.scholarly import plain_text


class SearxngSettings(UpstreamSettings):
    """SearxNG's: the instance's URL (unset: the retriever is skipped)."""

    searxng_url: str | None = Field(None, validation_alias="SEARXNG_URL")


about = About(
    website="https://docs.searxng.org/dev/search_api.html",
    kind="web",
    needs_key=True,
    needs_user=False,
    settings=SearxngSettings,
)

PATH = "/search"
_NOT_SET = "set SEARXNG_URL to your SearxNG instance (with json in its search.formats)"


def build_request(options: SearchOptions, base_url: str) -> HttpRequest:
    params = {"q": with_sites(options), "format": "json", "pageno": "1"}
    return HttpRequest("GET", base_url.rstrip("/") + PATH, params=params)


def _result(item: Any, retriever: str, rank: int) -> SearchResult | None:
    if not isinstance(item, dict):
        return None
    url, body = first_text(item, ("url",)), plain_text(item.get("content"))
    if url is None or not body:
        return None
    metadata = {
        "type": "web",
        "engines": item.get("engines"),
        "published": item.get("publishedDate"),
        "doi": first_text(item, ("doi",)),
        "venue": first_text(item, ("journal",)),
        "authors": author_names(item.get("authors")),
        "pdf_url": first_text(item, ("pdf_url",)),
    }
    metadata = {name: value for name, value in metadata.items() if value not in (None, "", [])}
    return SearchResult(
        href=url, body=body, title=plain_text(item.get("title")), retriever=retriever, rank=rank, metadata=metadata
    )


def parse_response(payload: Any, max_results: int, retriever: str = "searxng") -> Hits:
    items = payload.get("results") if isinstance(payload, dict) else None
    if not isinstance(items, list):
        raise RetrieverFailed("SearxNG answered JSON without a results list")
    hits = Hits()
    for item in items[:max_results]:
        if (result := _result(item, retriever, len(hits.results) + 1)) is not None:
            hits.results.append(result)
        else:
            hits.warnings.append("skipped a SearxNG result without url or content")
    for engine in payload.get("unresponsive_engines") or []:
        if isinstance(engine, list) and len(engine) == 2:
            hits.warnings.append(f"SearxNG engine {engine[0]} did not answer: {engine[1]}")
    return hits


def describe_error(status: int) -> str:
    if status == 403:
        return "SearxNG refused format=json (403): add json to search.formats in the instance's settings.yml"
    if status == 429:
        return "SearxNG's limiter refused the request (429): exempt this server in its limiter settings"
    return f"SearxNG answered HTTP {status}"


class Searxng:
    name = "searxng"
    label = "SearxNG"
    about = about

    def __init__(self, settings: SearxngSettings) -> None:
        self.settings = settings

    def missing_setup(self) -> str | None:
        return None if self.settings.searxng_url else _NOT_SET

    def build_request(self, options: SearchOptions) -> HttpRequest:
        if not self.settings.searxng_url:
            raise RetrieverSkipped(f"SearxNG is not configured: {_NOT_SET}")
        return build_request(options, self.settings.searxng_url)

    def parse_response(self, answer: Answer, options: SearchOptions) -> Hits:
        assert isinstance(answer, HttpAnswer)
        return parse_response(answer.payload, options.max_results, self.name)

    def describe_error(self, answer: HttpAnswer) -> str:
        return describe_error(answer.status)


def adapters(settings: SearxngSettings) -> list[Searxng]:
    return [Searxng(settings)]
