"""Brave's Search API."""

from __future__ import annotations

from aiohttp import web

from tests.fakes.base import ScholarlyFake


class FakeBrave(ScholarlyFake):
    path = "/res/v1/web/search"
    api_key = "brave-test-key"

    def too_many(self) -> web.Response:
        error = {
            "id": "e1",
            "status": 429,
            "code": "RATE_LIMITED",
            "detail": "Request rate limit exceeded for plan.",
            "meta": {"plan": "Free", "rate_limit": 1, "rate_current": 2, "quota_limit": 2000, "quota_current": 5},
        }
        headers = {"X-RateLimit-Limit": "1, 2000", "X-RateLimit-Remaining": "0, 1995", "X-RateLimit-Reset": "1, 86000"}
        return web.json_response(
            {"type": "ErrorResponse", "error": error, "time": 1}, status=429, headers={**headers, **self._headers()}
        )

    async def answer(self, request: web.Request, mode: str) -> web.Response:
        if request.headers.get("X-Subscription-Token") != self.api_key:
            error = {
                "id": "e2",
                "status": 422,
                "code": "SUBSCRIPTION_TOKEN_INVALID",
                "detail": "The provided subscription token is invalid.",
                "meta": {},
            }
            return web.json_response({"type": "ErrorResponse", "error": error, "time": 1}, status=422)
        if mode == "malformed":
            return web.Response(text='{"type": "search", "web": {', content_type="application/json")
        query = {"original": request.query["q"], "show_strict_warning": False, "is_navigational": False}
        if mode == "empty":
            return web.json_response({"type": "search", "query": query, "mixed": {"type": "mixed", "main": []}})
        results = self.behaviour.items or [
            {
                "title": f"<strong>Dense</strong> Passage Retrieval {i}",
                "url": f"https://brave.example/{i}",
                "is_source_local": False,
                "is_source_both": False,
                "description": f"Result {i} on <strong>DPR</strong>.",
                "page_age": "2020-04-10T00:00:00",
                "profile": {"name": "Example"},
                "language": "en",
                "family_friendly": True,
                "type": "search_result",
                "subtype": "generic",
                "extra_snippets": [f"More on {i}."],
                "age": "April 10, 2020",
            }
            for i in (1, 2, 3)
        ]
        return web.json_response(
            {"type": "search", "query": query, "web": {"type": "search", "results": results, "family_friendly": True}}
        )
