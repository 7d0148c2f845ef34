"""Jobs end to end on 127.0.0.1: GPT-Researcher's REST API, webhooks to a real receiver (that also
fails), ownership between two users' keys, detach and resume over /ws, retention and restarts."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
import websockets
from aiohttp import web

from fedresearch.core.settings import Settings
from fedresearch.jobs import runs as tasks
from fedresearch.jobs.store import Job, JobStatus
from fedresearch.retrievers.internal_api import InternalApiSettings
from fedresearch.web.app import create_app
from fedresearch.web.keys import RUNTIME, SETTINGS
from tests.conftest import make_settings, report_of, run_task

TASK = {"task": "How does rank fusion combine lexical and dense retrieval?", "report_type": "research_report"}
KEYS = "alice-key:alice,bob-key:bob,admin-key:*"
ALICE, BOB, ADMIN = ({"Authorization": f"Bearer {who}-key"} for who in ("alice", "bob", "admin"))


class WebhookReceiver:
    """A service that takes job notifications; it answers 500 for its first `failures` calls."""

    def __init__(self) -> None:
        self.failures = 0
        self.calls: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.delivered: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append((dict(request.headers), body))
        if self.failures > 0:
            self.failures -= 1
            return web.json_response({"error": "busy"}, status=500)
        await self.delivered.put(body)
        return web.json_response({"received": True})

    async def start(self) -> WebhookReceiver:
        app = web.Application()
        app.router.add_post("/hooks/research", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/hooks/research"  # type: ignore[union-attr]
        return self

    async def next(self) -> dict[str, Any]:
        return await asyncio.wait_for(self.delivered.get(), timeout=30)


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    started = await WebhookReceiver().start()
    yield started
    assert started.runner is not None
    await started.runner.cleanup()


def job_settings(tmp_path: Path, fakes: dict[str, Any], **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "internal_api_base_url": fakes["internal"].url,
        "api_keys": KEYS,
        "webhook_backoff_s": 0.05,
        "embeddings": False,  # no encoder to load: these tests are about jobs, not ranking
        **overrides,
    }
    return make_settings(tmp_path, fakes, **values)


async def poll_job(session: aiohttp.ClientSession, url: str, research_id: str) -> dict[str, Any]:
    for _ in range(600):
        async with session.get(f"{url}/api/jobs/{research_id}", headers=ALICE) as response:
            job: dict[str, Any] = await response.json()
        if job["status"] in ("completed", "failed", "cancelled"):
            return job
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {research_id} did not finish: {job}")


async def test_rest_jobs_webhooks_and_ownership(tmp_path, fakes, start_server, receiver):
    server = await start_server(job_settings(tmp_path, fakes, webhook_url=receiver.url, webhook_api_key="hook-secret"))
    task = {**TASK, "report_source": "local", "tone": "Objective", "headers": {"retrievers": "internal_biblio"}}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{server.url}/report/", json=task, headers=ALICE) as response:
            assert response.status == 200
            started = await response.json()
        assert started["message"].startswith("Your report is being generated in the background")
        research_id = started["research_id"]
        job = await poll_job(session, server.url, research_id)
        assert job["status"] == "completed" and job["progress"] == 1.0 and job["task"] == TASK["task"]
        assert "## References" in job["report"]
        assert set(job["files"]) == {"md", "pdf", "docx", "html", "json", "bib", "ris"}

        hook = await receiver.next()
        headers, _ = receiver.calls[-1]
        assert headers["x-api-key"] == "hook-secret"
        assert set(hook) == {"research_id", "status", "user_id", "data", "timestamp"}
        assert (hook["research_id"], hook["status"], hook["user_id"]) == (research_id, "completed", "alice")
        assert hook["data"]["report"] == job["report"] and hook["data"]["files"] == job["files"]

        async with session.get(f"{server.url}/report/{research_id}", headers=ALICE) as response:
            assert response.status == 200 and (await response.read())[:2] == b"PK"  # the DOCX
        for path in (
            f"api/jobs/{research_id}",
            f"report/{research_id}",
            f"api/reports/{research_id}",
            f"reports/{research_id}.md",
            f"reports/{research_id}.json",
            f"api/reports/{research_id}/chat",
        ):
            async with session.get(f"{server.url}/{path}", headers=BOB) as response:
                assert response.status == 404, path
            async with session.get(f"{server.url}/{path}", headers=ADMIN) as response:
                assert response.status == 200, path
        async with session.delete(f"{server.url}/api/reports/{research_id}", headers=BOB) as response:
            assert response.status == 404
        async with session.put(f"{server.url}/api/reports/{research_id}", json={"answer": "x"}, headers=BOB) as r:
            assert r.status == 404
        async with session.post(f"{server.url}/api/reports", json={"id": research_id}, headers=BOB) as response:
            assert response.status == 404
        async with session.get(f"{server.url}/api/reports", headers=BOB) as response:
            assert (await response.json())["reports"] == []
        async with session.post(f"{server.url}/api/chat", json=_chat(research_id), headers=BOB) as response:
            assert response.status == 404
        async with websockets.connect(server.ws_url, additional_headers=BOB) as ws:
            await ws.send("resume " + json.dumps({"research_id": research_id}))
            refused = json.loads(await ws.recv())
        assert refused["type"] == "error" and "not yours" in refused["output"]
        assert receiver.calls and all("bob" not in json.dumps(body) for _, body in receiver.calls)


def _chat(research_id: str) -> dict[str, Any]:
    return {"report": "", "research_id": research_id, "messages": [{"role": "user", "content": "rank fusion"}]}


async def test_a_failed_job_is_announced_and_a_failing_receiver_is_retried(
    tmp_path, fakes, start_server, receiver, caplog
):
    caplog.set_level(logging.INFO, logger="fedresearch")
    receiver.failures = 2
    settings = job_settings(tmp_path, fakes, webhook_url=receiver.url, webhook_api_key="hook-secret")
    server = await start_server(settings)
    bad = {**TASK, "headers": {"retrievers": "internal_biblio,bing"}}
    async with aiohttp.ClientSession() as session:
        started = time.perf_counter()
        body = bad  # in the background (the default): refused at once all the same
        async with session.post(f"{server.url}/report/", json=body, headers=ALICE) as response:
            assert response.status == 400
            answer = await response.json()
        # the job is not held up by the receiver's failures: its answer comes before the retries end
        assert answer["status"] == "failed" and "'bing'" in answer["error"]
        hook = await receiver.next()
        assert time.perf_counter() - started >= 0.05 + 0.1  # two backoffs: 0.05 s, then 0.1 s
        assert len(receiver.calls) == 3 and [c[1] for c in receiver.calls] == [hook] * 3
        assert hook["status"] == "failed" and "'bing'" in hook["error"] and "data" not in hook
        assert hook["research_id"] == answer["research_id"] and hook["user_id"] == "alice"
        job = await poll_job(session, server.url, answer["research_id"])
        assert job["status"] == "failed" and "'bing'" in job["error"]
        async with session.get(f"{server.url}/{job['files']['md']}", headers=ALICE) as response:
            assert "could not run" in await response.text()  # the short report that says why
    assert "attempt 2 failed (HTTP 500)" in caplog.text and "hook-secret" not in caplog.text


async def test_a_receiver_that_never_accepts_does_not_hold_the_job(tmp_path, fakes, start_server, receiver):
    receiver.failures = 100
    server = await start_server(job_settings(tmp_path, fakes, webhook_url=receiver.url, webhook_attempts=3))
    body = {**TASK, "headers": {"retrievers": "internal_biblio"}, "generate_in_background": False}
    async with aiohttp.ClientSession() as session, session.post(f"{server.url}/report/", json=body, headers=ALICE) as r:
        assert r.status == 200
        answer = await r.json()
    assert set(answer) == {"research_id", "research_information", "report", "docx_path", "pdf_path"}
    assert answer["report"].startswith("# ") and answer["docx_path"] == f"reports/{answer['research_id']}.docx"
    assert set(answer["research_information"]) == {"source_urls", "research_costs", "visited_urls", "research_images"}
    for _ in range(200):
        if len(receiver.calls) >= 3:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.3)
    assert len(receiver.calls) == 3  # WEBHOOK_ATTEMPTS, then it gives up


_VOLATILE = re.compile(r"[0-9a-f]{32}|\d+(\.\d+)?")


def _shape(frames: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """A run's frames with what differs between two runs of one task (ids, timings) masked."""
    return [
        (frame["type"], str(frame.get("content")), _VOLATILE.sub("#", json.dumps(frame.get("output"))))
        for frame in frames
    ]


async def test_detach_close_and_resume_replays_every_frame_once(tmp_path, fakes, start_server):
    fakes["internal"].behaviour.delay_s = 0.2
    fakes["tavily"].behaviour.delay_s = 0.8
    server = await start_server(job_settings(tmp_path, fakes, upstream_cache_ttl_s=0))  # both runs ask upstream
    task = {**TASK, "headers": {"retrievers": "internal_biblio,tavily"}}
    async with websockets.connect(server.ws_url, additional_headers=ALICE) as ws:
        attached = await run_task(ws, task)

    async with websockets.connect(server.ws_url, additional_headers=ALICE) as ws:
        await ws.send("start " + json.dumps({**task, "detach": True}))
        before = [json.loads(await ws.recv()) for _ in range(3)]  # then the socket goes away mid-task
    research_id = before[0]["metadata"]["research_id"]
    assert before[0]["content"] == "starting_research"
    status_url = f"{server.url}/api/jobs/{research_id}"
    async with aiohttp.ClientSession() as session, session.get(status_url, headers=ALICE) as response:
        assert (await response.json())["status"] == "running"  # the close did not cancel it
    async with websockets.connect(server.ws_url, additional_headers=ALICE) as ws:
        await ws.send("resume " + json.dumps({"research_id": research_id}))
        resumed = []
        while not resumed or resumed[-1]["type"] != "path":
            resumed.append(json.loads(await ws.recv()))
        await ws.send("chat " + json.dumps({"message": "How are lexical and dense rankings fused?"}))
        chat = json.loads(await ws.recv())
    assert resumed[:3] == before
    assert _shape(resumed) == _shape(attached)
    assert _VOLATILE.sub("#", report_of(resumed)) == _VOLATILE.sub("#", report_of(attached))
    async with aiohttp.ClientSession() as session, session.get(status_url, headers=ALICE) as response:
        assert report_of(resumed) == (await response.json())["report"]  # every chunk once, in order
    assert chat["type"] == "chat" and chat["content"]
    assert not any(frame["type"] == "error" for frame in resumed)

    async with websockets.connect(server.ws_url, additional_headers=ALICE) as ws:  # finished: replay, then end
        await ws.send("resume " + json.dumps({"research_id": research_id}))
        again = [json.loads(await ws.recv()) for _ in resumed]
        await ws.send("ping")
        assert await ws.recv() == "pong"  # nothing more came before the pong
    assert again == resumed


async def test_closing_an_attached_socket_cancels_its_job(tmp_path, fakes, start_server):
    fakes["tavily"].behaviour.delay_s = 5
    server = await start_server(job_settings(tmp_path, fakes))
    async with websockets.connect(server.ws_url, additional_headers=ALICE) as ws:
        await ws.send("start " + json.dumps({**TASK, "headers": {"retrievers": "tavily"}}))
        research_id = json.loads(await ws.recv())["metadata"]["research_id"]
    async with aiohttp.ClientSession() as session:
        job = await poll_job(session, server.url, research_id)
    assert job["status"] == "cancelled"
    async with websockets.connect(server.ws_url, additional_headers=ALICE) as ws:
        await ws.send("resume " + json.dumps({"research_id": research_id}))
        replayed = [json.loads(await ws.recv()) for _ in range(job["frames"])]
        assert replayed[-1]["content"] == "error" and "cancelled" in replayed[-1]["output"]  # why it stopped
        await ws.send("resume " + json.dumps({"research_id": "0" * 32}))
        unknown, twin = json.loads(await ws.recv()), json.loads(await ws.recv())
        assert unknown["type"] == "error" and "unknown" in unknown["output"] and twin["content"] == "error"
        await ws.send("resume {}")
        assert "research_id" in json.loads(await ws.recv())["output"]


async def _serve(settings: Settings) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(create_app(settings))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]


async def _run_sync(session: aiohttp.ClientSession, url: str, question: str) -> str:
    body = {**TASK, "task": question, "headers": {"retrievers": "internal_biblio"}, "generate_in_background": False}
    async with session.post(f"{url}/report/", json=body, headers=ALICE) as response:
        assert response.status == 200
        research_id: str = (await response.json())["research_id"]
        return research_id


async def test_retention_limits_and_jobs_surviving_a_restart(tmp_path, fakes):
    settings = job_settings(tmp_path, fakes, report_max_per_user=2)
    runner, url = await _serve(settings)
    async with aiohttp.ClientSession() as session:
        ids = [await _run_sync(session, url, f"rank fusion question {n}") for n in range(3)]
        for _ in range(100):  # retention runs beside the job, just after it ends
            async with session.get(f"{url}/api/reports", headers=ALICE) as response:
                listed = [entry["id"] for entry in (await response.json())["reports"]]
            if len(listed) == 2:
                break
            await asyncio.sleep(0.02)
        assert listed == [ids[2], ids[1]]
        assert not (settings.reports_dir / f"{ids[0]}.md").exists()
    await runner.cleanup()

    record = settings.jobs_dir / f"{ids[1]}.job.jsonl"
    saved = json.loads(record.read_text().splitlines()[-1])["job"]
    with record.open("a") as file:  # a later state line wins
        file.write(json.dumps({"job": {**saved, "created_at": time.time() - 40 * 86400}}) + "\n")
    runner, url = await _serve(make_settings(tmp_path, fakes, **{**_overrides(settings), "report_retention_days": 30}))
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{url}/api/reports", headers=ALICE) as response:
                entries = (await response.json())["reports"]
            assert [entry["id"] for entry in entries] == [ids[2]]  # ids[1] was 40 days old
            assert entries[0]["question"] == "rank fusion question 2" and "## References" in entries[0]["answer"]
            assert not (settings.reports_dir / f"{ids[1]}.json").exists()
            async with session.get(f"{url}/api/jobs/{ids[2]}", headers=ALICE) as response:
                job = await response.json()
            assert job["status"] == "completed" and job["frames"] > 5 and "## References" in job["report"]
            async with websockets.connect(url.replace("http", "ws") + "/ws", additional_headers=ALICE) as ws:
                await ws.send("resume " + json.dumps({"research_id": ids[2]}))
                replayed = [json.loads(await ws.recv()) for _ in range(job["frames"])]
            assert replayed[0]["metadata"]["research_id"] == ids[2] and replayed[-1]["type"] == "path"
    finally:
        await runner.cleanup()


def _overrides(settings: Settings) -> dict[str, Any]:
    return {
        "data_dir": settings.data_dir,
        "internal_api_base_url": settings.upstream(InternalApiSettings).internal_api_base_url,
        "api_keys": KEYS,
        "report_max_per_user": 2,
        "embeddings": False,
    }


async def test_ids_a_client_chooses_are_each_users_own(tmp_path, fakes, start_server):
    """GPT-Researcher's page saves its history under ids it chooses (`temp_id` when it has none):
    one user's id locked every other user out of it (404), and 404 against 200 told whether another
    user held an id. Each user now has the id to themselves, and another's reads as never made."""
    server = await start_server(job_settings(tmp_path, fakes))
    async with aiohttp.ClientSession() as session:

        async def call(method: str, path: str, who: dict[str, str], body: Any = None) -> tuple[int, Any]:
            async with session.request(method, f"{server.url}{path}", json=body, headers=who) as response:
                return response.status, await response.json()

        for who, answer in ((ALICE, "alice's answer"), (BOB, "bob's answer")):
            assert await call("POST", "/api/reports", who, {"question": "q?", "answer": answer}) == (
                200,
                {"success": True, "id": "temp_id"},
            )
        status, body = await call("GET", "/api/reports/temp_id", ALICE)
        assert status == 200 and body["report"]["id"] == "temp_id" and body["report"]["answer"] == "alice's answer"
        status, body = await call("GET", "/api/reports/temp_id", BOB)
        assert status == 200 and body["report"]["answer"] == "bob's answer"

        await call("POST", "/api/reports", ALICE, {"id": "alice-only", "question": "q?", "answer": "a."})
        held = [await call(method, "/api/reports/alice-only", BOB) for method in ("GET", "DELETE")]
        never = [await call(method, "/api/reports/nobody-made-this", BOB) for method in ("GET", "DELETE")]
        assert held == never and {status for status, _ in held} == {404}
        assert (await call("PUT", "/api/reports/alice-only", BOB, {"answer": "x"}))[0] == 404
        assert (await call("POST", "/api/reports/alice-only/chat", BOB, {"role": "user", "content": "x"}))[0] == 404
        status, body = await call("GET", "/api/reports/alice-only", ALICE)
        assert status == 200 and body["report"]["answer"] == "a." and body["report"]["chatMessages"] == []
        status, body = await call("GET", "/api/reports", BOB)
        assert [entry["id"] for entry in body["reports"]] == ["temp_id"]
        status, body = await call("GET", "/api/jobs", ALICE)
        assert sorted(job["research_id"] for job in body["jobs"]) == ["alice-only", "temp_id"]
        big = {"role": "user", "content": "x" * 200_000}
        status, body = await call("POST", "/api/reports/alice-only/chat", ALICE, big)
        assert status == 413 and "128 KB" in body["detail"]
        assert (await call("DELETE", "/api/reports/temp_id", ALICE))[0] == 200
        assert (await call("GET", "/api/reports/temp_id", BOB))[1]["report"]["answer"] == "bob's answer"


async def test_gpt_researcher_report_store_crud_and_chat(tmp_path, fakes, start_server):
    server = await start_server(job_settings(tmp_path, fakes))
    async with aiohttp.ClientSession() as session:
        research_id = await _run_sync(session, server.url, TASK["task"])
        entry = {"id": "page-1", "question": "q?", "answer": "a.", "orderedData": [{"type": "logs"}], "timestamp": 5}
        async with session.post(f"{server.url}/api/reports", json=entry, headers=ALICE) as response:
            assert await response.json() == {"success": True, "id": "page-1"}
        claimed = {**entry, "id": "f" * 32}  # shaped as a research id: only the server gives those out
        async with session.post(f"{server.url}/api/reports", json=claimed, headers=ALICE) as response:
            assert response.status == 404
        async with session.put(f"{server.url}/api/reports/page-1", json={"answer": "b."}, headers=ALICE) as response:
            assert await response.json() == {"success": True, "id": "page-1"}
        message = {"role": "user", "content": "hi", "timestamp": 7}
        async with session.post(f"{server.url}/api/reports/page-1/chat", json=message, headers=ALICE) as response:
            assert response.status == 200
        async with session.get(f"{server.url}/api/reports/page-1", headers=ALICE) as response:
            saved = (await response.json())["report"]
        assert set(saved) == {"id", "question", "answer", "orderedData", "chatMessages", "timestamp"}
        assert (saved["answer"], saved["orderedData"], saved["chatMessages"]) == ("b.", [{"type": "logs"}], [message])
        async with session.get(f"{server.url}/api/reports?report_ids=page-1,{research_id}", headers=ALICE) as response:
            assert [r["id"] for r in (await response.json())["reports"]] == ["page-1", research_id]

        async with session.get(f"{server.url}/api/jobs", headers=ALICE) as response:
            listed = {job["research_id"]: job for job in (await response.json())["jobs"]}
        assert listed[research_id]["status"] == "completed" and listed["page-1"]["origin"] == "client"
        async with session.get(f"{server.url}/api/jobs", headers=BOB) as response:
            assert (await response.json())["jobs"] == []
        async with session.post(f"{server.url}/api/chat", json=_chat(research_id), headers=ALICE) as response:
            reply = (await response.json())["response"]
        assert reply["role"] == "assistant" and re.search(r"\[\d+\]", reply["content"]) and reply["timestamp"] > 0
        async with session.get(f"{server.url}/api/jobs/{research_id}", headers=ALICE) as response:
            text = (await response.json())["report"]
        as_gptr = {"report": text, "messages": [{"role": "user", "content": "rank fusion"}]}  # its text, no id
        async with session.post(f"{server.url}/api/chat", json=as_gptr, headers=BOB) as response:
            assert re.search(r"\[\d+\]", (await response.json())["response"]["content"])
        async with session.post(f"{server.url}/api/chat", json={"report": "x"}, headers=ALICE) as response:
            assert response.status == 400

        async with session.delete(f"{server.url}/api/reports/{research_id}", headers=ALICE) as response:
            assert await response.json() == {"success": True}
        async with session.get(f"{server.url}/api/jobs/{research_id}", headers=ALICE) as response:
            assert response.status == 404
        async with session.delete(f"{server.url}/api/reports/{research_id}", headers=ALICE) as response:
            assert response.status == 404 and await response.json() == {"detail": "Report not found"}
        assert not (server.app[SETTINGS].reports_dir / f"{research_id}.md").exists()


async def test_an_idle_server_still_expires_old_reports(tmp_path, fakes, start_server, monkeypatch):
    monkeypatch.setattr(tasks, "_SWEEP_EVERY_S", 0.05)
    server = await start_server(job_settings(tmp_path, fakes, report_retention_days=1))
    store = server.app[RUNTIME].jobs
    old, recent = "a" * 32, "b" * 32
    for research_id, age_days in ((old, 2), (recent, 0.5)):
        created = time.time() - age_days * 86400
        await store.create(Job(research_id, "alice", "q", created_at=created, status=JobStatus.running))
        await store.finish(research_id, JobStatus.completed)
    for _ in range(100):
        if await store.get(old) is None:
            break
        await asyncio.sleep(0.02)
    assert await store.get(old) is None and await store.get(recent) is not None


async def test_a_report_lives_in_its_jobs_file_and_every_worker_of_the_host_serves_it(tmp_path, fakes, start_server):
    """One file a job, its report's record in it: a task writes no file to the reports directory
    (each file a task creates and retention deletes costs an inode, which ext4 without a journal
    pays for at the next allocations); the report is written there when first asked for, by any
    worker of the host, which read the same jobs folder."""
    settings = job_settings(tmp_path, fakes)
    server, sibling = await start_server(settings), await start_server(settings)
    task = {**TASK, "headers": {"retrievers": "tavily"}}
    async with websockets.connect(server.ws_url, additional_headers=ALICE) as ws:
        frames = await run_task(ws, task)
    files = frames[-1]["output"]
    research_id = Path(files["json"]).stem
    assert not settings.reports_dir.exists() or not list(settings.reports_dir.iterdir())
    assert [path.name for path in settings.jobs_dir.iterdir()] == [f"{research_id}.job.jsonl"]
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{server.url}/{files['md']}", headers=BOB) as response:
            assert response.status == 404  # not bob's: and nothing written on his request's behalf
        assert not settings.reports_dir.exists() or not list(settings.reports_dir.iterdir())
        async with session.get(f"{sibling.url}/{files['md']}", headers=BOB) as response:
            assert response.status == 404  # not bob's, on the worker that did not run it either
        assert not settings.reports_dir.exists() or not list(settings.reports_dir.iterdir())
        async with session.get(f"{sibling.url}/{files['md']}", headers=ALICE) as response:
            assert response.status == 200 and await response.text() == report_of(frames)
        async with session.get(f"{server.url}/{files['json']}", headers=ALICE) as response:
            record = json.loads(await response.read())
        assert record["owner"] == "alice" and record["report"] == report_of(frames)
        async with session.delete(f"{server.url}/api/reports/{research_id}", headers=ALICE) as response:
            assert response.status == 200
        async with session.get(f"{sibling.url}/{files['json']}", headers=ALICE) as response:
            assert response.status == 404
    assert not list(settings.reports_dir.iterdir()) and not list(settings.jobs_dir.iterdir())


async def test_a_report_s_files_are_named_after_its_question(tmp_path, fakes, start_server):
    """Saved, a report is `中文分词-和-bm25.pdf`, not its id: Content-Disposition names it after its
    question (RFC 6266's filename* for a name beyond ASCII), on /reports/ and GPT-Researcher's /report/."""
    server = await start_server(job_settings(tmp_path, fakes))
    names = {}
    async with aiohttp.ClientSession(headers=ALICE) as session:
        for question in ("中文分词 和 BM25?", TASK["task"]):
            body = {
                **TASK,
                "task": question,
                "headers": {"retrievers": "internal_biblio"},
                "generate_in_background": False,
            }
            async with session.post(f"{server.url}/report/", json=body) as response:
                research_id = (await response.json())["research_id"]
            for kind in ("pdf", "md"):
                async with session.get(f"{server.url}/reports/{research_id}.{kind}") as response:
                    assert response.status == 200
                    names[question, kind] = response.headers["Content-Disposition"]
            async with session.get(f"{server.url}/report/{research_id}") as response:
                assert response.status == 200
                names[question, "report/"] = response.headers["Content-Disposition"]
    chinese = quote("中文分词-和-bm25")
    assert names["中文分词 和 BM25?", "pdf"] == f"attachment; filename=\"report.pdf\"; filename*=UTF-8''{chinese}.pdf"
    assert names["中文分词 和 BM25?", "md"] == f"inline; filename=\"report.md\"; filename*=UTF-8''{chinese}.md"
    assert names["中文分词 和 BM25?", "report/"].endswith(f"filename*=UTF-8''{chinese}.docx")
    english = "how-does-rank-fusion-combine-lexical-and-dense-retrieval"
    assert names[TASK["task"], "pdf"] == f'attachment; filename="{english}.pdf"'
    assert names[TASK["task"], "md"] == f'inline; filename="{english}.md"'  # shown in a browser, saved so named
    assert names[TASK["task"], "report/"] == f'attachment; filename="{english}.docx"'
