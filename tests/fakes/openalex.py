"""OpenAlex's works search, as api.openalex.org answers it."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tests.fakes.base import ScholarlyFake
from tests.fakes.papers import DPR_ABSTRACT, DPR_ARXIV, DPR_AUTHORS, DPR_DOI, DPR_TITLE


def _inverted(text: str) -> dict[str, list[int]]:
    index: dict[str, list[int]] = {}
    for position, word in enumerate(text.split()):
        index.setdefault(word, []).append(position)
    return index


class FakeOpenAlex(ScholarlyFake):
    path = "/works"
    api_key = "oa-test-key"

    async def answer(self, request: web.Request, mode: str) -> web.Response:
        if mode == "403":
            return web.json_response({"error": "Rate limit exceeded", "message": "Slow down."}, status=403)
        if mode == "malformed":
            return web.Response(text='{"results": [', content_type="application/json")
        works = [] if mode == "empty" else (self.behaviour.items or [dpr_openalex()])
        meta = {"count": len(works), "db_response_time_ms": 12, "page": 1, "per_page": int(request.query["per-page"])}
        return web.json_response({"meta": meta, "results": works, "group_by": []})


def dpr_openalex() -> dict[str, Any]:
    return {
        "id": "https://openalex.org/W3099700870",
        "doi": f"https://doi.org/{DPR_DOI}",
        "title": DPR_TITLE,
        "display_name": DPR_TITLE,
        "publication_year": 2020,
        "ids": {"openalex": "https://openalex.org/W3099700870", "doi": f"https://doi.org/{DPR_DOI}"},
        "primary_location": {
            "is_oa": True,
            "landing_page_url": f"https://doi.org/{DPR_DOI}",
            "pdf_url": "https://www.aclweb.org/anthology/2020.emnlp-main.550.pdf",
            "source": {"id": "https://openalex.org/S4363608991", "display_name": "Proceedings of EMNLP 2020"},
        },
        "best_oa_location": {"is_oa": True, "pdf_url": "https://www.aclweb.org/anthology/2020.emnlp-main.550.pdf"},
        "locations": [
            {"landing_page_url": f"https://doi.org/{DPR_DOI}", "source": None},
            {"landing_page_url": f"https://arxiv.org/abs/{DPR_ARXIV}", "source": {"display_name": "arXiv"}},
        ],
        "authorships": [
            {"author_position": "first", "author": {"id": "https://openalex.org/A1", "display_name": f"{g} {f}"}}
            for g, f in DPR_AUTHORS
        ],
        "cited_by_count": 3000,
        "abstract_inverted_index": _inverted(DPR_ABSTRACT),
    }
