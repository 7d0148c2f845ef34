"""A Dify-compatible External Knowledge endpoint, as adbpg-endpoint answers."""

from __future__ import annotations

import json

from aiohttp import web

from tests.fakes.base import FakeUpstream


class FakeDifyKnowledge(FakeUpstream):
    """A Dify-compatible knowledge endpoint that answers as adbpg-endpoint does: sigmoid scores,
    `{"status": "ok"}` on an empty body, and 400 with an error_code for a bad key or knowledge id."""

    api_key = "adbpg-test-key"
    knowledge_id = "kb-1"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/dify/retrieval", self.retrieval)
        return app

    async def retrieval(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        if not raw.strip():
            return web.json_response({"status": "ok"})
        body = json.loads(raw)
        self.requests.append({"body": body, "headers": dict(request.headers)})
        await self._wait()
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error_code": 1002, "error_msg": "Authorization failed"}, status=400)
        if body.get("knowledge_id") != self.knowledge_id:
            return web.json_response({"error_code": 2001, "error_msg": "The knowledge does not exist"}, status=400)
        if self.behaviour.mode == "500":
            return web.Response(status=500, text="oops")
        import math

        records = [
            {
                "content": f"Knowledge passage {i} about {body['query']}.",
                "title": f"kb doc {i}",
                "score": round(1 / (1 + math.exp(-(2.0 - i))), 6),
                "metadata": {"document_id": f"doc-{i}", "year": 2020 + i},
            }
            for i in range(1, 4)
        ]
        threshold = body["retrieval_setting"].get("score_threshold") or 0.0
        records = [r for r in records if r["score"] >= threshold][: body["retrieval_setting"]["top_k"]]
        return web.json_response({"records": records})
