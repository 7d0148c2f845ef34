"""Google's Custom Search JSON API, as www.googleapis.com answers it."""

from __future__ import annotations

from aiohttp import web

from tests.fakes.base import FakeUpstream


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
