"""The server's CPU time per research task, by stage.

    python -m bench.stages [--seconds 15] [--concurrency 32] [--top 20] [--pages]

One server process (`fedresearch serve`, as in production) runs the task of bench/scaling.py
(Tavily and Google, fakes answering in 50 ms from a process of their own, pages not read unless
`--pages`, embeddings off) for `--seconds` from `--concurrency` sockets, while py-spy (a dev dependency)
samples it from outside with `--gil`: only the thread holding the GIL is sampled, so a sample is
Python at work in any thread (the writer's and the file writes' worker threads included) and
waiting costs nothing; the profiler runs in its own process and does not slow the server.
Printed: the server's CPU per task (/proc), the share of GIL samples per stage (a sample counts for
the innermost stage on its stack) and that share of the CPU per task, then the functions with the
most samples of their own. CPU spent without the GIL (syscalls: socket sends, file writes, the
event loop's waits) is in the per-task figure but in no stage: the line "outside the GIL" says how
much.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.load import cpu_seconds, raise_fd_limit
from bench.scaling import closed_loop, start_server, start_server_env, upstreams

# stage: the functions it is made of (file name, function name); the innermost match on a stack wins
STAGES: dict[str, list[tuple[str, str]]] = {
    "frames in: WebSocket read, parse, plan": [("research_socket.py", "on_text")],
    "federation: adapters, HTTP to the upstreams": [
        ("runner.py", "federate"),
        ("runner.py", "run"),
        ("runner.py", "_run_one"),
        ("runner.py", "search_one"),
    ],
    "fusion and ranking": [("fusion.py", "fuse")],
    "pages: fetching them": [("pages.py", "read"), ("pages.py", "_fetch"), ("reading.py", "read_pages")],
    "pages: their main text (trafilatura)": [("pages.py", "extract")],
    "writing and verifying the report": [
        ("compose.py", "write_extractive"),
        ("compose.py", "_write_and_save"),
        ("compose.py", "compose"),
    ],
    "saving the report (its JSON record)": [("store.py", "save_report"), ("task.py", "save")],
    "the job: its state and frames on disk": [("jobs.py", "_append_record"), ("jobs.py", "_remove")],
    "the job: frames to followers": [("jobs.py", "append"), ("tasks.py", "emit")],
    "frames out: JSON and WebSocket send": [("research_socket.py", "send"), ("research_socket.py", "_pump")],
    "starting a job": [("tasks.py", "start_job"), ("research_socket.py", "start")],
    "retention": [("jobs.py", "enforce_retention"), ("jobs.py", "_delete_reports"), ("jobs.py", "delete_many")],
    "threads: handing work over and back": [
        ("thread.py", "submit"),
        ("thread.py", "_worker"),
        ("threads.py", "to_thread"),
    ],
}
# samples whose own frame is the event loop's machinery, wherever they stand
EVENT_LOOP = {"base_events.py", "selector_events.py", "selectors.py", "events.py", "unix_events.py"}


def _parts(frame: str) -> tuple[str, str]:
    """('send', 'research_socket.py') from 'ResearchSocket.send (fedresearch/web/research_socket.py:71)'."""
    function, _, where = frame.partition(" (")
    return function.rsplit(".", 1)[-1], where.rsplit(":", 1)[0].rsplit("/", 1)[-1]


def stage_of(stack: list[str]) -> str:
    if _parts(stack[-1])[1] in EVENT_LOOP:
        return "event loop: select, wake-ups, callbacks"
    for frame in reversed(stack):  # innermost first
        function, file = _parts(frame)
        for stage, members in STAGES.items():
            if (file, function) in members:
                return stage
    return "other (the HTTP server and client, task set-up and the rest)"


def read_samples(path: Path) -> tuple[Counter[str], Counter[str], int]:
    """Samples per stage and per innermost function, from py-spy's raw (collapsed stack) output."""
    stages: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack_text, _, count_text = line.rpartition(" ")
        if not stack_text:
            continue
        count, stack = int(count_text), stack_text.split(";")
        total += count
        stages[stage_of(stack)] += count
        own[stack[-1]] += count
    return stages, own, total


def main(options: argparse.Namespace) -> None:
    raise_fd_limit()
    beside = Path(sys.executable).with_name("py-spy")  # the environment's, when it is not on PATH
    spy = str(beside) if beside.is_file() else shutil.which("py-spy")
    if spy is None:
        raise SystemExit("bench.stages needs py-spy (pip install -e '.[dev]')")
    with upstreams(pages=options.pages) as fakes:
        env = start_server_env(fakes.tavily_url, fakes.google_url, fakes.pages_hosts)
        server = start_server(1, "reuseport", env)
        pid, samples = next(iter(server.pids)), Path(tempfile.mkdtemp()) / "samples.txt"
        try:
            url = f"ws://127.0.0.1:{server.port}/ws"
            asyncio.run(closed_loop(url, 8, 2.0, "warm"))
            command = [spy, "record", "--pid", str(pid), "--gil", "--nonblocking", "--rate", "250", "--format", "raw"]
            command += ["--duration", str(int(options.seconds)), "--output", str(samples)]
            profiler = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # py-spy attaches
            before, started = cpu_seconds(pid), time.perf_counter()
            latencies, errors = asyncio.run(closed_loop(url, options.concurrency, options.seconds - 1.5, "stages"))
            used, wall = cpu_seconds(pid) - before, time.perf_counter() - started
            profiler.wait(60)
        finally:
            server.stop()
    if not samples.is_file():
        raise SystemExit("py-spy wrote no samples (it needs ptrace: run as the server's user, or as root)")
    per_task = 1000 * used / max(1, len(latencies))
    stages, own, total = read_samples(samples)
    gil_share = total / (250 * options.seconds) / (used / wall) if used else 0.0  # GIL samples over CPU time
    print(
        f"{len(latencies)} tasks ({errors} errors), {len(latencies) / wall:.1f}/s; server CPU {per_task:.2f} ms "
        f"per task; {total} GIL samples; load average {os.getloadavg()[0]:.2f}"
    )
    print(f"{'stage':<48} {'share':>6} {'ms/task':>8}")
    held = min(gil_share, 1.0)
    for stage, count in sorted(stages.items(), key=lambda item: -item[1]):
        share = count / total * held
        print(f"{stage:<48} {share:>6.1%} {share * per_task:>8.2f}")
    print(f"{'outside the GIL (syscalls, waits for it)':<48} {1 - held:>6.1%} {(1 - held) * per_task:>8.2f}")
    print(f"\nthe {options.top} functions with the most samples of their own:")
    for frame, count in own.most_common(options.top):
        print(f"{count / total:>6.1%}  {frame[:110]}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--pages", action="store_true", help="each task reads the 6 pages behind its results")
    main(parser.parse_args())
