"""`/mcp`: the MCP tools over streamable HTTP, an ordinary aiohttp route handing each request to
the SDK's session manager as ASGI (the tools and the manager: web/mcp_server.py).

The SDK is loaded by the first request, not at start: it is about 26 MB in each worker of `serve
--workers N`, and most servers are never asked. Its import runs on a thread, so the event loop goes
on serving meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, MutableMapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from aiohttp import web

from fedresearch.web.auth import principal_of

if TYPE_CHECKING:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

Starter = Callable[[web.Application], AbstractAsyncContextManager["StreamableHTTPSessionManager"]]


class McpEndpoint:
    """The SDK's session manager behind `/mcp`, started by the first request, stopped with the app."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self._lock = asyncio.Lock()
        self._running = contextlib.AsyncExitStack()
        self._manager: StreamableHTTPSessionManager | None = None
        self._closed = False

    async def manager(self) -> StreamableHTTPSessionManager:
        async with self._lock:
            if self._closed:
                raise web.HTTPServiceUnavailable(text="the server is shutting down")
            if self._manager is None:
                start = await asyncio.to_thread(_load_sdk)
                self._manager = await self._running.enter_async_context(start(self.app))
            return self._manager

    async def close(self) -> None:
        async with self._lock:
            self._closed = True
            await self._running.aclose()


def _load_sdk() -> Starter:
    from fedresearch.web.mcp_server import session_manager

    return session_manager


MCP_ENDPOINT = web.AppKey("mcp_endpoint", McpEndpoint)


async def mcp_http(request: web.Request) -> web.StreamResponse:
    """Streamable HTTP: this request handed to the SDK's session manager as ASGI."""
    principal_of(request)  # refused here with 401 like every other route when the key is wrong
    response = web.StreamResponse()
    body_done = asyncio.Event()
    finished = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if body_done.is_set():
            await finished.wait()
            return {"type": "http.disconnect"}
        chunk, end = await request.content.readchunk()
        more = not end and not request.content.at_eof()
        if not more:
            body_done.set()
        return {"type": "http.request", "body": chunk, "more_body": more}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            response.set_status(message["status"])
            for name, value in message.get("headers", []):
                response.headers.add(name.decode("latin-1"), value.decode("latin-1"))
            await response.prepare(request)
        elif message["type"] == "http.response.body":
            await response.write(message.get("body", b""))
            if not message.get("more_body", False):
                await response.write_eof()

    try:
        manager = await request.app[MCP_ENDPOINT].manager()
        await manager.handle_request(asgi_scope(request), receive, send)
    finally:
        finished.set()
    return response


def asgi_scope(request: web.Request) -> dict[str, Any]:
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    host, port = tuple(sockname[:2]) if sockname else ("127.0.0.1", 0)
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": f"{request.version.major}.{request.version.minor}",
        "method": request.method,
        "scheme": request.scheme,
        "path": request.path,
        "raw_path": request.raw_path.encode(),
        "query_string": request.query_string.encode(),
        "root_path": "",
        "headers": [(name.lower(), value) for name, value in request.raw_headers],
        "client": (request.remote or "", 0),
        "server": (host, port),
    }
