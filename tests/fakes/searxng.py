"""A SearxNG instance's JSON API."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tests.fakes.base import ScholarlyFake
from tests.fakes.papers import DPR_ARXIV, DPR_TITLE


class FakeSearxng(ScholarlyFake):
    path = "/search"

    async def answer(self, request: web.Request, mode: str) -> web.Response:
        if mode == "403" or request.query.get("format") != "json":
            # what SearxNG's flask.abort(403) sends when json is not in search.formats
            return web.Response(
                status=403,
                text="<!doctype html><title>403 Forbidden</title><h1>Forbidden</h1>",
                content_type="text/html",
            )
        if mode == "malformed":
            return web.Response(text='{"query": "x", "results": [', content_type="application/json")
        results = [] if mode == "empty" else (self.behaviour.items or searxng_results())
        body = {
            "query": request.query["q"],
            "number_of_results": 0,
            "results": results,
            "answers": [],
            "corrections": [],
            "infoboxes": [],
            "suggestions": ["dense retrieval"],
            "unresponsive_engines": [["google", "timeout"]],
        }
        return web.json_response(body)


def searxng_results() -> list[dict[str, Any]]:
    return [
        {
            "url": f"https://arxiv.org/abs/{DPR_ARXIV}",
            "title": DPR_TITLE,
            "content": "We show that retrieval can be practically implemented using dense representations alone.",
            "engine": "duckduckgo",
            "parsed_url": ["https", "arxiv.org", f"/abs/{DPR_ARXIV}", "", "", ""],
            "template": "default.html",
            "engines": ["duckduckgo", "brave"],
            "positions": [1, 2],
            "score": 4.0,
            "category": "general",
            "publishedDate": None,
            "thumbnail": "",
        },
        {
            "url": "https://example.org/dpr-explained",
            "title": "DPR explained",
            "content": "A blog post on DPR.",
            "engine": "duckduckgo",
            "engines": ["duckduckgo"],
            "positions": [2],
            "score": 0.5,
            "category": "general",
        },
    ]
