"""Tavily web search through tavily-python's `AsyncTavilyClient`."""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from contextvars import ContextVar
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
from retrievers.base import (
    About,
    Deps,
    Hits,
    RetrieverFailed,
    RetrieverSkipped,
    SearchOptions,
    retry_after_seconds,
    unit_score,
)

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


_RETRY_AFTER: ContextVar[float | None] = ContextVar("tavily_retry_after", default=None)


class BodyTooLarge(httpx.HTTPError):
    """Tavily's answer went past UPSTREAM_MAX_BYTES; reading stopped there."""


class _LimitedStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    async def __aiter__(self):  # type: ignore[override]
        size = 0
        async for chunk in self._inner:
            size += len(chunk)
            if size > self._limit:
                raise BodyTooLarge(f"answer exceeds UPSTREAM_MAX_BYTES ({self._limit} bytes)")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _GuardedTransport(httpx.AsyncBaseTransport):
    """Bounds the body and keeps Retry-After, which tavily-python's exceptions do not carry."""

    def __init__(self, limit: int) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self._limit = limit

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        _RETRY_AFTER.set(retry_after_seconds(response.headers.get("Retry-After")))
        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_LimitedStream(response.stream, self._limit),
            extensions=response.extensions,
            request=request,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


def classify(error: Exception) -> RetrieverFailed:
    """A client-safe, classified failure for each way tavily-python (and httpx below it) fails."""
    detail = str(error).strip()
    suffix = f": {detail}" if detail else ""
    match error:
        case InvalidAPIKeyError():
            return RetrieverFailed(f"Tavily rejected the API key (401){suffix}", status=401)
        case UsageLimitExceededError():
            return RetrieverFailed(
                f"Tavily usage limit exceeded (429){suffix}", status=429, retry_after=_RETRY_AFTER.get()
            )
        case ForbiddenError():
            return RetrieverFailed(f"Tavily refused the request (403/432/433: plan or key limit){suffix}", status=432)
        case BadRequestError():
            return RetrieverFailed(f"Tavily rejected the request as malformed (400){suffix}", status=400)
        case TavilyTimeoutError() | httpx.TimeoutException():
            return RetrieverFailed("Tavily gave no answer in time", transient=True)
        case httpx.HTTPStatusError():
            status = error.response.status_code
            return RetrieverFailed(f"Tavily answered HTTP {status}", status=status, retry_after=_RETRY_AFTER.get())
        case BodyTooLarge():
            return RetrieverFailed(f"Tavily {detail}")
        case httpx.HTTPError():
            return RetrieverFailed(f"Tavily unreachable: {type(error).__name__}", transient=True)
        case json.JSONDecodeError():
            return RetrieverFailed(f"Tavily answered malformed JSON ({error.msg})")
    return RetrieverFailed(f"Tavily failed: {type(error).__name__}")


class TavilyRetriever:
    """Keeps one client per (key, base URL) so connections are reused across tasks."""

    name = "tavily"
    about = about

    def __init__(self) -> None:
        self._clients: OrderedDict[str, tuple[AsyncTavilyClient, httpx.AsyncClient]] = OrderedDict()

    async def _client(self, api_key: str, base_url: str, limit: int) -> AsyncTavilyClient:
        slot = hashlib.sha256(f"{base_url}\0{api_key}".encode()).hexdigest()
        pair = self._clients.pop(slot, None)
        if pair is None:
            http = httpx.AsyncClient(
                base_url=base_url, headers={"Authorization": f"Bearer {api_key}"}, transport=_GuardedTransport(limit)
            )
            # An explicit key always: tavily-python falls into keyless mode when given None.
            pair = (AsyncTavilyClient(api_key=api_key, api_base_url=base_url, client=http), http)
        self._clients[slot] = pair
        while len(self._clients) > _MAX_CLIENTS:
            _, (_, oldest) = self._clients.popitem(last=False)
            await oldest.aclose()
        return pair[0]

    def configured(self, settings: Settings) -> bool:
        return bool(secret(settings.tavily_api_key))

    async def search(self, options: SearchOptions, deps: Deps) -> Hits:
        api_key = options.key("tavily_api_key", secret(deps.settings.tavily_api_key))
        if not api_key:
            raise RetrieverSkipped("no Tavily API key: set TAVILY_API_KEY (or send headers.tavily_api_key)")
        client = await self._client(api_key, deps.settings.tavily_api_base_url, deps.settings.upstream_max_bytes)
        _RETRY_AFTER.set(None)
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
            raise classify(error) from error
        return parse_response(payload, self.name)

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), OrderedDict()
        for _, http in clients:
            await http.aclose()


def retrievers(settings: Settings) -> list[TavilyRetriever]:
    return [TavilyRetriever()]
