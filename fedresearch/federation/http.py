"""The one way an upstream is called over HTTP: the app's shared aiohttp session, no redirects,
a bounded body, and every failure turned into a safe, classified RetrieverFailed."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

import aiohttp

from fedresearch.federation.contract import HttpAnswer, HttpRequest, RetrieverFailed

# The deadline is the runner's (asyncio.timeout around the whole exchange); only connecting gets its own.
_NO_TOTAL = aiohttp.ClientTimeout(total=None, connect=5.0)
LARGE_ANSWER_CHARS = 100_000  # past this, an answer is decoded and parsed in a thread


async def send(
    session: aiohttp.ClientSession,
    request: HttpRequest,
    *,
    label: str,
    limit: int,
    results: Literal["JSON", "XML", "text"] = "JSON",
) -> HttpAnswer:
    """Send `request`; the answer decoded as `results` says.

    Redirects are never followed (a redirect to another host is how SSRF filters are bypassed), and
    no more than `limit` bytes of the answer are read. Exception texts are never shown: aiohttp puts
    the request URL, and so any key in its query, in them.
    """
    try:
        async with session.request(
            request.method,
            request.url,
            params=request.params,
            json=request.json,
            headers=request.headers,
            allow_redirects=False,
            timeout=_NO_TOTAL,
        ) as response:
            status = response.status
            if 300 <= status < 400:
                raise RetrieverFailed(f"{label} answered a redirect (HTTP {status}), which is not followed")
            text = await read_text(response, limit, label)
            headers = dict(response.headers)
    except TimeoutError as error:
        raise RetrieverFailed(f"{label} gave no answer in time", transient=True) from error
    except aiohttp.ClientError as error:
        raise RetrieverFailed(f"{label} unreachable: {type(error).__name__}", transient=True) from error
    if len(text) > LARGE_ANSWER_CHARS:  # 5 MB of JSON takes the loop for a second or more
        payload = await asyncio.to_thread(_decode, text, status, label, results)
        return HttpAnswer(request, status, headers, payload, large=True)
    return HttpAnswer(request, status, headers, _decode(text, status, label, results))


def _decode(text: str, status: int, label: str, results: str) -> Any:
    if results != "JSON":
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        if status >= 400:
            return None  # an HTML error page: the status says enough
        raise RetrieverFailed(f"{label} answered malformed JSON ({error.msg})") from error


def retry_after_seconds(value: str | None) -> float | None:
    """Retry-After as seconds (the delta form; an HTTP date is rare from APIs and ignored)."""
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


async def read_text(response: aiohttp.ClientResponse, limit: int, label: str) -> str:
    """The answer's text, refusing to read more than `limit` bytes of it."""
    body = await read_bytes(response, limit, label)
    return body.decode(response.get_encoding() if response.charset else "utf-8", errors="replace")


class BodyTooLarge(Exception):
    """An answer over its byte limit; `declared` is its Content-Length when that already said so."""

    def __init__(self, limit: int, declared: int | None) -> None:
        super().__init__(limit, declared)
        self.limit = limit
        self.declared = declared


async def read_capped(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The answer's bytes; BodyTooLarge rather than more than `limit` of them in memory."""
    declared = response.content_length
    if declared is not None and declared > limit:
        raise BodyTooLarge(limit, declared)
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(65536):
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit, None)
        chunks.append(chunk)
    return b"".join(chunks)


async def read_bytes(response: aiohttp.ClientResponse, limit: int, label: str) -> bytes:
    """An upstream's answer bytes, refusing to read more than UPSTREAM_MAX_BYTES of them."""
    try:
        return await read_capped(response, limit)
    except BodyTooLarge as large:
        if large.declared is not None:
            raise RetrieverFailed(
                f"{label} answer is {large.declared} bytes, over UPSTREAM_MAX_BYTES ({limit})"
            ) from None
        raise RetrieverFailed(f"{label} answer exceeds UPSTREAM_MAX_BYTES ({limit} bytes)") from None
