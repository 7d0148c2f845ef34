"""The server under concurrent research: N WebSocket clients each run one full task at once.

    python -m bench.load [--clients 100,300,1000]

The server runs as its own process (`python server.py`), as in production; fake Tavily and Google
answer in 50 ms from this process. Every client asks a different question, so the upstream cache
does not flatter the figures, and waits for its report. Printed per N: throughput, per-task latency
and its overhead beyond the 50 ms upstream delay (p50/p99), the server's peak RSS, and errors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import websockets

from tests.fakes.google import FakeGoogle
from tests.fakes.tavily import FakeTavily

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM_S = 0.05


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def raise_fd_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_topology() -> str:
    """The logical CPUs and the physical cores under them: two logical CPUs of one core share its
    units, so CPU per task rises once workers land on siblings (Linux; elsewhere the count only)."""
    cores = set()
    for topology in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology"):
        try:
            package = (topology / "physical_package_id").read_text().strip()
            cores.add((package, (topology / "core_id").read_text().strip()))
        except OSError:
            continue
    logical = os.cpu_count() or 0
    if not cores or len(cores) == logical:
        return f"{logical} cores"
    return f"{logical} logical CPUs on {len(cores)} physical cores"


def machine_busy() -> tuple[float, float]:
    """Busy and total CPU time of the whole machine so far (/proc/stat), to tell a saturated box."""
    fields = [float(n) for n in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    return sum(fields) - idle, sum(fields)


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def one_task(url: str, number: int, run: int) -> float:
    task = {"task": f"rank fusion question {run}-{number}", "headers": {"retrievers": "tavily,google"}}
    async with websockets.connect(url, max_size=None, open_timeout=60, ping_interval=None) as ws:
        started = time.perf_counter()
        await ws.send("start " + json.dumps(task))
        async for raw in ws:
            frame = json.loads(raw)
            if frame.get("type") == "error":
                raise RuntimeError(frame["output"])
            if frame.get("type") == "logs" and frame.get("content") == "retriever_failed":
                raise RuntimeError(frame["output"])
            if frame.get("type") == "path":
                return time.perf_counter() - started
    raise RuntimeError("closed before the report")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


async def main(levels: list[int]) -> None:
    raise_fd_limit()
    tavily, google = await FakeTavily().start(), await FakeGoogle().start()
    for fake in (tavily, google):
        fake.behaviour.delay_s = UPSTREAM_S
    port = free_port()
    env = {
        **os.environ,
        "FEDRESEARCH_DATA_DIR": tempfile.mkdtemp(prefix="bench-load-"),
        "FEDRESEARCH_PORT": str(port),
        "TAVILY_API_KEY": FakeTavily.api_key,
        "TAVILY_API_BASE_URL": tavily.url,
        "GOOGLE_API_KEY": FakeGoogle.api_key,
        "GOOGLE_CX_KEY": FakeGoogle.cx,
        "GOOGLE_API_BASE_URL": google.url,
        "FEDRESEARCH_API_KEYS": "",
        "MAX_TASKS_PER_KEY": "100000",
        "TASK_TIMEOUT_S": "120",
        "RETRIEVER_TIMEOUT_S": "60",
        "FEDRESEARCH_EMBEDDINGS": "false",
    }
    command = [sys.executable, "server.py"]
    if os.environ.get("BENCH_PROFILE"):  # e.g. BENCH_PROFILE=/tmp/server.txt: py-spy profiles the server
        command = ["py-spy", "record", "-f", "raw", "-o", os.environ["BENCH_PROFILE"], "--", *command]
    server = subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.DEVNULL, preexec_fn=raise_fd_limit)
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except OSError:
                await asyncio.sleep(0.1)
        url = f"ws://127.0.0.1:{port}/ws"
        await asyncio.gather(*(one_task(url, n, -1) for n in range(20)))  # warm up
        print(
            f"{'clients':>8} {'tasks/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'p50 over':>9} {'p99 over':>9} "
            f"{'RSS MB':>7} {'errors':>6} {'server CPU':>10}"
        )
        for run, clients in enumerate(levels):
            cpu_before = cpu_seconds(server.pid)
            started = time.perf_counter()
            outcomes = await asyncio.gather(*(one_task(url, n, run) for n in range(clients)), return_exceptions=True)
            wall = time.perf_counter() - started
            server_cpu = (cpu_seconds(server.pid) - cpu_before) / wall
            latencies = [o * 1000 for o in outcomes if isinstance(o, float)]
            errors = [o for o in outcomes if not isinstance(o, float)]
            p50, p99 = statistics.median(latencies), percentile(latencies, 0.99)
            print(
                f"{clients:>8} {len(latencies) / wall:>8.1f} {p50:>8.1f} {p99:>8.1f} {p50 - UPSTREAM_S * 1000:>9.1f} "
                f"{p99 - UPSTREAM_S * 1000:>9.1f} {peak_rss_mb(server.pid):>7.0f} {len(errors):>6} {server_cpu:>10.0%}",
                flush=True,
            )
            for error in errors[:3]:
                print(f"         error: {type(error).__name__}: {error}")
    finally:
        server.terminate()
        server.wait(30)
        await tavily.stop()
        await google.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="100,300,1000")
    asyncio.run(main([int(n) for n in parser.parse_args().clients.split(",")]))
