"""Semantic Scholar's Academic Graph paper search."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tests.fakes.base import ScholarlyFake
from tests.fakes.papers import DPR_ABSTRACT, DPR_ARXIV, DPR_AUTHORS, DPR_DOI, DPR_TITLE


class FakeSemanticScholar(ScholarlyFake):
    path = "/graph/v1/paper/search"
    api_key = "s2-test-key"

    def too_many(self) -> web.Response:
        message = (
            "Too Many Requests. Please wait and try again or apply for a key for higher rate limits. "
            "https://www.semanticscholar.org/product/api#api-key-form"
        )
        return web.json_response({"message": message, "code": "429"}, status=429, headers=self._headers())

    async def answer(self, request: web.Request, mode: str) -> web.Response:
        key = request.headers.get("x-api-key")
        if key is not None and key != self.api_key:
            return web.json_response({"message": "Forbidden"}, status=403)
        if mode == "400":
            return web.json_response({"error": "Unrecognized or unsupported fields: [bogus]"}, status=400)
        if mode == "malformed":
            return web.Response(text="{'data': [", content_type="application/json")
        if mode == "empty":
            return web.json_response({"total": 0, "offset": 0})
        data = self.behaviour.items or [dpr_semantic_scholar()]
        return web.json_response({"total": len(data), "offset": 0, "data": data})


def dpr_semantic_scholar() -> dict[str, Any]:
    return {
        "paperId": "79cd9f77e5258f62c0e15d11534aea6393ef73fe",
        "externalIds": {
            "ArXiv": DPR_ARXIV,
            "DBLP": "conf/emnlp/KarpukhinOMLWEC20",
            "DOI": DPR_DOI,
            "CorpusId": 215737187,
        },
        "url": "https://www.semanticscholar.org/paper/79cd9f77e5258f62c0e15d11534aea6393ef73fe",
        "title": DPR_TITLE,
        "abstract": DPR_ABSTRACT,
        "venue": "Conference on Empirical Methods in Natural Language Processing",
        "year": 2020,
        "openAccessPdf": {"url": "https://www.aclweb.org/anthology/2020.emnlp-main.550.pdf", "status": "HYBRID"},
        "authors": [{"authorId": str(i), "name": f"{g} {f}"} for i, (g, f) in enumerate(DPR_AUTHORS)],
    }
