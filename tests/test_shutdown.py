"""SIGTERM on a real server process: clients are told, sockets close with 1001, the process exits."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import websockets

from tests.fakes import FakeTavily

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def test_sigterm_tells_clients_and_exits(tmp_path, fakes):
    fakes["tavily"].behaviour.delay_s = 30
    port = free_port()
    env = {
        **os.environ,
        "FEDRESEARCH_DATA_DIR": str(tmp_path),
        "FEDRESEARCH_PORT": str(port),
        "TAVILY_API_KEY": FakeTavily.api_key,
        "TAVILY_API_BASE_URL": fakes["tavily"].url,
        "FEDRESEARCH_EMBEDDINGS": "false",
        "FEDRESEARCH_API_KEYS": "",
        "RETRIEVER_TIMEOUT_S": "60",
        "TASK_TIMEOUT_S": "60",
    }
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
        async with websockets.connect(f"ws://127.0.0.1:{port}/ws") as ws:
            await ws.send("start " + json.dumps({"task": "slow", "headers": {"retrievers": "tavily"}}))
            while not fakes["tavily"].requests:
                await asyncio.sleep(0.05)
            server.send_signal(signal.SIGTERM)
            stopped = time.monotonic()
            frames = []
            try:
                while True:
                    frames.append(json.loads(await ws.recv()))
            except websockets.ConnectionClosed as closed:
                code = closed.rcvd.code if closed.rcvd else None
        assert code == 1001
        assert any(f.get("type") == "error" and "shutting down" in f["output"] for f in frames)
        assert await asyncio.to_thread(server.wait, 15) == 0
        assert time.monotonic() - stopped < 12
        for _ in range(100):  # the task's upstream call was cancelled, not left running
            if fakes["tavily"].cancelled:
                break
            await asyncio.sleep(0.05)
        assert fakes["tavily"].cancelled == 1
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()
