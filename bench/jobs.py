"""What running every task as a job costs: a task followed live over /ws, the same task detached,
dropped after its first frame and resumed on a new socket, and the replay of a finished job; then
the job store alone, every frame appended and read back by several followers.

    python -m bench.jobs [--runs 7] [--frames 20000]

The server runs in this process on 127.0.0.1 (a free port), with a fake Tavily answering in 50 ms;
every run asks a different question, so the upstream cache does not flatter the figures. Printed:
medians, and the ratios of each against the attached run, measured side by side in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path

import websockets
from aiohttp import web

from fedresearch.core.events import ProgressStep
from fedresearch.jobs.frames import LogsFrame
from fedresearch.jobs.local_store import LocalJobStore
from fedresearch.jobs.store import Job, JobStatus, follow
from fedresearch.web.app import create_app
from tests.conftest import make_settings
from tests.fakes.tavily import FakeTavily

UPSTREAM_S = 0.05


async def _until_path(ws: websockets.ClientConnection) -> int:
    count = 0
    while True:
        frame = json.loads(await ws.recv())
        count += 1
        if frame.get("type") == "path":
            return count


async def attached(url: str, task: dict[str, object]) -> float:
    started = time.perf_counter()
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send("start " + json.dumps(task))
        await _until_path(ws)
    return time.perf_counter() - started


async def detached_and_resumed(url: str, task: dict[str, object]) -> tuple[float, str]:
    started = time.perf_counter()
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send("start " + json.dumps({**task, "detach": True}))
        research_id = json.loads(await ws.recv())["metadata"]["research_id"]
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send("resume " + json.dumps({"research_id": research_id}))
        await _until_path(ws)
    return time.perf_counter() - started, research_id


async def replay(url: str, research_id: str) -> tuple[float, int]:
    started = time.perf_counter()
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send("resume " + json.dumps({"research_id": research_id}))
        frames = await _until_path(ws)
    return time.perf_counter() - started, frames


async def store_throughput(directory: Path, frames: int, followers: int) -> float:
    """Microseconds per frame delivered, appended by one producer and read by `followers` at once."""
    store = LocalJobStore(directory)
    research_id = "0" * 32
    await store.create(Job(research_id, "bench", "q", status=JobStatus.running))

    async def produce() -> None:
        for number in range(frames):
            await store.append(research_id, LogsFrame(content=ProgressStep.fetching, output=str(number)))
            if number % 64 == 0:
                await asyncio.sleep(0)  # a real task yields between frames
        await store.finish(research_id, JobStatus.completed)

    async def read() -> int:
        return sum([1 async for _ in follow(store, research_id)])

    started = time.perf_counter()
    counts = await asyncio.gather(produce(), *(read() for _ in range(followers)))
    elapsed = time.perf_counter() - started
    assert all(count == frames for count in counts[1:])
    return elapsed / (frames * followers) * 1e6


async def main(runs: int, frames: int) -> None:
    tavily = await FakeTavily().start()
    tavily.behaviour.delay_s = UPSTREAM_S
    with tempfile.TemporaryDirectory() as folder:
        settings = make_settings(Path(folder), {"tavily": tavily, "google": tavily})
        runner = web.AppRunner(create_app(settings))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        url = f"ws://127.0.0.1:{port}/ws"
        plain, resumed, replays, counts = [], [], [], []
        for run in range(runs):  # interleaved, so load on the machine weighs on both alike
            task = {"task": f"rank fusion question {run}", "headers": {"retrievers": "tavily"}}
            plain.append(await attached(url, task))
            took, research_id = await detached_and_resumed(url, {**task, "task": f"{task['task']}b"})
            resumed.append(took)
            took, count = await replay(url, research_id)
            replays.append(took)
            counts.append(count)
        await runner.cleanup()
        per_frame = await store_throughput(Path(folder) / "store", frames, followers=3)
    await tavily.stop()
    base = statistics.median(plain)
    print(f"load average {os.getloadavg()[0]:.2f}; {runs} runs each; Tavily answers in {UPSTREAM_S * 1000:.0f} ms")
    print(f"attached task, start to path:             {base * 1000:7.1f} ms  (1.00)")
    median = statistics.median(resumed)
    print(f"detached, dropped, resumed: start to path: {median * 1000:7.1f} ms  ({median / base:.2f})")
    median, count = statistics.median(replays), statistics.median(counts)
    print(f"replay of the finished job ({count:.0f} frames):  {median * 1000:7.1f} ms  ({median / base:.2f})")
    print(f"job store: {frames} frames to 3 followers: {per_frame:.2f} µs per frame delivered")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--frames", type=int, default=20000)
    arguments = parser.parse_args()
    logging.disable(logging.INFO)  # the access log of every socket would bury the figures
    asyncio.run(main(arguments.runs, arguments.frames))
