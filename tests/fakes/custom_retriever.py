"""An endpoint of GPT-Researcher's `custom` retriever contract."""

from __future__ import annotations

from aiohttp import web

from tests.fakes.base import FakeUpstream


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
