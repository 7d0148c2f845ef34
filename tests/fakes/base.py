"""What every fake upstream shares: a real aiohttp server on 127.0.0.1, scripted by its `Behaviour`."""

from __future__ import annotations

import asyncio
import json
import time
import zlib
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from aiohttp import web


@dataclass
class Behaviour:
    """What the fake does next: `mode` is ok, an HTTP status as text ("401", "429" ...), or malformed."""

    mode: str = "ok"
    delay_s: float = 0.0
    items: list[dict[str, Any]] = field(default_factory=list)
    retry_after: str | None = None  # sent with 429 answers
    fail_times: int | None = None  # fail this many times, then answer normally
    redirect_to: str | None = None
    echo_credentials: bool = False  # a 401 quotes the Authorization it refused, as one upstream did
    set_cookie: str | None = None  # a Set-Cookie on every answer, as APIs behind a CDN send (`__cf_bm=...`)
    # queries holding one of these are answered 500, as upstreams answer some inputs every time
    failing_queries: tuple[str, ...] = ()
    # results link to pages under these URLs, a set per query, each page on one of them (benchmarks)
    link_bases: tuple[str, ...] = ()
    # while set, answers wait (after delay_s) until the test sets it: a task held as long as a test needs
    held: asyncio.Event | None = None

    def link(self, query: str, engine: str, number: int) -> str | None:
        """A result's URL under one of `link_bases` (chosen by the path), or None without them."""
        if not self.link_bases:
            return None
        path = f"/{quote(query, safe='')}/{engine}/{number}"
        return self.link_bases[zlib.crc32(path.encode()) % len(self.link_bases)] + path


class FakeUpstream:
    def __init__(self) -> None:
        self.behaviour = Behaviour()
        self.requests: list[dict[str, Any]] = []
        self.cancelled = 0
        self.runner: web.AppRunner | None = None
        self.url = ""

    def app(self) -> web.Application:
        raise NotImplementedError

    async def start(self, port: int = 0, reuse_port: bool = False) -> FakeUpstream:
        """Listen on `port` (0: any free one); with `reuse_port`, several processes share it (benchmarks)."""
        # handler_cancellation lets the fake see a client give up on its request
        self.runner = web.AppRunner(self.app(), handler_cancellation=True)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", port, reuse_port=reuse_port or None)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def asked(self, within_s: float = 60.0) -> None:
        """Once the fake has had a request; a test whose request never comes fails here, not hangs."""
        async with asyncio.timeout(within_s):
            while not self.requests:
                await asyncio.sleep(0.05)

    async def _wait(self) -> None:
        try:
            await asyncio.sleep(self.behaviour.delay_s)
            if self.behaviour.held is not None:
                await self.behaviour.held.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    def _mode(self) -> str:
        behaviour = self.behaviour
        if behaviour.fail_times is not None:
            if behaviour.fail_times <= 0:
                return "ok"
            behaviour.fail_times -= 1
        return behaviour.mode

    def _headers(self) -> dict[str, str]:
        return {"Retry-After": self.behaviour.retry_after} if self.behaviour.retry_after else {}

    async def _transport_fault(self, request: web.Request, mode: str) -> web.StreamResponse | None:
        """Faults below the upstream's own error format: dropped connections, huge and slow bodies."""
        if mode == "reset":
            assert request.transport is not None
            request.transport.close()  # the client sees the connection drop before any answer
            return web.Response()
        if mode == "oversized":
            filler = "x" * 1_000_000
            return web.json_response({"results": [{"url": "https://big.example", "content": filler}] * 3, "items": []})
        if mode == "drip":
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
            await response.write(b'{"results": [')
            for _ in range(100):
                await asyncio.sleep(0.1)
                await response.write(b" ")
            return response
        return None


def dumps(frame: dict[str, Any]) -> str:
    return json.dumps(frame)


class ScholarlyFake(FakeUpstream):
    """Shared by every fake here: request log with arrival times, in-flight count, common faults."""

    path = "/"

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0
        self.most_in_flight = 0
        self.extra_headers: dict[str, str] = {}

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get(self.path, self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append({"query": dict(request.query), "headers": dict(request.headers), "at": time.monotonic()})
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self._wait()
            mode = self._mode()
            if mode == "429":
                return self.too_many()
            if mode == "500":
                return web.Response(status=500, text="<html><body>Internal Server Error</body></html>")
            response = await self.answer(request, mode)
            response.headers.update(self.extra_headers)
            return response
        finally:
            self.in_flight -= 1

    def too_many(self) -> web.Response:
        return web.Response(status=429, text="Too Many Requests", headers=self._headers())

    async def answer(self, request: web.Request, mode: str) -> web.Response:
        raise NotImplementedError

    def per_second(self) -> int:
        """The most requests that arrived within any one second."""
        times = sorted(entry["at"] for entry in self.requests)
        return max((sum(1 for t in times if start <= t < start + 1.0) for start in times), default=0)
