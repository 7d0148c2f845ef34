"""End to end over /ws with the websockets client, against fake upstreams on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json

import websockets

from fedresearch.jobs.frames import PathFrame
from fedresearch.web.research_socket import ResearchSocket
from tests.conftest import error_of, logs, make_settings, report_of, run_task

TASK = {"task": "How does rank fusion combine lexical and dense retrieval?", "report_type": "research_report"}


async def test_three_upstreams_run_in_parallel(tmp_path, fakes, start_server):
    fakes["tavily"].behaviour.delay_s = 0.2
    fakes["google"].behaviour.delay_s = 0.3
    fakes["internal"].behaviour.delay_s = 0.4
    settings = make_settings(tmp_path, fakes, internal_api_base_url=fakes["internal"].url)
    server = await start_server(settings)
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(
            ws, {**TASK, "headers": {"retrievers": "internal_biblio,tavily,google", "user_id": "alice"}}
        )
    done = {frame["metadata"]["name"]: frame["metadata"] for frame in logs(frames, "retriever_done")}
    assert set(done) == {"internal_biblio", "tavily", "google"}
    retrieval_ms = logs(frames, "merging")[0]["metadata"]["retrieval_ms"]
    # sequential would take the 900 ms sum; parallel takes about the slowest (400 ms)
    assert 400 <= retrieval_ms < 750, retrieval_ms
    report = report_of(frames)
    assert "## References" in report
    assert "https://doi.org/10.1000/lab.1" in report  # the internal API's DOI became the link
    assert fakes["internal"].requests[0]["body"] == {
        "type": "biblio",
        "user_id": "alice",
        "query": TASK["task"],
        "top_k": 10,
    }
    assert fakes["internal"].requests[0]["headers"]["x-api-key"] == "internal-test-key"
    path = frames[-1]
    assert path["type"] == "path" and path["output"]["md"].endswith(".md")


async def test_failing_upstream_leaves_the_others(tmp_path, fakes, start_server):
    fakes["tavily"].behaviour.mode = "500"
    settings = make_settings(tmp_path, fakes, internal_api_base_url=fakes["internal"].url)
    server = await start_server(settings)
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(
            ws, {**TASK, "headers": {"retrievers": "internal_biblio,tavily,google", "user_id": "alice"}}
        )
    failed = logs(frames, "retriever_failed")
    assert [frame["metadata"]["name"] for frame in failed] == ["tavily"]
    assert "500" in failed[0]["metadata"]["error"]
    report = report_of(frames)
    assert "example.com/google" in report and "doi.org/10.1000/lab.1" in report
    assert "tavily: failed" in report
    assert frames[-1]["type"] == "path"


async def test_unknown_retriever_then_a_valid_task_on_the_same_socket(tmp_path, fakes, start_server):
    server = await start_server(make_settings(tmp_path, fakes, internal_api_base_url=fakes["internal"].url))
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(ws, {**TASK, "headers": {"retrievers": "tavily,bing", "user_id": "u"}})
        assert error_of(frames)["type"] == "error"
        message = error_of(frames)["output"]
        assert "'bing'" in message
        for known in ("internal_biblio", "internal_highlight", "internal_file", "tavily", "google"):
            assert known in message
        twin = frames[frames.index(error_of(frames)) + 1]
        research_id = twin["metadata"]["research_id"]  # the job it was, failed: listed and readable
        assert twin == {
            "type": "logs",
            "content": "error",
            "output": message,
            "metadata": {"then": "report", "research_id": research_id, "kind": "bad_request"},
        }
        # it ends as a finished task does on GPT-Researcher's page: a short report saying why, then path
        assert frames[-1]["type"] == "path" and "could not run" in report_of(frames) and "'bing'" in report_of(frames)
        frames = await run_task(ws, {**TASK, "headers": {"retrievers": "tavily", "user_id": "u"}})
        assert frames[-1]["type"] == "path"
        assert "example.org/tavily/1" in report_of(frames)


async def test_missing_user_id_names_the_setting_and_the_default_user_works(tmp_path, fakes, start_server):
    fakes["internal"].behaviour.mode = "ok"
    base = {"internal_api_base_url": fakes["internal"].url}
    server = await start_server(make_settings(tmp_path, fakes, **base))
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(ws, {**TASK, "headers": {"retrievers": "internal_biblio"}})
    message = error_of(frames)["output"]
    assert error_of(frames)["type"] == "error"
    assert "user_id" in message and "FEDRESEARCH_DEFAULT_USER" in message

    server = await start_server(make_settings(tmp_path, fakes, default_user="solo", **base))
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(ws, {**TASK, "headers": {"retrievers": "internal_biblio"}})
    assert frames[-1]["type"] == "path"
    assert fakes["internal"].requests[-1]["body"]["user_id"] == "solo"


async def test_closing_the_socket_cancels_upstream_calls(tmp_path, fakes, start_server):
    fakes["tavily"].behaviour.delay_s = 5
    fakes["google"].behaviour.delay_s = 5
    server = await start_server(make_settings(tmp_path, fakes))
    baseline = len(asyncio.all_tasks())
    async with websockets.connect(server.ws_url) as ws:
        await ws.send("start " + json.dumps({**TASK, "headers": {"retrievers": "tavily,google"}}))
        while len(fakes["tavily"].requests) + len(fakes["google"].requests) < 2:
            await asyncio.sleep(0.02)
    for _ in range(200):
        if fakes["tavily"].cancelled and fakes["google"].cancelled:
            break
        await asyncio.sleep(0.02)
    assert fakes["tavily"].cancelled == 1 and fakes["google"].cancelled == 1
    for _ in range(100):
        if len(asyncio.all_tasks()) <= baseline:
            break
        await asyncio.sleep(0.02)
    assert len(asyncio.all_tasks()) <= baseline


async def test_protocol_ping_bare_json_second_start_and_bad_frames(tmp_path, fakes, start_server):
    fakes["tavily"].behaviour.delay_s = 0.5
    server = await start_server(make_settings(tmp_path, fakes))
    async with websockets.connect(server.ws_url) as ws:
        await ws.send("ping")
        assert await ws.recv() == "pong"
        await ws.send("start {not json")
        frame = json.loads(await ws.recv())
        assert frame["type"] == "error" and "invalid JSON" in frame["output"]
        assert json.loads(await ws.recv())["type"] == "logs"
        await ws.send(json.dumps({"report_type": "research_report"}))
        frame = json.loads(await ws.recv())
        assert frame["type"] == "error" and "task: missing" in frame["output"]
        await ws.recv()
        await ws.send("hello")
        assert "Unknown command" in json.loads(await ws.recv())["output"]
        await ws.recv()

        await ws.send(json.dumps({**TASK, "headers": {"retrievers": "tavily"}}))  # bare JSON
        await ws.send("start " + json.dumps({**TASK, "headers": {"retrievers": "tavily"}}))
        frames = []
        while not frames or frames[-1].get("type") != "path":
            frames.append(json.loads(await ws.recv()))
        warnings = logs(frames, "warning")
        assert warnings and warnings[0]["output"] == "Task already running. Please wait."
        assert len(fakes["tavily"].requests) == 1


async def test_the_next_task_is_taken_while_paths_send_is_still_waiting(tmp_path, fakes, start_server, monkeypatch):
    """`path`'s bytes go out before its send waits for a full buffer to drain; a client that reads
    it and sends its next task before that wait resumes must not be told "Task already running"."""
    sending = ResearchSocket.send

    async def path_resumes_late(self, frame):
        await sending(self, frame)
        if isinstance(frame, PathFrame):
            await asyncio.sleep(0.5)  # as when the send buffer was full: the coroutine resumes after the reader read

    monkeypatch.setattr(ResearchSocket, "send", path_resumes_late)
    server = await start_server(make_settings(tmp_path, fakes))
    task = {**TASK, "headers": {"retrievers": "tavily"}}
    async with websockets.connect(server.ws_url) as ws:
        for _ in range(3):
            await ws.send("start " + json.dumps(task))
            frames = [json.loads(await asyncio.wait_for(ws.recv(), 10))]
            while frames[-1].get("type") != "path" and frames[-1].get("content") != "warning":
                frames.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
            assert not logs(frames, "warning") and "tavily" in report_of(frames)
        await ws.send("chat " + json.dumps({"message": "what did the sources say about fusion?"}))
        answer = json.loads(await ws.recv())
        assert answer["type"] == "chat" and "Ask a research question first" not in answer["content"]


async def test_saved_report_files_are_served(tmp_path, fakes, start_server):
    server = await start_server(make_settings(tmp_path, fakes))
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(ws, {**TASK, "headers": {"retrievers": "tavily,google"}})
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async with session.get(f"{server.url}/{frames[-1]['output']['md']}") as response:
            assert response.status == 200
            assert await response.text() == report_of(frames)
        async with session.get(f"{server.url}/{frames[-1]['output']['json']}") as response:
            record = await response.json(content_type=None)
        async with session.get(f"{server.url}/reports/..%2Fsecrets.md") as response:
            assert response.status == 404
    assert record["question"] == TASK["task"]
    assert {r["name"] for r in record["retrievers"]} == {"tavily", "google"}
    assert all("elapsed_ms" in r for r in record["retrievers"])
    assert all(source["retrievers"] for source in record["sources"])


async def test_the_nextjs_apps_multi_agents_report_is_served_as_a_detailed_one_and_says_so(
    tmp_path, fakes, start_server
):
    """GPT-Researcher's NextJS app sends report_type multi_agents and stops its spinner only on `path`."""
    server = await start_server(make_settings(tmp_path, fakes))
    task = {**TASK, "report_type": "multi_agents", "headers": {"retrievers": "tavily"}}
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(ws, task)
    assert frames[-1]["type"] == "path" and not [frame for frame in frames if frame["type"] == "error"]
    (note,) = [frame for frame in logs(frames, "warning") if "multi_agents" in frame["output"]]
    assert "served as a detailed report" in note["output"]
    assert logs(frames, "planning")  # sub-questions, as a detailed report plans them


async def test_an_unknown_report_type_gets_an_error_listing_the_known_ones_and_still_ends_with_path(
    tmp_path, fakes, start_server
):
    server = await start_server(make_settings(tmp_path, fakes))
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(ws, {**TASK, "report_type": "poem", "headers": {"retrievers": "tavily"}})
        message = error_of(frames)["output"]
        assert "unknown report_type 'poem'" in message
        for known in ("research_report", "detailed_report", "deep", "outline_report", "multi_agents"):
            assert known in message
        assert frames[-1]["type"] == "path" and "poem" in report_of(frames)
        frames = await run_task(ws, {**TASK, "headers": {"retrievers": "tavily"}})  # the socket goes on
        assert frames[-1]["type"] == "path" and not [f for f in frames if f["type"] == "error"]


async def test_custom_prompt_and_subtopic_fields_are_read_from_the_start_frame(tmp_path, fakes, start_server):
    server = await start_server(make_settings(tmp_path, fakes))
    task = {**TASK, "report_type": "custom_report", "custom_prompt": "Answer as a table, in bullet points."}
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(ws, {**task, "headers": {"retrievers": "tavily"}})
        (notice,) = [f for f in logs(frames, "warning") if "custom prompt" in f["output"]]
        assert "a table" in notice["output"] and notice["metadata"]["custom_prompt_unmet"] == ["a table"]
        assert "could not follow this part of the custom prompt: a table" in report_of(frames)
        subtopic = {**TASK, "report_type": "subtopic_report", "parent_query": "Search engines", "existing_headers": []}
        frames = await run_task(ws, {**subtopic, "headers": {"retrievers": "tavily"}})
        assert "A subtopic of “Search engines”." in report_of(frames) and frames[-1]["type"] == "path"


async def test_deep_research_reports_each_levels_progress(tmp_path, fakes, start_server):
    server = await start_server(make_settings(tmp_path, fakes, deep_research_breadth=2, deep_research_depth=2))
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(ws, {**TASK, "report_type": "deep", "headers": {"retrievers": "tavily,google"}})
    levels = [f["metadata"] for f in logs(frames, "planning") if "depth" in (f.get("metadata") or {})]
    assert [level["depth"] for level in levels] == [1, 2], levels
    assert all(level["total_depth"] == 2 for level in levels)
    assert frames[-1]["type"] == "path"
