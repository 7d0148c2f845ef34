"""Crossref's REST API, as api.crossref.org answers it."""

from __future__ import annotations

from typing import Any
from xml.sax.saxutils import escape

from aiohttp import web

from tests.fakes.base import ScholarlyFake
from tests.fakes.papers import DPR_ABSTRACT, DPR_AUTHORS, DPR_DOI, DPR_TITLE


class FakeCrossref(ScholarlyFake):
    path = "/works"

    async def answer(self, request: web.Request, mode: str) -> web.Response:
        limits = {"x-rate-limit-limit": "5", "x-rate-limit-interval": "1s", "x-concurrency-limit": "1"}
        if "mailto" in request.query:
            limits = {"x-rate-limit-limit": "10", "x-rate-limit-interval": "1s", "x-concurrency-limit": "3"}
        if mode == "400":
            reason = {"type": "integer-not-valid", "value": "x", "message": "Integer specified as x but must be int"}
            body = {"status": "failed", "message-type": "validation-failure", "message": [reason]}
            return web.json_response(body, status=400, headers=limits)
        if mode == "malformed":
            return web.Response(text='{"status":"ok","message":{', content_type="application/json", headers=limits)
        items = [] if mode == "empty" else (self.behaviour.items or [dpr_crossref()])
        message = {
            "facets": {},
            "total-results": len(items),
            "items": items,
            "items-per-page": int(request.query.get("rows", 20)),
            "query": {"start-index": 0, "search-terms": request.query.get("query")},
        }
        body = {"status": "ok", "message-type": "work-list", "message-version": "1.0.0", "message": message}
        return web.json_response(body, headers=limits)


def dpr_crossref() -> dict[str, Any]:
    return {
        "DOI": DPR_DOI,
        "type": "proceedings-article",
        "title": [DPR_TITLE],
        "author": [{"given": g, "family": f, "sequence": "first", "affiliation": []} for g, f in DPR_AUTHORS],
        "issued": {"date-parts": [[2020]]},
        "published": {"date-parts": [[2020, 11]]},
        "container-title": ["Proceedings of the 2020 Conference on Empirical Methods in Natural Language Processing"],
        "abstract": f"<jats:title>Abstract</jats:title><jats:p>{escape(DPR_ABSTRACT)}</jats:p>",
        "URL": f"https://doi.org/{DPR_DOI}",
        "license": [{"URL": "https://creativecommons.org/licenses/by/4.0/", "content-version": "unspecified"}],
        "link": [
            {
                "URL": "https://www.aclweb.org/anthology/2020.emnlp-main.550.pdf",
                "content-type": "application/pdf",
                "content-version": "vor",
                "intended-application": "text-mining",
            }
        ],
        "score": 31.5,
    }
