"""Tavily web search: `POST {TAVILY_API_BASE_URL}/search` with the key as a Bearer token.

The request and the error mapping are those of Tavily's own client (tavily-python 0.8: 400 bad
request, 401 bad key, 429 usage limit, 403/432/433 plan or key limits, `detail.error` the reason);
the call itself goes through the runner, like every adapter's.
"""

from __future__ import annotations

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
    unit_score,
)


class TavilySettings(UpstreamSettings):
    """Tavily's: the API key (a request's own overrides it) and where the API is."""

    tavily_api_key: SecretStr | None = Field(None, validation_alias="TAVILY_API_KEY")
    tavily_api_base_url: str = Field("https://api.tavily.com", validation_alias="TAVILY_API_BASE_URL")


about = About(
    website="https://tavily.com",
    kind="web",
    needs_key=True,
    needs_user=False,
    credentials=("tavily_api_key",),
    settings=TavilySettings,
)

_MAX_RESULTS = 20  # the API's largest max_results
_REASONS = {
    400: "rejected the request as malformed (400)",
    401: "rejected the API key (401)",
    429: "usage limit exceeded (429)",
    403: "refused the request (403/432/433: plan or key limit)",
    432: "refused the request (403/432/433: plan or key limit)",
    433: "refused the request (403/432/433: plan or key limit)",
}


def build_request(options: SearchOptions, api_key: str, base_url: str) -> HttpRequest:
    body: dict[str, Any] = {
        "query": options.query,
        "max_results": min(options.max_results, _MAX_RESULTS),
        "search_depth": "basic",
    }
    if options.query_domains:
        body["include_domains"] = list(options.query_domains)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"}
    return HttpRequest("POST", base_url.rstrip("/") + "/search", json=body, headers=headers)


def parse_response(payload: Any, retriever: str = "tavily") -> Hits:
    if not isinstance(payload, dict) or not isinstance(payload.get("results", []), list):
        raise RetrieverFailed("Tavily answered JSON without a results list")
    hits = Hits()
    for item in payload.get("results", []):
        url = item.get("url") if isinstance(item, dict) else None
        content = item.get("content") if isinstance(item, dict) else None
        if not isinstance(url, str) or not url.strip() or not isinstance(content, str) or not content.strip():
            hits.warnings.append("skipped a Tavily result without url or content")
            continue
        hits.results.append(
            SearchResult(
                href=url.strip(),
                body=content.strip(),
                title=str(item.get("title") or "").strip(),
                score=unit_score(item.get("score")),
                retriever=retriever,
                rank=len(hits.results) + 1,
                metadata={"type": "web"},
            )
        )
    return hits


def describe_error(status: int, payload: Any) -> str:
    detail = payload.get("detail") if isinstance(payload, dict) else None
    reason = str(detail.get("error") or "").strip() if isinstance(detail, dict) else ""
    if status in _REASONS:
        return f"Tavily {_REASONS[status]}" + (f": {reason}" if reason else "")
    return f"Tavily answered HTTP {status}"


class Tavily:
    name = "tavily"
    label = "Tavily"
    about = about

    def __init__(self, settings: TavilySettings) -> None:
        self.settings = settings

    def missing_setup(self) -> str | None:
        return None if secret(self.settings.tavily_api_key) else "set TAVILY_API_KEY"

    def build_request(self, options: SearchOptions) -> HttpRequest:
        api_key = options.credential("tavily_api_key") or secret(self.settings.tavily_api_key)
        if not api_key:
            raise RetrieverSkipped("no Tavily API key: set TAVILY_API_KEY (or send headers.tavily_api_key)")
        return build_request(options, api_key, self.settings.tavily_api_base_url)

    def parse_response(self, answer: Answer, options: SearchOptions) -> Hits:
        assert isinstance(answer, HttpAnswer)
        return parse_response(answer.payload, self.name)

    def describe_error(self, answer: HttpAnswer) -> str:
        return describe_error(answer.status, answer.payload)


def adapters(settings: TavilySettings) -> list[Tavily]:
    return [Tavily(settings)]
