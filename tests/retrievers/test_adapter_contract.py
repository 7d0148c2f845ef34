"""The adapter contract: a new adapter is one module plus one line in the registry tuple, the
runner owns its I/O, `About` decides what the rest of the system does with it, and every timeout
setting takes effect as documented."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import websockets
from pydantic_settings import BaseSettings

from fedresearch.federation.contract import UpstreamSettings
from fedresearch.federation.registry import Upstream
from fedresearch.retrievers import ADAPTERS
from tests.conftest import logs, make_settings, registry_of, report_of, run_task
from tests.fakes.custom_retriever import FakeCustomRetrieverEndpoint
from tests.throwaway_adapter import LabSearch, about


@pytest.fixture
async def lab():
    fake = await FakeCustomRetrieverEndpoint().start()
    yield fake
    await fake.stop()


async def test_a_new_adapter_is_one_module_and_one_registry_line(tmp_path, fakes, lab, start_server):
    adapter = LabSearch(lab.url)
    given: list[object] = []
    lab_upstream = Upstream.of(about, lambda settings: given.append(settings) or [adapter])
    server = await start_server(make_settings(tmp_path, fakes), adapters=(*ADAPTERS, lab_upstream))
    headers = {"retrievers": "scholar,tavily", "lab_token": "t-1", "tavily_api_key": FAKE_TAVILY_KEY}
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(ws, {"task": "rank fusion", "report_type": "resource_report", "headers": headers})
    assert {f["metadata"]["name"] for f in logs(frames, "retriever_done")} == {"lab", "tavily"}
    assert lab.requests[0]["query"] == {"query": "rank fusion"}
    assert adapter.seen_credentials == [{"lab_token": "t-1"}]  # never another adapter's key
    assert [type(settings) for settings in given] == [UpstreamSettings]  # nor another's settings: it has none
    report = report_of(frames)
    assert "- lab: 3 results" in report  # searched and said (whether cited is the relevance gate's call)
    async with websockets.connect(server.ws_url) as ws:  # without its key it is skipped, with the reason
        frames = await run_task(ws, {"task": "rank fusion", "headers": {"retrievers": "lab"}})
    assert "send headers.lab_token" in logs(frames, "retriever_skipped")[0]["output"]


async def test_api_retrievers_lists_what_about_declares(tmp_path, fakes, lab, start_server):
    import aiohttp

    lab_upstream = Upstream.of(about, lambda settings: [LabSearch(lab.url)])
    server = await start_server(make_settings(tmp_path, fakes), adapters=(*ADAPTERS, lab_upstream))
    async with aiohttp.ClientSession() as session, session.get(f"{server.url}/api/retrievers") as response:
        listed = {entry["name"]: entry for entry in (await response.json())["retrievers"]}
    assert listed["lab"] == {
        "name": "lab",
        "kind": "scholarly",
        "configured": False,
        "reason": "send headers.lab_token",
        "website": "https://lab.example",
        "needs_key": True,
        "needs_user": False,
        "credentials": ["lab_token"],
    }
    assert listed["tavily"]["configured"] is True and listed["internal_biblio"]["kind"] == "library"


def test_each_adapter_holds_its_own_upstreams_settings_and_nothing_else(tmp_path, fakes):
    settings = make_settings(tmp_path, fakes, brave_api_key="brave-key", openalex_api_key="openalex-key")
    for name, adapter in registry_of(settings).items():
        held = [value for value in vars(adapter).values() if isinstance(value, BaseSettings)]
        assert all(type(value) is adapter.about.settings for value in held), name  # never the server's `Settings`


def test_a_bad_upstream_setting_stops_the_server_with_its_name_and_never_its_value(tmp_path):
    """An upstream's settings are read as its process starts (the registry is built), and a bad one
    is reported as the server's own are: by name, without the value given."""
    env = {**os.environ, "FEDRESEARCH_DATA_DIR": str(tmp_path / "data"), "FEDRESEARCH_EMBEDDINGS": "false"}
    env["INTERNAL_API_TIMEOUT_S"] = "hunter2"
    command = [sys.executable, "-m", "fedresearch", "serve", "--port", "0"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "fedresearch: invalid settings: INTERNAL_API_TIMEOUT_S: Input should be a valid number" in done.stderr
    assert "hunter2" not in done.stderr and "Traceback" not in done.stderr


async def run_one(server, headers):
    async with websockets.connect(server.ws_url) as ws:
        return await run_task(ws, {"task": "rank fusion", "headers": {"user_id": "u", **headers}})


async def test_retriever_timeout_s_bounds_each_retriever(tmp_path, fakes, start_server):
    fakes["tavily"].behaviour.delay_s = 2.0
    server = await start_server(make_settings(tmp_path, fakes, retriever_timeout_s=0.3, retry_attempts=0))
    frames = await run_one(server, {"retrievers": "tavily,google"})
    (failed,) = logs(frames, "retriever_failed")
    assert "no answer within 0.3 s (RETRIEVER_TIMEOUT_S)" in failed["output"]
    assert logs(frames, "retriever_done")[0]["metadata"]["name"] == "google"


async def test_internal_api_timeout_s_replaces_the_retriever_timeout_for_the_literature_api(
    tmp_path, fakes, start_server
):
    fakes["internal"].behaviour.delay_s = 0.8
    base = {"retriever_timeout_s": 0.3, "retry_attempts": 0, "internal_api_base_url": fakes["internal"].url}
    server = await start_server(make_settings(tmp_path, fakes, internal_api_timeout_s=3, **base))
    frames = await run_one(server, {"retrievers": "internal_biblio"})
    assert logs(frames, "retriever_done") and not logs(frames, "retriever_failed")
    server = await start_server(make_settings(tmp_path / "b", fakes, internal_api_timeout_s=0.4, **base))
    frames = await run_one(server, {"retrievers": "internal_biblio"})
    assert "no answer within 0.4 s (INTERNAL_API_TIMEOUT_S)" in logs(frames, "retriever_failed")[0]["output"]


async def test_task_timeout_s_caps_retrievers_and_still_ends_with_a_report(tmp_path, fakes, start_server):
    fakes["tavily"].behaviour.delay_s = 10.0
    settings = make_settings(
        tmp_path, fakes, retriever_timeout_s=20, task_timeout_s=4.0, retry_attempts=0, embeddings=False
    )
    server = await start_server(settings)
    frames = await run_one(server, {"retrievers": "tavily,google"})
    assert "no answer within 3.2 s (TASK_TIMEOUT_S)" in logs(frames, "retriever_failed")[0]["output"]
    assert frames[-1]["type"] == "path" and "Google result 1" in report_of(frames)


FAKE_TAVILY_KEY = "tvly-test-key"
