"""Tavily web search through tavily-python's `AsyncTavilyClient`."""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from contextvars import ContextVar
from typing import Any

import aiohttp
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
    read_bytes,
    retry_after_seconds,
    unit_score,
)

about = About(
    website="https://tavily.com", kind="web", needs_key=True, needs_user=False, credentials=("tavily_api_key",)
)

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


# Content-Encoding and Content-Length describe the wire, which aiohttp has already decoded
_NOT_PASSED_ON = {"content-encoding", "content-length", "transfer-encoding", "connection"}


class AiohttpTransport(httpx.AsyncBaseTransport):
    """tavily-python speaks httpx; its requests travel through the app's shared aiohttp session.

    Measured under load (bench/load.py), httpx's own pool spent half the server's CPU on
    connection bookkeeping. This transport also bounds the answer to UPSTREAM_MAX_BYTES, never
    follows redirects, and keeps Retry-After, which tavily-python's exceptions do not carry.
    """

    def __init__(self, session: aiohttp.ClientSession, limit: int) -> None:
        self._session = session
        self._limit = limit

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        deadlines = [value for value in (request.extensions.get("timeout") or {}).values() if value]
        timeout = aiohttp.ClientTimeout(total=max(deadlines) if deadlines else None)
        headers = {
            name: value for name, value in request.headers.items() if name.lower() not in ("host", "content-length")
        }
        try:
            async with self._session.request(
                request.method,
                str(request.url),
                headers=headers,
                data=await request.aread(),
                allow_redirects=False,
                timeout=timeout,
            ) as response:
                _RETRY_AFTER.set(retry_after_seconds(response.headers.get("Retry-After")))
                body = await read_bytes(response, self._limit, "Tavily")
                passed_on = [(k, v) for k, v in response.headers.items() if k.lower() not in _NOT_PASSED_ON]
                return httpx.Response(response.status, headers=passed_on, content=body, request=request)
        except TimeoutError as error:
            raise httpx.ReadTimeout("no answer in time", request=request) from error
        except aiohttp.ClientError as error:
            raise httpx.ConnectError(type(error).__name__, request=request) from error


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

    async def _client(self, api_key: str, deps: Deps) -> AsyncTavilyClient:
        base_url = deps.settings.tavily_api_base_url
        slot = hashlib.sha256(f"{base_url}\0{api_key}".encode()).hexdigest()
        pair = self._clients.pop(slot, None)
        if pair is None:
            transport = AiohttpTransport(deps.session, deps.settings.upstream_max_bytes)
            http = httpx.AsyncClient(
                base_url=base_url, headers={"Authorization": f"Bearer {api_key}"}, transport=transport
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
        client = await self._client(api_key, deps)
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
