"""The internal literature API (`POST /internal/biblios/vector_search/`), as its service answers."""

from __future__ import annotations

from aiohttp import web

from tests.fakes.base import FakeUpstream


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
