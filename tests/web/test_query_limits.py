"""Issue 16: the query APIs bound what one key can make the server hold: query length, and
queries in flight per key (429 with Retry-After), on /retrieval and the literature API."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp

from fedresearch.web.keys import QUERYING, RUNTIME
from tests.conftest import make_settings

KEYS = "alice-key:alice,bob-key:bob"
BASES = """
[knowledge_bases.web]
user_id = "alice"
retrievers = ["tavily"]
"""


async def _post(url: str, body: dict[str, Any], key: str) -> tuple[int, dict[str, Any], dict[str, str]]:
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as session, session.post(url, json=body, headers=headers) as response:
        return response.status, json.loads(await response.text()), dict(response.headers)


async def _server(tmp_path, fakes, start_server, **overrides: Any):
    bases = tmp_path / "knowledge.toml"
    bases.write_text(BASES)
    settings = make_settings(tmp_path, fakes, api_keys=KEYS, knowledge_bases=bases, **overrides)
    return await start_server(settings)


def _retrieval(query: str) -> dict[str, Any]:
    return {"knowledge_id": "web", "query": query, "retrieval_setting": {"top_k": 3, "score_threshold": 0.0}}


async def test_retrieval_refuses_an_over_long_query_with_a_clear_400(tmp_path, fakes, start_server):
    server = await _server(tmp_path, fakes, start_server)
    status, answer, _ = await _post(server.url + "/retrieval", _retrieval("why " * 250_000), "alice-key")
    assert status == 400 and answer["error_code"] == 400 and "MAX_TASK_CHARS" in answer["error_msg"], answer
    assert fakes["tavily"].requests == []  # refused before any upstream is asked
    status, answer, _ = await _post(server.url + "/retrieval", _retrieval("rank fusion"), "alice-key")
    assert status == 200 and answer["records"], answer


async def test_retrieval_answers_429_past_the_queries_a_key_may_run_at_once(tmp_path, fakes, start_server):
    fakes["tavily"].behaviour.delay_s = 1.0
    server = await _server(tmp_path, fakes, start_server, max_queries_per_key=2)
    url = server.url + "/retrieval"
    answers = await asyncio.gather(*(_post(url, _retrieval(f"rank fusion {n}"), "alice-key") for n in range(4)))
    statuses = sorted(status for status, _, _ in answers)
    assert statuses == [200, 200, 429, 429], statuses
    refused = next((answer, headers) for status, answer, headers in answers if status == 429)
    assert refused[0]["error_code"] == 429 and "MAX_QUERIES_PER_KEY=2" in refused[0]["error_msg"], refused
    assert refused[1]["Retry-After"] == "1"
    assert not server.app[QUERYING]  # every slot given back
    assert (await _post(url, _retrieval("rank fusion again"), "alice-key"))[0] == 200


async def test_the_literature_api_limits_queries_per_key_not_across_keys(tmp_path, fakes, start_server):
    server = await _server(tmp_path, fakes, start_server, max_queries_per_key=1)
    library = server.app[RUNTIME].deps.library
    search = library.search

    def slow_search(*args: Any, **kwargs: Any) -> Any:  # a search that takes a while, as on a big library
        time.sleep(0.5)
        return search(*args, **kwargs)

    library.search = slow_search  # type: ignore[method-assign]
    url = server.url + "/internal/biblios/vector_search/"
    asked = [
        _post(url, {"user_id": "alice", "query": "rank fusion"}, "alice-key"),
        _post(url, {"user_id": "alice", "query": "dense retrieval"}, "alice-key"),
        _post(url, {"user_id": "bob", "query": "rank fusion"}, "bob-key"),
    ]
    *alices, bobs = await asyncio.gather(*asked)
    assert sorted(status for status, _, _ in alices) == [200, 429] and bobs[0] == 200, (alices, bobs)
    _, refused, headers = next(answer for answer in alices if answer[0] == 429)
    assert "MAX_QUERIES_PER_KEY=1" in refused["error"] and headers["Retry-After"] == "1"
    status, answer, _ = await _post(url, {"user_id": "alice", "query": "q" * 1_000_000}, "alice-key")
    assert status == 400 and "MAX_TASK_CHARS" in answer["error"], answer
