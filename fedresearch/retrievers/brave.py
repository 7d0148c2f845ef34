"""Brave Search API: `GET {BRAVE_API_BASE_URL}/res/v1/web/search?q=...&count=N` with the key in
`X-Subscription-Token`. The free plan allows 1 request/s (`BRAVE_REQUESTS_PER_S` raises it for paid
plans); errors come as `{"type": "ErrorResponse", "error": {"code", "detail", "status"}}`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pydantic import Field, SecretStr

from fedresearch.core.models import SearchResult
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
from fedresearch.retrievers.google import with_sites
from fedresearch.retrievers.scholarly import plain_text


class BraveSettings(UpstreamSettings):
    """Brave's: the API key (a request's own overrides it), where the API is, and the plan's rate."""

    brave_api_key: SecretStr | None = Field(None, validation_alias="BRAVE_API_KEY")
    brave_api_base_url: str = Field("https://api.search.brave.com", validation_alias="BRAVE_API_BASE_URL")
    brave_requests_per_s: float = Field(1.0, gt=0, validation_alias="BRAVE_REQUESTS_PER_S")


about = About(  # the free plan's rate; BRAVE_REQUESTS_PER_S replaces it
    website="https://brave.com/search/api/",
    kind="web",
    needs_key=True,
    needs_user=False,
    credentials=("brave_api_key",),
    rate=Rate(1),
    settings=BraveSettings,
)

PATH = "/res/v1/web/search"
_COUNT = 20  # the API's largest count


def build_request(options: SearchOptions, base_url: str, api_key: str) -> HttpRequest:
    params = {"q": with_sites(options), "count": str(min(options.max_results, _COUNT))}
    headers = {"Accept": "application/json", "X-Subscription-Token": api_key}
    return HttpRequest("GET", base_url.rstrip("/") + PATH, params=params, headers=headers)


def _result(item: Any, retriever: str, rank: int) -> SearchResult | None:
    if not isinstance(item, dict):
        return None
    url = first_text(item, ("url",))
    snippets = [item.get("description"), *(item.get("extra_snippets") or [])]
    body = " ".join(text for text in (plain_text(snippet) for snippet in snippets) if text)
    if url is None or not body:
        return None
    metadata = {"type": "web", "page_age": item.get("page_age"), "age": item.get("age")}
    metadata = {name: value for name, value in metadata.items() if value}
    return SearchResult(
        href=url, body=body, title=plain_text(item.get("title")), retriever=retriever, rank=rank, metadata=metadata
    )


def parse_response(payload: Any, retriever: str = "brave") -> Hits:
    if not isinstance(payload, dict):
        raise RetrieverFailed("Brave answered JSON that is not an object")
    web = payload.get("web", {"results": []})  # no web hits: no `web` section at all
    items = web.get("results") if isinstance(web, dict) else None
    if not isinstance(items, list):
        raise RetrieverFailed("Brave answered `web` without a results list")
    hits = Hits()
    for item in items:
        if (result := _result(item, retriever, len(hits.results) + 1)) is not None:
            hits.results.append(result)
        else:
            hits.warnings.append("skipped a Brave result without url or description")
    return hits


def describe_error(status: int, payload: Any) -> str:
    error = payload.get("error") if isinstance(payload, dict) else None
    code = first_text(error, ("code",)) if isinstance(error, dict) else None
    detail = first_text(error, ("detail",)) if isinstance(error, dict) else None
    if status == 429 or code == "RATE_LIMITED":
        what = "rate limit or monthly quota exceeded"
    elif code == "SUBSCRIPTION_TOKEN_INVALID" or status == 401:
        what = "rejected the API key"
    else:
        what = "answered"
    return f"Brave {what} ({' '.join(str(p) for p in (status, code) if p)})" + (f": {detail}" if detail else "")


class Brave:
    name = "brave"
    label = "Brave"

    def __init__(self, settings: BraveSettings) -> None:
        self.settings = settings
        self.about = replace(about, rate=Rate(settings.brave_requests_per_s))

    def missing_setup(self) -> str | None:
        return None if secret(self.settings.brave_api_key) else "set BRAVE_API_KEY"

    def build_request(self, options: SearchOptions) -> HttpRequest:
        api_key = options.credential("brave_api_key") or secret(self.settings.brave_api_key)
        if not api_key:
            raise RetrieverSkipped("no Brave API key: set BRAVE_API_KEY (or send headers.brave_api_key)")
        return build_request(options, self.settings.brave_api_base_url, api_key)

    def parse_response(self, answer: Answer, options: SearchOptions) -> Hits:
        assert isinstance(answer, HttpAnswer)
        return parse_response(answer.payload, self.name)

    def describe_error(self, answer: HttpAnswer) -> str:
        return describe_error(answer.status, answer.payload)


def adapters(settings: BraveSettings) -> list[Brave]:
    return [Brave(settings)]
