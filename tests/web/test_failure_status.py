"""Why a task did not run or did not finish is a kind, said where it is decided; the REST API
answers each kind with its HTTP status (`POST /report/` waiting for the report), the message as before."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from fedresearch.core.errors import FailureKind, RequestError, ServerStopping, TooManyTasks
from fedresearch.jobs import runs
from fedresearch.web import jobs as rest
from fedresearch.web.keys import STOPPING
from tests.web.test_jobs_api import ALICE, TASK, job_settings

WAITING = {**TASK, "headers": {"retrievers": "tavily"}, "generate_in_background": False}


async def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.post(f"{url}/report/", json=body, headers=ALICE) as answer:
        return answer.status, await answer.json()


def test_every_kind_has_its_status_and_each_refusal_its_kind() -> None:
    assert {kind: rest._FAILURE_STATUS[kind] for kind in FailureKind} == {
        FailureKind.bad_request: 400,
        FailureKind.too_many_tasks: 429,
        FailureKind.stopping: 503,
        FailureKind.timed_out: 504,
        FailureKind.internal: 500,
    }
    assert RequestError("x").kind is FailureKind.bad_request
    assert TooManyTasks("x").kind is FailureKind.too_many_tasks and isinstance(TooManyTasks("x"), RequestError)
    assert ServerStopping("x").kind is FailureKind.stopping and isinstance(ServerStopping("x"), RequestError)


async def test_a_bad_request_is_400(tmp_path, fakes, start_server) -> None:
    server = await start_server(job_settings(tmp_path, fakes))
    status, body = await _post(server.url, {**WAITING, "headers": {"retrievers": "tavily,bing"}})
    assert status == 400 and "'bing'" in body["error"] and body["status"] == "failed"


async def test_a_task_over_its_keys_max_tasks_per_key_is_429(tmp_path, fakes, start_server) -> None:
    fakes["tavily"].behaviour.delay_s = 1.0
    server = await start_server(job_settings(tmp_path, fakes, max_tasks_per_key=1))
    status, first = await _post(server.url, {**WAITING, "generate_in_background": True})
    assert status == 200 and first["research_id"]
    status, body = await _post(server.url, WAITING)
    expected = "1 tasks are already running for this API key (MAX_TASKS_PER_KEY=1); wait for one to finish"
    assert status == 429 and body["error"] == body["detail"] == expected


async def test_a_task_sent_to_a_stopping_server_is_503(tmp_path, fakes, start_server) -> None:
    server = await start_server(job_settings(tmp_path, fakes))
    server.app[STOPPING].begin()
    status, body = await _post(server.url, WAITING)
    assert status == 503 and body["error"] == runs._STOPPING
    assert not fakes["tavily"].requests


async def test_a_task_past_task_timeout_s_is_504(tmp_path, fakes, start_server, monkeypatch) -> None:
    async def endless(*_: Any) -> None:
        await asyncio.sleep(3600)

    monkeypatch.setattr(runs, "run_research", endless)
    server = await start_server(job_settings(tmp_path, fakes, task_timeout_s=0.2))
    status, body = await _post(server.url, WAITING)
    assert status == 504 and body["error"] == "the task did not finish within 0.2 s (TASK_TIMEOUT_S)"


async def test_an_internal_error_is_500(tmp_path, fakes, start_server, monkeypatch) -> None:
    async def broken(*_: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(runs, "run_research", broken)
    server = await start_server(job_settings(tmp_path, fakes))
    with pytest.MonkeyPatch.context() as quiet:
        quiet.setattr(runs.log, "exception", lambda *_: None)  # the bug is expected here
        status, body = await _post(server.url, WAITING)
    assert status == 500
    assert body["error"] == "internal error while running the task; the server log has the details"
