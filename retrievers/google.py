"""Google Programmable Search (Custom Search JSON API) through the shared aiohttp session."""

from __future__ import annotations

from typing import Any

from core.models import SearchResult
from core.settings import Settings, secret
from retrievers.base import About, Deps, Hits, RetrieverFailed, RetrieverSkipped, SearchOptions, fetch_json

about = About(
    website="https://developers.google.com/custom-search/v1/overview",
    kind="web",
    needs_key=True,
    needs_user=False,
    credentials=("google_api_key", "google_cx_key"),
)

PATH = "/customsearch/v1"
_PAGE = 10  # the API's largest `num`


def build_request(
    base_url: str, api_key: str, cx: str, options: SearchOptions, start: int = 1
) -> tuple[str, dict[str, str]]:
    query = options.query
    if options.query_domains:
        query += " (" + " OR ".join(f"site:{domain}" for domain in options.query_domains) + ")"
    num = max(1, min(_PAGE, options.max_results - start + 1))
    params = {"key": api_key, "cx": cx, "q": query, "num": str(num), "start": str(start)}
    return base_url.rstrip("/") + PATH, params


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


class GoogleRetriever:
    name = "google"
    about = about

    def configured(self, settings: Settings) -> bool:
        return bool(secret(settings.google_api_key) and secret(settings.google_cx_key))

    async def search(self, options: SearchOptions, deps: Deps) -> Hits:
        api_key = options.key("google_api_key", secret(deps.settings.google_api_key))
        cx = options.key("google_cx_key", secret(deps.settings.google_cx_key))
        if not api_key or not cx:
            missing = " and ".join(
                name for name, value in (("GOOGLE_API_KEY", api_key), ("GOOGLE_CX_KEY", cx)) if not value
            )
            raise RetrieverSkipped(f"Google is not configured: set {missing}")
        hits = Hits()
        start = 1
        while start <= options.max_results:
            page = await self._page(deps, api_key, cx, options, start)
            hits.results.extend(page.results)
            hits.warnings.extend(page.warnings)
            if len(page.results) + len(page.warnings) < _PAGE:
                break
            start += _PAGE
        return hits

    async def _page(self, deps: Deps, api_key: str, cx: str, options: SearchOptions, start: int) -> Hits:
        url, params = build_request(deps.settings.google_api_base_url, api_key, cx, options, start)
        payload = await fetch_json(
            deps.session,
            "GET",
            url,
            params=params,
            upstream="Google",
            limit=deps.settings.upstream_max_bytes,
            describe=describe_error,
        )
        return parse_response(payload, start_rank=start, retriever=self.name)

    async def aclose(self) -> None:
        return None


def retrievers(settings: Settings) -> list[GoogleRetriever]:
    return [GoogleRetriever()]
