"""Tavily's search API, as api.tavily.com answers it."""

from __future__ import annotations

from aiohttp import web

from tests.fakes.base import FakeUpstream


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
        if mode == "500" or any(part in str(body.get("query", "")) for part in self.behaviour.failing_queries):
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
