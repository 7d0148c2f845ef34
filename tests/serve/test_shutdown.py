"""SIGTERM on a real server process: running tasks finish, for SHUTDOWN_GRACE_S at most, while no new
one is taken; clients are told of a task stopped after that; sockets close with 1001; the process
exits."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import websockets

from fedresearch.web.keys import STOPPING
from tests.conftest import error_of, make_settings, run_task
from tests.fakes.tavily import FakeTavily

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def server_env(tmp_path: Path, fakes: dict[str, Any], port: int, grace_s: float) -> dict[str, str]:
    return {
        **os.environ,
        "FEDRESEARCH_DATA_DIR": str(tmp_path),
        "FEDRESEARCH_PORT": str(port),
        "TAVILY_API_KEY": FakeTavily.api_key,
        "TAVILY_API_BASE_URL": fakes["tavily"].url,
        "FEDRESEARCH_EMBEDDINGS": "false",
        "FEDRESEARCH_API_KEYS": "",
        "RETRIEVER_TIMEOUT_S": "60",
        "TASK_TIMEOUT_S": "60",
        "SHUTDOWN_GRACE_S": str(grace_s),
    }


@contextlib.asynccontextmanager
async def serving(
    tmp_path: Path, fakes: dict[str, Any], grace_s: float
) -> AsyncIterator[tuple[subprocess.Popen[bytes], int]]:
    """`python server.py` with SHUTDOWN_GRACE_S = `grace_s`, and its port, once it answers; killed
    after the block should it still run."""
    port = free_port()
    env = server_env(tmp_path, fakes, port, grace_s)
    server = subprocess.Popen([sys.executable, "server.py"], cwd=ROOT, env=env, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "server did not start"
                await asyncio.sleep(0.1)
        yield server, port
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()


async def until_closed(ws: websockets.ClientConnection) -> tuple[list[dict[str, Any]], int | None]:
    """Every frame `ws` gets until it closes, and the close code."""
    frames = []
    try:
        while True:
            frames.append(json.loads(await ws.recv()))
    except websockets.ConnectionClosed as closed:
        return frames, closed.rcvd.code if closed.rcvd else None


@pytest.mark.parametrize(
    ("grace_s", "stops"),
    [(1, [signal.SIGTERM]), (30, [signal.SIGINT, signal.SIGINT])],
    ids=["grace-over", "SIGINT-twice"],
)
async def test_a_task_stopped_at_shutdown_tells_its_client(tmp_path, fakes, grace_s, stops):
    """A task still running when the grace is over is stopped, its client told, its upstream call
    cancelled, and the process exits. Ctrl-C twice does so at once: the first lets the running tasks
    finish, the second stops them (aiohttp ended the process mid-drain instead, its clients told
    nothing)."""
    fakes["tavily"].behaviour.delay_s = 30
    async with serving(tmp_path, fakes, grace_s=grace_s) as (server, port):
        async with websockets.connect(f"ws://127.0.0.1:{port}/ws") as ws:
            await ws.send("start " + json.dumps({"task": "slow", "headers": {"retrievers": "tavily"}}))
            await fakes["tavily"].asked()
            server.send_signal(stops[0])
            for again in stops[1:]:
                await asyncio.sleep(1.0)
                assert server.poll() is None  # the task may still finish
                server.send_signal(again)
            stopped = time.monotonic()
            frames, code = await until_closed(ws)
        assert code == 1001
        assert any(f.get("type") == "error" and "shutting down" in f["output"] for f in frames)
        assert await asyncio.to_thread(server.wait, 15) == 0
        assert time.monotonic() - stopped < 12
        for _ in range(100):  # the task's upstream call was cancelled, not left running
            if fakes["tavily"].cancelled:
                break
            await asyncio.sleep(0.05)
        assert fakes["tavily"].cancelled == 1
        assert server.stderr is not None
        log = server.stderr.read().decode()
        assert "1 of 1 tasks still running after 1 s: stopped" in log, log
        assert ("SIGINT again: stopping the running tasks now" in log) == (len(stops) > 1)


@pytest.mark.parametrize(
    "stops",
    [[signal.SIGTERM], [signal.SIGHUP], [signal.SIGTERM, signal.SIGTERM]],
    ids=["SIGTERM", "SIGHUP", "SIGTERM-twice"],
)
async def test_sigterm_lets_running_tasks_finish_and_takes_no_new_ones(tmp_path, fakes, stops):
    """A deploy stops a server with tasks running: each goes on to its report and `path`, on its own
    socket, while an idle socket is closed at once (its client reconnects to a server that stays)
    and the port takes no new connection. SIGHUP (`systemctl reload`, a closed terminal), which
    ended one process at once, stops it so too: only a supervisor can replace its workers. SIGTERM
    twice (systemd and `pkill` signal every process of a service, and a supervisor its workers too)
    changes nothing: the second ended the process mid-drain, its task cut without a word. The busy
    client pings every second, as the websockets library does every 20 s: the server stopped
    reading every connection before it waited for the task, so the pongs never came and the client
    dropped the socket of a task still finishing."""
    fakes["tavily"].behaviour.delay_s = 6  # the idle socket closes long before the task ends
    async with serving(tmp_path, fakes, grace_s=30) as (server, port):
        url = f"ws://127.0.0.1:{port}/ws"
        keepalive = {"ping_interval": 1.0, "ping_timeout": 1.0}
        async with websockets.connect(url, **keepalive) as busy, websockets.connect(url) as idle:
            for ws in (busy, idle):
                await ws.send("ping")
                assert await ws.recv() == "pong"
            await busy.send("start " + json.dumps({"task": "rank fusion", "headers": {"retrievers": "tavily"}}))
            await fakes["tavily"].asked()
            server.send_signal(stops[0])
            stopped = time.monotonic()
            frames, code = await until_closed(idle)
            for again in stops[1:]:
                server.send_signal(again)
            assert (frames, code) == ([], 1001)
            assert time.monotonic() - stopped < 4, "the idle socket waited for the running task"
            with pytest.raises(OSError):  # the port is closed: a balancer sends the next task elsewhere
                await websockets.connect(url, open_timeout=2)
            frames, code = await until_closed(busy)
        kinds = [frame["type"] for frame in frames]
        assert "error" not in kinds and kinds[-1] == "path", kinds
        report = "".join(frame["output"] for frame in frames if frame["type"] == "report")
        assert "[1]" in report and fakes["tavily"].cancelled == 0
        assert code == 1001
        assert await asyncio.to_thread(server.wait, 15) == 0
        assert time.monotonic() - stopped < 20
        assert server.stderr is not None
        log = server.stderr.read().decode()
        assert "no new tasks; 1 running may finish, for 30 s at most (SHUTDOWN_GRACE_S)" in log
        assert "the 1 running tasks finished" in log
        assert ("SIGHUP received: one process cannot replace itself" in log) == (stops[0] == signal.SIGHUP)
        assert ("SIGTERM again: already stopping" in log) == (len(stops) > 1)


async def test_a_stopping_server_refuses_new_tasks_with_503(tmp_path, fakes, start_server):
    """Between SIGTERM and its exit a server may still read a task (a request under way): it refuses
    it, saying why, with 503 over REST, so that a client or balancer sends it to another server."""
    server = await start_server(make_settings(tmp_path, fakes))
    server.app[STOPPING].begin()
    task = {"task": "rank fusion", "headers": {"retrievers": "tavily"}}
    async with aiohttp.ClientSession() as session, session.post(f"{server.url}/report/", json=task) as response:
        assert response.status == 503
        assert "stopping" in (await response.json())["error"]
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(ws, task)
    assert "takes no new tasks" in error_of(frames)["output"] and frames[-1]["type"] == "path"
    assert not fakes["tavily"].requests


async def test_sigterm_lets_a_chat_answer_on_its_way_arrive(tmp_path, fakes):
    """A chat about a report that searches again (the report does not cover the question) is under
    way when the server is told to stop: its answer arrives, then 1001."""
    async with serving(tmp_path, fakes, grace_s=30) as (server, port):
        async with websockets.connect(f"ws://127.0.0.1:{port}/ws") as ws:
            frames = await run_task(ws, {"task": "rank fusion", "headers": {"retrievers": "tavily"}})
            assert frames[-1]["type"] == "path"
            fakes["tavily"].behaviour.delay_s = 3
            await ws.send("chat " + json.dumps({"message": "zebra migration patterns in the serengeti"}))
            while len(fakes["tavily"].requests) < 2:
                await asyncio.sleep(0.05)
            server.send_signal(signal.SIGTERM)
            frames, code = await until_closed(ws)
        assert [frame["type"] for frame in frames] == ["chat"] and code == 1001
        assert frames[0]["metadata"]["searched"] is True
        assert await asyncio.to_thread(server.wait, 15) == 0
