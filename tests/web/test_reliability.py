"""Issue 16: attacks found against a running server, each reproduced here before its fix."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket

import aiohttp
import websockets

from fedresearch.web.keys import RUNTIME
from tests.conftest import make_settings, run_task
from tests.federation.test_faults import outcome

TASK = {"task": "How does rank fusion combine lexical and dense retrieval?", "report_type": "research_report"}


async def _active_tasks(url: str) -> float:
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as response:
        text = await response.text()
    match = re.search(r"^fedresearch_active_tasks (\S+)$", text, re.MULTILINE)
    assert match, text
    return float(match.group(1))


async def test_start_then_close_at_once_never_leaks_a_task_slot(tmp_path, fakes, start_server):
    settings = make_settings(tmp_path, fakes, max_tasks_per_key=2)
    server = await start_server(settings)
    task = {**TASK, "headers": {"retrievers": "tavily,google"}}
    for _ in range(3):
        await asyncio.gather(*(_start_and_close(server.ws_url, task) for _ in range(4)))
    for _ in range(200):
        if not +server.app[RUNTIME].running and await _active_tasks(server.url) == 0:
            break
        await asyncio.sleep(0.02)
    assert sum(server.app[RUNTIME].running.values()) == 0, server.app[RUNTIME].running
    assert await _active_tasks(server.url) == 0
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(ws, task)
    assert frames[-1]["type"] == "path", frames[-2:]


async def _start_and_close(url: str, task: dict[str, object]) -> None:
    async with websockets.connect(url) as ws:
        await ws.send("start " + json.dumps(task))


async def _ask(server, question: str, headers: dict[str, str]) -> list[dict[str, object]]:
    async with websockets.connect(server.ws_url) as ws:
        return await run_task(ws, {"task": question, "headers": headers})


async def test_questions_tavily_rejects_never_suspend_it_for_others(tmp_path, fakes, start_server):
    settings = make_settings(tmp_path, fakes, retry_attempts=0, breaker_error_threshold=2)
    server = await start_server(settings)
    for attempt in range(4):
        step, metadata = outcome(await _ask(server, f"{attempt} " + "why " * 150, {"retrievers": "tavily"}), "tavily")
        assert step == "retriever_failed" and "400" in str(metadata["error"]), metadata
    assert outcome(await _ask(server, "rank fusion", {"retrievers": "tavily"}), "tavily")[0] == "retriever_done"


async def test_questions_an_upstream_answers_500_suspend_it_only_for_whoever_asks_them(tmp_path, fakes, start_server):
    """Round three's attack: three questions Tavily answers with 500 (with the operator's key), from
    one user, suspended it for 30 s for every user. They now suspend it for that user alone; a run of
    errors seen by BREAKER_ERROR_ASKERS different users still suspends it for everyone."""
    fakes["tavily"].behaviour.failing_queries = ("poison",)
    keys = "alice-key:alice,bob-key:bob,carol-key:carol,dave-key:dave"
    server = await start_server(make_settings(tmp_path, fakes, retry_attempts=0, api_keys=keys))

    async def ask(token: str, question: str) -> tuple[str, dict[str, object]]:
        async with websockets.connect(f"{server.ws_url}?token={token}") as ws:
            frames = await run_task(ws, {"task": question, "headers": {"retrievers": "tavily"}})
        return outcome(frames, "tavily")

    for number in range(3):
        assert (await ask("alice-key", f"poison {number}"))[0] == "retriever_failed"
    step, metadata = await ask("alice-key", "rank fusion")
    assert step == "retriever_skipped" and "suspended" in str(metadata["error"])  # alice's own run of errors
    sent = len(fakes["tavily"].requests)
    assert (await ask("bob-key", "rank fusion"))[0] == "retriever_done"  # never suspended for bob
    assert len(fakes["tavily"].requests) == sent + 1

    fakes["tavily"].behaviour.mode = "500"  # now the upstream itself is down
    for token in ("bob-key", "bob-key", "carol-key"):
        assert (await ask(token, "rank fusion again"))[0] == "retriever_failed"
    sent = len(fakes["tavily"].requests)
    step, metadata = await ask("dave-key", "rank fusion")  # two users saw the run: suspended for all
    assert step == "retriever_skipped" and "suspended" in str(metadata["error"])
    assert len(fakes["tavily"].requests) == sent


async def test_a_dead_client_supplied_base_url_never_suspends_the_library_for_others(tmp_path, start_server):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    settings = make_settings(
        tmp_path, retry_attempts=0, breaker_error_threshold=2, internal_api_allowed_hosts=["127.0.0.1"]
    )
    server = await start_server(settings)
    headers = {"retrievers": "internal_biblio", "user_id": "alice"}
    for _ in range(2):
        frames = await _ask(server, "rank fusion", {**headers, "internal_api_base_url": dead})
        assert outcome(frames, "internal_biblio")[0] == "retriever_failed"
    # the dead URL is its own circuit: it is suspended, the embedded library is not
    skipped = await _ask(server, "rank fusion", {**headers, "internal_api_base_url": dead})
    assert outcome(skipped, "internal_biblio")[0] == "retriever_skipped"
    assert outcome(await _ask(server, "rank fusion", headers), "internal_biblio")[0] == "retriever_done"


KEYS = "admin-key:*,alice-key:alice,bob-key:bob"


async def test_a_saved_report_is_read_only_by_its_owner_and_admins(tmp_path, fakes, start_server):
    server = await start_server(make_settings(tmp_path, fakes, api_keys=KEYS))
    async with websockets.connect(server.ws_url + "?token=alice-key") as ws:
        frames = await run_task(ws, {**TASK, "headers": {"retrievers": "tavily"}})
    files = frames[-1]["output"]
    async with aiohttp.ClientSession() as session:

        async def status_of(name: str, key: str) -> int:
            headers = {"Authorization": f"Bearer {key}"}
            async with session.get(f"{server.url}/{name}", headers=headers) as response:
                return response.status

        for name in (files["md"], files["json"]):
            assert await status_of(name, "bob-key") == 404  # not 403: another user's ids are not confirmed
            assert await status_of(name, "alice-key") == 200
            assert await status_of(name, "admin-key") == 200
        async with session.get(f"{server.url}/{files['json']}", headers={"Authorization": "Bearer alice-key"}) as r:
            assert (await r.json(content_type=None))["owner"] == "alice"


async def test_keys_sent_in_the_query_never_reach_the_access_log(tmp_path, fakes, caplog):
    from aiohttp import web

    from fedresearch.web.access_log import RedactingAccessLogger
    from fedresearch.web.app import create_app

    runner = web.AppRunner(
        create_app(make_settings(tmp_path, fakes, api_keys=KEYS)), access_log_class=RedactingAccessLogger
    )
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    try:
        with caplog.at_level(logging.INFO, logger="aiohttp.access"):
            async with websockets.connect(url.replace("http", "ws") + "/ws?token=alice-key"):
                pass
            async with aiohttp.ClientSession() as session:
                query = "?x=1&api_key=admin-key&X-Api-Key=bob-key"
                headers = {"Referer": url + "/?token=alice-key"}
                async with session.get(url + "/api/retrievers" + query, headers=headers) as response:
                    assert response.status == 401
    finally:
        await runner.cleanup()
    lines = [record.getMessage() for record in caplog.records if record.name == "aiohttp.access"]
    assert any("GET /ws?token=REDACTED" in line for line in lines), lines
    assert any("x=1&api_key=REDACTED&X-Api-Key=REDACTED" in line for line in lines), lines
    assert not any(key in line for line in lines for key in ("alice-key", "admin-key", "bob-key")), lines


async def _raw_get(url: str, path: str, header: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + header + b"\r\n\r\n")
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return answer


async def test_a_non_ascii_authorization_header_is_refused_not_a_server_error(tmp_path, fakes, start_server):
    server = await start_server(make_settings(tmp_path, fakes, api_keys=KEYS))
    for header in ("Bearer clé".encode(), b"Bearer \xff\xfe", "Bearer 鍵".encode()):
        answer = await _raw_get(server.url, "/api/retrievers", b"Authorization: " + header)
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]


async def test_a_deeply_nested_frame_gets_an_error_frame_and_the_socket_stays(tmp_path, fakes, start_server):
    server = await start_server(make_settings(tmp_path, fakes, max_frame_bytes=200_000))
    async with websockets.connect(server.ws_url) as ws:
        await ws.send("start " + "[" * 30_000 + "]" * 30_000)
        error = json.loads(await ws.recv())
        assert error["type"] == "error" and "nested too deeply" in error["output"], error
        await ws.recv()
        frames = await run_task(ws, {**TASK, "headers": {"retrievers": "tavily"}})
        assert frames[-1]["type"] == "path"


async def test_user_id_must_be_a_bounded_string_of_safe_characters(tmp_path, fakes, start_server):
    server = await start_server(make_settings(tmp_path, fakes))
    async with websockets.connect(server.ws_url) as ws:
        for bad in (7, ["alice"], True, "a" * 129, "alice/../bob", "al ice"):
            frames = await run_task(ws, {**TASK, "headers": {"retrievers": "tavily", "user_id": bad}})
            assert frames[-2]["type"] == "error" and "user_id must be" in frames[-2]["output"], (bad, frames[-2])
        frames = await run_task(ws, {**TASK, "headers": {"retrievers": "tavily", "user_id": "alice@lab.org"}})
        assert frames[-1]["type"] == "path"
    async with aiohttp.ClientSession() as session:
        for body in ({"user_id": 7, "query": "q"}, {"user_id": "alice", "query": "q" * 5000}):
            async with session.post(server.url + "/internal/biblios/vector_search/", json=body) as response:
                assert response.status == 400
                assert "user_id must be" in (text := await response.text()) or "MAX_TASK_CHARS" in text, text


async def test_a_key_an_upstream_echoes_in_its_error_never_reaches_a_frame(tmp_path, fakes, start_server, caplog):
    fakes["tavily"].behaviour.mode = "401"
    fakes["tavily"].behaviour.echo_credentials = True
    server = await start_server(make_settings(tmp_path, fakes, retry_attempts=0))
    with caplog.at_level(logging.DEBUG):
        frames = await _ask(server, "rank fusion", {"retrievers": "tavily"})
        personal = await _ask(server, "rank fusion", {"retrievers": "tavily", "tavily_api_key": "tvly-personal-key"})
    step, metadata = outcome(frames, "tavily")
    assert step == "retriever_failed" and "Unauthorized" in str(metadata["error"]) and "[REDACTED]" in str(metadata)
    for secret in ("tvly-test-key", "tvly-personal-key"):
        assert not any(secret in json.dumps(frame) for frame in frames + personal), secret
        server_logs = [record.getMessage() for record in caplog.records if not record.name.startswith("websockets")]
        assert not any(secret in line for line in server_logs), secret  # the client's own log shows what it sent
