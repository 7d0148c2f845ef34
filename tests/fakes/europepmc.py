"""Europe PMC's REST search."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tests.fakes.base import ScholarlyFake


class FakeEuropePmc(ScholarlyFake):
    path = "/europepmc/webservices/rest/search"

    async def answer(self, request: web.Request, mode: str) -> web.Response:
        if mode == "malformed":
            return web.Response(text='{"resultList": {"result": [', content_type="application/json")
        items = [] if mode == "empty" else (self.behaviour.items or [alphafold_europepmc()])
        body = {
            "version": "6.9",
            "hitCount": len(items),
            "nextCursorMark": "AoIIP4AAACgyNzg0MzQ3Ng==",
            "request": {
                "queryString": request.query["query"],
                "resultType": "core",
                "cursorMark": "*",
                "pageSize": int(request.query["pageSize"]),
                "sort": "",
                "synonym": False,
            },
            "resultList": {"result": items},
        }
        return web.json_response(body)


def alphafold_europepmc() -> dict[str, Any]:
    return {
        "id": "34265844",
        "source": "MED",
        "pmid": "34265844",
        "pmcid": "PMC8371605",
        "doi": "10.1038/s41586-021-03819-2",
        "title": "Highly accurate protein structure prediction with AlphaFold.",
        "authorString": "Jumper J, Evans R, Pritzel A.",
        "authorList": {
            "author": [
                {"fullName": "Jumper J", "firstName": "John", "lastName": "Jumper"},
                {"fullName": "Evans R", "firstName": "Richard", "lastName": "Evans"},
            ]
        },
        "journalInfo": {"yearOfPublication": 2021, "journal": {"title": "Nature", "isoabbreviation": "Nature"}},
        "pubYear": "2021",
        "abstractText": "Proteins are essential to life, and understanding their structure <b>can</b> facilitate.",
        "isOpenAccess": "Y",
        "fullTextUrlList": {
            "fullTextUrl": [
                {
                    "availability": "Subscription required",
                    "availabilityCode": "S",
                    "documentStyle": "doi",
                    "site": "DOI",
                    "url": "https://doi.org/10.1038/s41586-021-03819-2",
                },
                {
                    "availability": "Open access",
                    "availabilityCode": "OA",
                    "documentStyle": "pdf",
                    "site": "Europe_PMC",
                    "url": "https://europepmc.org/articles/PMC8371605?pdf=render",
                },
            ]
        },
    }
