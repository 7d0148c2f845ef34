"""Tavily web search through tavily-python's `AsyncTavilyClient`."""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from typing import Any

import httpx
from tavily import AsyncTavilyClient
from tavily.errors import (
    BadRequestError,
    ForbiddenError,
    InvalidAPIKeyError,
    UsageLimitExceededError,
)
from tavily.errors import TimeoutError as TavilyTimeoutError

from core.models import SearchResult
from core.settings import Settings, secret
from retrievers.base import About, Deps, Hits, RetrieverFailed, RetrieverSkipped, SearchOptions, unit_score

about = About(website="https://tavily.com", kind="web", needs_key=True, needs_user=False)

_MAX_CLIENTS = 16


def build_request(options: SearchOptions) -> dict[str, Any]:
    request: dict[str, Any] = {
        "query": options.query,
        "max_results": min(options.max_results, 20),
        "search_depth": "basic",
    }
    if options.query_domains:
        request["include_domains"] = list(options.query_domains)
    return request


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


def describe_error(error: Exception) -> str:
    """A client-safe reason for each way tavily-python (and the httpx below it) fails."""
    detail = str(error).strip()
    suffix = f": {detail}" if detail else ""
    match error:
        case InvalidAPIKeyError():
            return f"Tavily rejected the API key (401){suffix}"
        case UsageLimitExceededError():
            return f"Tavily usage limit exceeded (429){suffix}"
        case ForbiddenError():
            return f"Tavily refused the request (403/432/433: plan or key limit){suffix}"
        case BadRequestError():
            return f"Tavily rejected the request as malformed (400){suffix}"
        case TavilyTimeoutError():
            return "Tavily gave no answer in time"
        case httpx.HTTPStatusError():
            return f"Tavily answered HTTP {error.response.status_code}"
        case httpx.TimeoutException():
            return "Tavily gave no answer in time"
        case httpx.HTTPError():
            return f"Tavily unreachable: {type(error).__name__}"
        case json.JSONDecodeError():
            return f"Tavily answered malformed JSON ({error.msg})"
    return f"Tavily failed: {type(error).__name__}"


class TavilyRetriever:
    """Keeps one client per (key, base URL) so connections are reused across tasks."""

    name = "tavily"
    about = about

    def __init__(self) -> None:
        self._clients: OrderedDict[str, AsyncTavilyClient] = OrderedDict()

    async def _client(self, api_key: str, base_url: str) -> AsyncTavilyClient:
        slot = hashlib.sha256(f"{base_url}\0{api_key}".encode()).hexdigest()
        client = self._clients.pop(slot, None)
        if client is None:
            # An explicit key always: tavily-python falls into keyless mode when given None.
            client = AsyncTavilyClient(api_key=api_key, api_base_url=base_url)
        self._clients[slot] = client
        while len(self._clients) > _MAX_CLIENTS:
            _, oldest = self._clients.popitem(last=False)
            await oldest.close()
        return client

    def configured(self, settings: Settings) -> bool:
        return bool(secret(settings.tavily_api_key))

    async def search(self, options: SearchOptions, deps: Deps) -> Hits:
        api_key = options.key("tavily_api_key", secret(deps.settings.tavily_api_key))
        if not api_key:
            raise RetrieverSkipped("no Tavily API key: set TAVILY_API_KEY (or send headers.tavily_api_key)")
        client = await self._client(api_key, deps.settings.tavily_api_base_url)
        try:
            payload = await client.search(**build_request(options), timeout=deps.settings.retriever_timeout_s)
        except (
            InvalidAPIKeyError,
            UsageLimitExceededError,
            ForbiddenError,
            BadRequestError,
            TavilyTimeoutError,
            httpx.HTTPError,
            json.JSONDecodeError,
        ) as error:
            raise RetrieverFailed(describe_error(error)) from error
        return parse_response(payload, self.name)

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), OrderedDict()
        for client in clients:
            await client.close()


def retrievers(settings: Settings) -> list[TavilyRetriever]:
    return [TavilyRetriever()]
