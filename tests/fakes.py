"""Fake upstreams: real HTTP servers on 127.0.0.1 that answer as Tavily, Google Custom Search and
the internal literature API do, including their errors, delays and malformed answers."""

from __future__ import annotations

import asyncio
import json
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
    # results link to pages under these URLs, a set per query, each page on one of them (benchmarks)
    link_bases: tuple[str, ...] = ()

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

    async def _wait(self) -> None:
        try:
            await asyncio.sleep(self.behaviour.delay_s)
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


class FakeTavily(FakeUpstream):
    """POST /search with `Authorization: Bearer KEY`, answers as api.tavily.com does."""

    api_key = "tvly-test-key"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/search", self.search)
        return app

    async def search(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append({"body": body, "headers": dict(request.headers)})
        await self._wait()
        mode = self._mode()
        if (fault := await self._transport_fault(request, mode)) is not None:
            return fault
        # real Tavily takes the key as a Bearer token, or (older clients) as api_key in the body
        keyed = request.headers.get("Authorization") == f"Bearer {self.api_key}" or body.get("api_key") == self.api_key
        if not keyed or mode == "401":
            refused = f" ({request.headers.get('Authorization')})" if self.behaviour.echo_credentials else ""
            return web.json_response(
                {"detail": {"error": f"Unauthorized: missing or invalid API key.{refused}"}}, status=401
            )
        if mode == "429":
            return web.json_response(
                {"detail": {"error": "Your request has been blocked due to excessive requests."}},
                status=429,
                headers=self._headers(),
            )
        if len(str(body.get("query", ""))) > 400:
            return web.json_response(
                {"detail": {"error": "Query is too long. Max query length is 400 characters."}}, status=400
            )
        if mode == "432":
            return web.json_response(
                {"detail": {"error": "This request exceeds your plan's set usage limit. Please upgrade your plan."}},
                status=432,
            )
        if mode == "500":
            return web.Response(status=500, text="Internal Server Error")
        if mode == "malformed":
            return web.Response(status=200, text='{"results": [', content_type="application/json")
        results = self.behaviour.items or [
            {
                "url": self.behaviour.link(body["query"], "tavily", i) or f"https://example.org/tavily/{i}",
                "title": f"Tavily result {i} on {body['query']}",
                "content": f"Tavily passage {i} says rank fusion combines lexical and dense retrieval well.",
                "score": round(0.9 - i * 0.1, 2),
                "raw_content": None,
            }
            for i in range(1, 4)
        ]
        return web.json_response(
            {
                "query": body["query"],
                "follow_up_questions": None,
                "answer": None,
                "images": [],
                "results": results[: body.get("max_results", 5)],
                "response_time": 0.42,
                "request_id": "fake-1",
            },
            headers={"Set-Cookie": self.behaviour.set_cookie} if self.behaviour.set_cookie else None,
        )


class FakeGoogle(FakeUpstream):
    """GET /customsearch/v1?key&cx&q&num&start, answers as www.googleapis.com does."""

    api_key = "AIza-test-key"
    cx = "test-cx"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/customsearch/v1", self.search)
        return app

    def _with_retry_after(self, response: web.Response) -> web.Response:
        response.headers.update(self._headers())
        return response

    @staticmethod
    def _error(code: int, message: str, status: str, reason: str) -> web.Response:
        return web.json_response(
            {
                "error": {
                    "code": code,
                    "message": message,
                    "errors": [{"message": message, "domain": "global", "reason": reason}],
                    "status": status,
                }
            },
            status=code,
        )

    async def search(self, request: web.Request) -> web.StreamResponse:
        self.requests.append({"query": dict(request.query)})
        await self._wait()
        mode = self._mode()
        if (fault := await self._transport_fault(request, mode)) is not None:
            return fault
        if request.query.get("key") != self.api_key or mode == "400":
            return self._error(400, "API key not valid. Please pass a valid API key.", "INVALID_ARGUMENT", "badRequest")
        if mode == "429":
            return self._with_retry_after(
                self._error(
                    429,
                    "Quota exceeded for quota metric 'Queries' and limit 'Queries per day' of service "
                    "'customsearch.googleapis.com' for consumer 'project_number:1234'.",
                    "RESOURCE_EXHAUSTED",
                    "rateLimitExceeded",
                )
            )
        if mode == "403":
            return self._error(
                403,
                "This project does not have the access to Custom Search JSON API.",
                "PERMISSION_DENIED",
                "forbidden",
            )
        if mode == "500":
            return web.Response(status=500, text="<html>Server Error</html>", content_type="text/html")
        if mode == "malformed":
            return web.Response(status=200, text="{'items': nope", content_type="application/json")
        if mode == "empty":
            return web.json_response({"kind": "customsearch#search", "searchInformation": {"totalResults": "0"}})
        items = self.behaviour.items or [
            {
                "kind": "customsearch#result",
                "title": f"Google result {i}",
                "htmlTitle": f"Google result {i}",
                "link": self.behaviour.link(request.query.get("q", ""), "google", i)
                or f"https://www.example.com/google/{i}/?utm_source=x",
                "displayLink": "www.example.com",
                "snippet": f"Google snippet {i}: hybrid search with reciprocal rank fusion.",
                "formattedUrl": "...",
            }
            for i in range(1, 4)
        ]
        return web.json_response(
            {
                "kind": "customsearch#search",
                "queries": {"request": [{"searchTerms": request.query.get("q")}]},
                "searchInformation": {"totalResults": str(len(items))},
                "items": items,
            }
        )


class FakeLiteratureApi(FakeUpstream):
    """POST /internal/biblios/vector_search/ as a user's literature API answers it."""

    api_key = "internal-test-key"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/internal/biblios/vector_search/", self.search)
        return app

    async def search(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append({"body": body, "headers": dict(request.headers)})
        await self._wait()
        mode = self.behaviour.mode
        if self.behaviour.redirect_to:
            raise web.HTTPTemporaryRedirect(location=self.behaviour.redirect_to)
        if mode == "500":
            return web.Response(status=500, text="upstream exploded")
        if mode == "malformed":
            return web.Response(status=200, text="[{", content_type="application/json")
        if mode == "wrapped":
            return web.json_response({"data": self.behaviour.items})
        items = self.behaviour.items or [
            {
                "content": f"Internal passage on {body['query']}: our lab notes on rank fusion.",
                "score": 0.8,
                "metadata": {
                    "biblio_id": "b-1",
                    "structured_data": {
                        "title": "Lab paper",
                        "year": 2021,
                        "authors": [{"name": "Ada Lovelace"}],
                        "doi": "10.1000/lab.1",
                    },
                },
            },
        ]
        return web.json_response(items)


async def start_all() -> dict[str, FakeUpstream]:
    return {
        "tavily": await FakeTavily().start(),
        "google": await FakeGoogle().start(),
        "internal": await FakeLiteratureApi().start(),
    }


def dumps(frame: dict[str, Any]) -> str:
    return json.dumps(frame)


class FakeDifyKnowledge(FakeUpstream):
    """A Dify-compatible knowledge endpoint that answers as adbpg-endpoint does: sigmoid scores,
    `{"status": "ok"}` on an empty body, and 400 with an error_code for a bad key or knowledge id."""

    api_key = "adbpg-test-key"
    knowledge_id = "kb-1"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/dify/retrieval", self.retrieval)
        return app

    async def retrieval(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        if not raw.strip():
            return web.json_response({"status": "ok"})
        body = json.loads(raw)
        self.requests.append({"body": body, "headers": dict(request.headers)})
        await self._wait()
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error_code": 1002, "error_msg": "Authorization failed"}, status=400)
        if body.get("knowledge_id") != self.knowledge_id:
            return web.json_response({"error_code": 2001, "error_msg": "The knowledge does not exist"}, status=400)
        if self.behaviour.mode == "500":
            return web.Response(status=500, text="oops")
        import math

        records = [
            {
                "content": f"Knowledge passage {i} about {body['query']}.",
                "title": f"kb doc {i}",
                "score": round(1 / (1 + math.exp(-(2.0 - i))), 6),
                "metadata": {"document_id": f"doc-{i}", "year": 2020 + i},
            }
            for i in range(1, 4)
        ]
        threshold = body["retrieval_setting"].get("score_threshold") or 0.0
        records = [r for r in records if r["score"] >= threshold][: body["retrieval_setting"]["top_k"]]
        return web.json_response({"records": records})


class FakeCustomRetrieverEndpoint(FakeUpstream):
    """GET ?query= answering [{url, raw_content}], the contract of GPT-Researcher's `custom` retriever."""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/search", self.search)
        return app

    async def search(self, request: web.Request) -> web.StreamResponse:
        self.requests.append({"query": dict(request.query)})
        await self._wait()
        if self._mode() == "500":
            return web.Response(status=500, text="oops")
        query = request.query.get("query", "")
        return web.json_response(
            [
                {
                    "url": f"https://lab.example/{i}",
                    "raw_content": f"Lab passage {i} reports how {query} behaves on our data. " * 8,
                }
                for i in (1, 2, 3)
            ]
        )
