"""Issue 16: attacks found against a running server, each reproduced here before its fix."""

from __future__ import annotations

import asyncio
import json
import re

import aiohttp
import websockets

from fedresearch.web.keys import RUNNING
from tests.conftest import make_settings, run_task

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
        if not +server.app[RUNNING] and await _active_tasks(server.url) == 0:
            break
        await asyncio.sleep(0.02)
    assert sum(server.app[RUNNING].values()) == 0, server.app[RUNNING]
    assert await _active_tasks(server.url) == 0
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(ws, task)
    assert frames[-1]["type"] == "path", frames[-2:]


async def _start_and_close(url: str, task: dict[str, object]) -> None:
    async with websockets.connect(url) as ws:
        await ws.send("start " + json.dumps(task))
