"""The dify adapter against a fake Dify-compatible endpoint that answers like adbpg-endpoint."""

from __future__ import annotations

import pytest
import websockets

from fedresearch.federation.contract import RetrieverFailed, SearchOptions
from tests.conftest import logs, make_settings, registry_of, report_of, run_task, search_with
from tests.fakes.dify import FakeDifyKnowledge


@pytest.fixture
async def knowledge():
    fake = await FakeDifyKnowledge().start()
    yield fake
    await fake.stop()


def upstreams_file(tmp_path, knowledge, key="env:ADBPG_KEY", knowledge_id="kb-1"):
    path = tmp_path / "dify.toml"
    path.write_text(
        f'[adbpg]\nendpoint = "{knowledge.url}/dify/"\napi_key = "{key}"\nknowledge_id = "{knowledge_id}"\n'
    )
    return path


OPTIONS = SearchOptions(query="rank fusion", max_results=2)


async def search(settings):
    return await search_with(registry_of(settings)["adbpg"], OPTIONS, settings)


async def test_sends_dify_body_and_maps_records(tmp_path, knowledge, monkeypatch):
    monkeypatch.setenv("ADBPG_KEY", FakeDifyKnowledge.api_key)
    settings = make_settings(tmp_path, dify_upstreams=upstreams_file(tmp_path, knowledge))
    hits = await search(settings)
    sent = knowledge.requests[0]
    assert sent["body"] == {
        "knowledge_id": "kb-1",
        "query": "rank fusion",
        "retrieval_setting": {"top_k": 2, "score_threshold": 0.0},
    }
    assert sent["headers"]["Authorization"] == "Bearer adbpg-test-key"
    assert [r.href for r in hits.results] == ["adbpg:doc-1", "adbpg:doc-2"]
    assert hits.results[0].score == pytest.approx(0.731059) and hits.results[0].title == "kb doc 1"
    assert hits.results[0].metadata["year"] == 2021 and hits.results[0].retriever == "adbpg"


@pytest.mark.parametrize(
    ("key", "knowledge_id", "expected"),
    [
        ("wrong", "kb-1", "rejected the API key (HTTP 400, error_code 1002"),
        ("adbpg-test-key", "kb-x", "does not know the knowledge_id (HTTP 400, error_code 2001"),
    ],
)
async def test_error_codes_become_clear_failures(tmp_path, knowledge, key, knowledge_id, expected):
    settings = make_settings(tmp_path, dify_upstreams=upstreams_file(tmp_path, knowledge, key, knowledge_id))
    with pytest.raises(RetrieverFailed) as failure:
        await search(settings)
    assert expected in str(failure.value) and "wrong" not in str(failure.value)


async def test_server_error_and_missing_env_key(tmp_path, knowledge, monkeypatch):
    knowledge.behaviour.mode = "500"
    settings = make_settings(tmp_path, dify_upstreams=upstreams_file(tmp_path, knowledge, "adbpg-test-key"))
    with pytest.raises(RetrieverFailed, match="HTTP 500"):
        await search(settings)
    monkeypatch.delenv("ADBPG_KEY", raising=False)
    with pytest.raises(ValueError, match="ADBPG_KEY is not set"):
        registry_of(make_settings(tmp_path, dify_upstreams=upstreams_file(tmp_path, knowledge)))


async def test_usable_by_name_in_a_research_task(tmp_path, knowledge, fakes, start_server):
    settings = make_settings(tmp_path, fakes, dify_upstreams=upstreams_file(tmp_path, knowledge, "adbpg-test-key"))
    server = await start_server(settings)
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(ws, {"task": "rank fusion", "headers": {"retrievers": "adbpg,tavily"}})
    assert {f["metadata"]["name"] for f in logs(frames, "retriever_done")} == {"adbpg", "tavily"}
    assert "adbpg:doc-1" in report_of(frames)
