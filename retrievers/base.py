"""What every adapter is: a declaration of its upstream plus one `search` coroutine.

As in SearxNG's engines, each adapter module keeps two pure steps (build the request, parse
the answer) apart from the I/O, so parsing is testable with a recorded answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import aiohttp

from core.models import SearchResult
from core.settings import Settings

if TYPE_CHECKING:
    from core.metrics import Metrics
    from library.store import Library
    from retrievers.resilience import Guard


@dataclass(frozen=True)
class About:
    website: str
    kind: Literal["library", "web", "knowledge"]
    needs_key: bool
    needs_user: bool
    results: str = "JSON"
    credentials: tuple[str, ...] = ()  # the per-request key headers this upstream spends


@dataclass
class Hits:
    results: list[SearchResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


class RetrieverFailed(Exception):
    """The upstream could not answer; the message is safe to show (no secrets, no URLs with keys).

    `status` is the upstream's HTTP status when it answered; `transient` marks failures worth
    retrying (5xx, connection errors, timeouts); `retry_after` is the upstream's Retry-After.
    """

    def __init__(
        self, message: str, *, status: int | None = None, transient: bool = False, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.transient = transient or (status is not None and status >= 500)
        self.retry_after = retry_after


async def fetch_json(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    upstream: str,
    limit: int,
    describe: Callable[[int, Any], str] | None = None,
    **request: Any,
) -> Any:
    """One JSON request to an upstream, every failure turned into a safe, classified RetrieverFailed.

    Redirects are never followed (a redirect to another host is how SSRF filters are bypassed), and
    no more than `limit` bytes of the answer are read. Exception texts are never shown: aiohttp puts
    the request URL, and so any key in its query, in them.
    """
    try:
        async with session.request(method, url, allow_redirects=False, **request) as response:
            status = response.status
            retry_after = retry_after_seconds(response.headers.get("Retry-After"))
            if 300 <= status < 400:
                raise RetrieverFailed(f"{upstream} answered a redirect (HTTP {status}), which is not followed")
            text = await read_body(response, limit, upstream)
    except TimeoutError as error:
        raise RetrieverFailed(f"{upstream} gave no answer in time", transient=True) from error
    except aiohttp.ClientError as error:
        raise RetrieverFailed(f"{upstream} unreachable: {type(error).__name__}", transient=True) from error
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as error:
        if status >= 400:
            raise RetrieverFailed(
                f"{upstream} answered HTTP {status}", status=status, retry_after=retry_after
            ) from None
        raise RetrieverFailed(f"{upstream} answered malformed JSON ({error.msg})") from error
    if status >= 400:
        message = describe(status, payload) if describe else f"{upstream} answered HTTP {status}: {str(payload)[:200]}"
        raise RetrieverFailed(message, status=status, retry_after=retry_after)
    return payload


def retry_after_seconds(value: str | None) -> float | None:
    """Retry-After as seconds (the delta form; an HTTP date is rare from APIs and ignored)."""
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


async def read_body(response: aiohttp.ClientResponse, limit: int, upstream: str) -> str:
    """The answer's text, refusing to read more than `limit` bytes of it."""
    body = await read_bytes(response, limit, upstream)
    return body.decode(response.get_encoding() if response.charset else "utf-8", errors="replace")


async def read_bytes(response: aiohttp.ClientResponse, limit: int, upstream: str) -> bytes:
    """The answer's bytes, refusing to read more than `limit` of them."""
    declared = response.content_length
    if declared is not None and declared > limit:
        raise RetrieverFailed(f"{upstream} answer is {declared} bytes, over UPSTREAM_MAX_BYTES ({limit})")
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(65536):
        size += len(chunk)
        if size > limit:
            raise RetrieverFailed(f"{upstream} answer exceeds UPSTREAM_MAX_BYTES ({limit} bytes)")
        chunks.append(chunk)
    return b"".join(chunks)


class RetrieverSkipped(Exception):
    """The retriever cannot run in this setup (e.g. no API key); the message says how to enable it."""


@dataclass(frozen=True)
class SearchOptions:
    """What one task asks of every adapter, already validated."""

    query: str
    max_results: int
    user_id: str | None = None
    internal_api_type: str = "biblio"
    internal_api_base_url: str | None = None
    query_domains: tuple[str, ...] = ()
    overrides: dict[str, str] = field(default_factory=dict, repr=False)

    def key(self, name: str, fallback: str | None) -> str | None:
        """A per-request upstream key if the client sent one, else the operator's."""
        return self.overrides.get(name) or fallback


@dataclass(frozen=True)
class Deps:
    """Everything an adapter may use, passed in explicitly."""

    session: aiohttp.ClientSession
    settings: Settings
    library: Library | None = None
    guard: Guard | None = None
    metrics: Metrics | None = None


class Retriever(Protocol):
    name: str
    about: About

    def configured(self, settings: Settings) -> bool:
        """Whether the operator gave it what it needs to run (keys, URLs)."""
        ...

    async def search(self, options: SearchOptions, deps: Deps) -> Hits: ...

    async def aclose(self) -> None: ...


def first_text(mapping: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    """The first of `keys` whose value is a non-blank string or a number, as text."""
    for key in keys:
        value = mapping.get(key)
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            return str(value)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def unit_score(value: object) -> float | None:
    """A source score if it is already a number in 0..1; anything else is not comparable."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if 0.0 <= number <= 1.0 else None
