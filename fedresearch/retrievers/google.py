"""Google Programmable Search (Custom Search JSON API): `GET /customsearch/v1?key&cx&q&num&start`.

Closed to new customers, and ending for existing ones on 2027-01-01: prefer Brave or SearxNG for
the web. Pages of 10 are followed up to max_results.
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
)


class GoogleSettings(UpstreamSettings):
    """Google Custom Search's: the API key and engine id (a request's own override them) and where the API is."""

    google_api_key: SecretStr | None = Field(None, validation_alias="GOOGLE_API_KEY")
    google_cx_key: SecretStr | None = Field(None, validation_alias="GOOGLE_CX_KEY")
    google_api_base_url: str = Field("https://www.googleapis.com", validation_alias="GOOGLE_API_BASE_URL")


about = About(
    website="https://developers.google.com/custom-search/v1/overview",
    kind="web",
    needs_key=True,
    needs_user=False,
    credentials=("google_api_key", "google_cx_key"),
    settings=GoogleSettings,
)

PATH = "/customsearch/v1"
_PAGE = 10  # the API's largest `num`


def with_sites(options: SearchOptions) -> str:
    """The query limited to `query_domains` with the `site:` operator web engines share."""
    if not options.query_domains:
        return options.query
    return options.query + " (" + " OR ".join(f"site:{domain}" for domain in options.query_domains) + ")"


def build_request(base_url: str, api_key: str, cx: str, options: SearchOptions, start: int = 1) -> HttpRequest:
    query = with_sites(options)
    num = max(1, min(_PAGE, options.max_results - start + 1))
    params = {"key": api_key, "cx": cx, "q": query, "num": str(num), "start": str(start)}
    return HttpRequest("GET", base_url.rstrip("/") + PATH, params=params)


def next_page(request: HttpRequest, page: Hits, options: SearchOptions) -> HttpRequest | None:
    """The request for the following page, when this one was full and more results are wanted."""
    assert request.params is not None
    start = int(request.params["start"]) + _PAGE
    if len(page.results) + len(page.warnings) < _PAGE or start > options.max_results:
        return None
    num = max(1, min(_PAGE, options.max_results - start + 1))
    return HttpRequest("GET", request.url, params={**request.params, "start": str(start), "num": str(num)})


def describe_error(status: int, payload: Any) -> str:
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict):
        return f"Google answered HTTP {status}"
    message = str(error.get("message") or "").strip()
    reason = str(error.get("status") or "").strip()
    label = f"{status} {reason}".strip()
    if status == 429 or (status == 403 and "quota" in message.lower()) or reason == "RESOURCE_EXHAUSTED":
        return f"Google quota exceeded ({label}): {message}"
    if status in (400, 403) and "key" in message.lower():
        return f"Google rejected the API key or cx ({label}): {message}"
    return f"Google answered {label}: {message}"


def parse_response(payload: Any, start_rank: int = 1, retriever: str = "google") -> Hits:
    if not isinstance(payload, dict):
        raise RetrieverFailed("Google answered JSON that is not an object")
    hits = Hits()
    items = payload.get("items") or []  # no `items` is how the API says "no hits"
    if not isinstance(items, list):
        raise RetrieverFailed("Google answered `items` that is not a list")
    for item in items:
        link = item.get("link") if isinstance(item, dict) else None
        snippet = item.get("snippet") if isinstance(item, dict) else None
        if not isinstance(link, str) or not link.strip():
            hits.warnings.append("skipped a Google item without link")
            continue
        body = " ".join(str(snippet or "").split())
        if not body:
            hits.warnings.append(f"skipped a Google item without snippet ({link})")
            continue
        hits.results.append(
            SearchResult(
                href=link.strip(),
                body=body,
                title=str(item.get("title") or "").strip(),
                retriever=retriever,
                rank=start_rank + len(hits.results),
                metadata={"type": "web", "display_link": item.get("displayLink")},
            )
        )
    return hits


class Google:
    name = "google"
    label = "Google"
    about = about

    def __init__(self, settings: GoogleSettings) -> None:
        self.settings = settings

    def missing_setup(self) -> str | None:
        missing = [name for name, value in _credentials(self.settings) if not value]
        return f"set {' and '.join(missing)}" if missing else None

    def build_request(self, options: SearchOptions) -> HttpRequest:
        api_key = options.credential("google_api_key") or secret(self.settings.google_api_key)
        cx = options.credential("google_cx_key") or secret(self.settings.google_cx_key)
        if not api_key or not cx:
            missing = " and ".join(
                name for name, value in (("GOOGLE_API_KEY", api_key), ("GOOGLE_CX_KEY", cx)) if not value
            )
            raise RetrieverSkipped(f"Google is not configured: set {missing}")
        return build_request(self.settings.google_api_base_url, api_key, cx, options)

    def parse_response(self, answer: Answer, options: SearchOptions) -> Hits:
        assert isinstance(answer, HttpAnswer)
        hits = parse_response(answer.payload, retriever=self.name)
        if (following := next_page(answer.request, hits, options)) is not None:
            hits.follow.append(following)
        return hits

    def describe_error(self, answer: HttpAnswer) -> str:
        return describe_error(answer.status, answer.payload)


def _credentials(settings: GoogleSettings) -> list[tuple[str, str | None]]:
    return [("GOOGLE_API_KEY", secret(settings.google_api_key)), ("GOOGLE_CX_KEY", secret(settings.google_cx_key))]


def adapters(settings: GoogleSettings) -> list[Google]:
    return [Google(settings)]
