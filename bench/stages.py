"""The server's CPU time per research task, by stage.

    python -m bench.stages [--tasks 400] [--concurrency 16] [--top 25]

One server process runs under cProfile timed by CPU (`time.process_time`), so waiting costs
nothing; fake Tavily and Google answer in 50 ms from a process of their own, as in bench/scaling.py.
Printed: the process's CPU per task (from /proc, unprofiled overhead excluded: the profiler adds
its own), then each stage's share of the profiled CPU and that share of the measured per-task CPU.
Profiling skews small functions; the shares, not the absolute figures, are what to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import multiprocessing
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time

from bench.load import ROOT, cpu_seconds, free_port, raise_fd_limit
from bench.scaling import closed_loop, run_upstreams, start_server_env, wait_for_workers

# stage: the functions whose cumulative CPU it is (module path fragment, function name)
STAGES: dict[str, list[tuple[str, str]]] = {
    "frames in: WebSocket read + parse + plan": [("research_socket.py", "on_text")],
    "federation: adapters, HTTP to upstreams": [("runner.py", "federate")],
    "fusion and ranking": [("fusion.py", "fuse")],
    "writing the report": [("report/writer.py", "write"), ("report/compose.py", "compose")],
    "saving report files": [("report/store.py", "save_report")],
    "frames out: json + WebSocket send": [("research_socket.py", "send")],
    "aiohttp HTTP/WebSocket protocol": [("aiohttp/web_protocol.py", "data_received")],
    "event loop (select, callbacks)": [("asyncio/base_events.py", "_run_once")],
}


def serve_profiled(port: int, out: str) -> None:
    from aiohttp import web

    from fedresearch.core.settings import Settings
    from fedresearch.web.app import create_app

    def stop(*_: object) -> None:
        raise KeyboardInterrupt  # run_app stops cleanly on it

    profile = cProfile.Profile(time.process_time)
    signal.signal(signal.SIGTERM, stop)
    profile.enable()
    try:
        web.run_app(create_app(Settings()), host="127.0.0.1", port=port, print=None, handle_signals=False)
    finally:
        profile.disable()
        profile.dump_stats(out)


def cumulative(stats: pstats.Stats, module: str, function: str) -> float:
    total = 0.0
    for (path, _, name), row in stats.stats.items():  # type: ignore[attr-defined]
        if name == function and path.endswith(module):
            total += row[3]
    return total


def main(options: argparse.Namespace) -> None:
    raise_fd_limit()
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    upstreams = context.Process(target=run_upstreams, args=(theirs,), daemon=True)
    upstreams.start()
    tavily_url, google_url = ours.recv()
    port, out = free_port(), tempfile.mktemp(suffix=".prof")
    env = start_server_env(tavily_url, google_url)
    command = [sys.executable, "-m", "bench.stages", "--serve", str(port), out]
    server = subprocess.Popen(command, cwd=ROOT, env=env, preexec_fn=raise_fd_limit)
    try:
        wait_for_workers(port, 1, server)
        url = f"ws://127.0.0.1:{port}/ws"
        asyncio.run(closed_loop(url, 4, 1.0, "warm"))
        before = cpu_seconds(server.pid)
        latencies, errors = asyncio.run(tasks_of(url, options.tasks, options.concurrency))
        per_task_ms = 1000 * (cpu_seconds(server.pid) - before) / max(1, len(latencies))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
        ours.send("stop")
        upstreams.join(10)
    report(pstats.Stats(out), per_task_ms, len(latencies), errors, options.top)
    os.unlink(out)


async def tasks_of(url: str, count: int, concurrency: int) -> tuple[list[float], int]:
    """`count` tasks over `concurrency` sockets, back to back."""
    import websockets

    from bench.scaling import one_task

    latencies: list[float] = []
    errors = 0
    queue = iter(range(count))

    async def client() -> None:
        nonlocal errors
        async with websockets.connect(url, max_size=None, ping_interval=None) as ws:
            for number in queue:
                try:
                    latencies.append(await one_task(ws, f"stages question {number}"))
                except RuntimeError:
                    errors += 1

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return latencies, errors


def report(stats: pstats.Stats, per_task_ms: float, tasks: int, errors: int, top: int) -> None:
    profiled = sum(row[2] for row in stats.stats.values())  # type: ignore[attr-defined]
    print(
        f"{tasks} tasks ({errors} errors); server CPU {per_task_ms:.2f} ms per task (profiled run); "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print(f"{'stage':<44} {'share':>6} {'ms/task':>8}")
    for stage, functions in STAGES.items():
        seconds = sum(cumulative(stats, module, name) for module, name in functions)
        share = seconds / profiled if profiled else 0.0
        print(f"{stage:<44} {share:>6.1%} {share * per_task_ms:>8.2f}")
    print(f"\nthe {top} functions with the most CPU of their own:")
    stats.sort_stats("tottime").print_stats(top)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve_profiled(int(sys.argv[2]), sys.argv[3])
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--top", type=int, default=25)
    main(parser.parse_args())
