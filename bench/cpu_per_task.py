"""The server's CPU per research task: this checkout against another, side by side in one run.

    python -m bench.cpu_per_task --against DIR [--rounds 3] [--seconds 10] [--concurrency 32]
                                 [--together | --rate R] [--redis] [--llm] [--this-env KEY=VALUE ...]

DIR is another checkout of the project (`git worktree add /tmp/old <commit>`), started with the
interpreter running this bench (`python -m fedresearch serve`, or `python server.py` for checkouts
older than the namespace; any package it needs and this environment lacks goes on PYTHONPATH).
Both servers get the same task as bench/scaling.py (Tavily and Google, fakes answering in 50 ms
from a process of their own, pages not read, embeddings off) from the same clients; rounds
alternate the two so drift on a shared machine hits both alike; with `--together` both servers run
at once, on the same core, each with its own clients, so drift lands on both within the same
seconds (on this 2-core VM rounds one after the other moved by ±30%). With two cores or more the
servers are pinned to the last core and the clients and fakes to the others. Printed per round:
tasks/s and each server's CPU per task (/proc); then the medians, their ratio, and the spread of
the ratios round by round. `--redis`: both servers keep jobs and shared state in a redis-server
started here (a database each, emptied before every round), as the workers of a team do.
`--llm`: the report is written by a model, a fake OpenAI-compatible endpoint in a process of its
own that answers at once (the first passage's first sentence, cited), so what is measured is the
server's side of the model's calls. `--pages`: each task also reads the pages behind its six
results, as a task does by default (a site in the fakes' processes, a new set of pages of about 10
kB per task: bench/extract.py's `site`), so what is measured includes reading their main text and
writing from it.
`--rate R`: each server in turn gets R tasks a second on `--concurrency` open sockets (bench.scaling's
steady load) instead of a closed loop, so both run at the same load. A closed loop runs each as fast
as it goes, and `--together` splits the core by thread, so a change that moves work between threads
also moves the load, and a task costs more at a lower load (a busier loop takes more events a
wake-up). Choose R below both servers' capacity.
`--this-env KEY=VALUE` (repeatable): this checkout's server
runs with that in its environment too, e.g. `PROMETHEUS_MULTIPROC_DIR=DIR` as the workers of `serve
--workers N` do (their metrics in files every worker reads, core/metrics.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from redis import Redis

from bench.load import ROOT, cpu_seconds, free_port, raise_fd_limit
from bench.scaling import closed_loop, start_server_env, steady, upstreams
from tests.fakes.openai_chat import Answer, FakeOpenAI, faithful, is_summing, passages_of
from tests.redis_server import start_redis


def _cites_the_first_passage(body: dict[str, Any]) -> Answer:
    if is_summing(body):  # a section summing up the others' drafts: their first sentences
        return faithful(body)
    first = passages_of(body).get(1, "")
    sentence = first.split(". ")[0].rstrip(".")
    return Answer(pieces=[f"{sentence} [1].\n"]) if body.get("stream") else Answer(pieces=["1. a\n2. b\n"])


def _run_model(pipe: Connection) -> None:
    async def serve() -> None:
        fake = await FakeOpenAI().start()
        fake.script = [_cites_the_first_passage]
        pipe.send(fake.url)
        await asyncio.get_running_loop().run_in_executor(None, pipe.recv)  # until told to stop

    asyncio.run(serve())


@contextlib.contextmanager
def model() -> Iterator[str]:
    """A fake model endpoint in a process of its own while the block runs; its URL."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    process = context.Process(target=_run_model, args=(theirs,), daemon=True)
    process.start()
    try:
        yield ours.recv()
    finally:
        ours.send("stop")
        process.join(10)


def server_command(checkout: Path, port: int) -> list[str]:
    if (checkout / "fedresearch" / "__main__.py").is_file():
        return [sys.executable, "-m", "fedresearch", "serve", "--port", str(port)]
    return [sys.executable, "server.py"]  # before the namespace: the port comes from FEDRESEARCH_PORT


def start(checkout: Path, env: dict[str, str], core: int | None) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()

    def prepare() -> None:
        raise_fd_limit()
        if core is not None:
            os.sched_setaffinity(0, {core})

    process = subprocess.Popen(
        server_command(checkout, port),
        cwd=checkout,
        env={**env, "FEDRESEARCH_PORT": str(port)},
        stderr=subprocess.DEVNULL,
        preexec_fn=prepare,
    )
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                return process, port
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server in {checkout} did not start") from None
            time.sleep(0.2)


def measure(checkout: Path, env: dict[str, str], core: int | None, options: argparse.Namespace) -> tuple[float, float]:
    process, port = start(checkout, env, core)
    try:
        url = f"ws://127.0.0.1:{port}/ws"
        asyncio.run(closed_loop(url, 8, 2.0, "warm"))
        before, started = cpu_seconds(process.pid), time.perf_counter()
        if options.rate:
            load = steady(url, options.concurrency, options.rate, options.seconds, checkout.name)
        else:
            load = closed_loop(url, options.concurrency, options.seconds, checkout.name)
        latencies, errors = asyncio.run(load)
        wall, used = time.perf_counter() - started, cpu_seconds(process.pid) - before
    finally:
        process.terminate()
        process.wait(30)
    if errors:
        why = " or found no idle socket: raise --concurrency or lower --rate" if options.rate else ""
        raise SystemExit(f"{errors} tasks failed on {checkout}{why}")
    return len(latencies) / wall, 1000 * used / max(1, len(latencies))


def measure_together(
    checkouts: dict[str, Path], envs: dict[str, dict[str, str]], core: int | None, options: argparse.Namespace
) -> dict[str, tuple[float, float]]:
    """Both servers on the same core at the same time, each loaded by its own `--concurrency`
    sockets: whatever else the machine does meanwhile slows both alike."""
    started: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    try:
        for name, checkout in checkouts.items():  # one that does not start stops those that did
            started[name] = start(checkout, envs[name], core)
        urls = {name: f"ws://127.0.0.1:{port}/ws" for name, (_, port) in started.items()}

        async def load(seconds: float, concurrency: int) -> list[tuple[list[float], int]]:
            return await asyncio.gather(*(closed_loop(url, concurrency, seconds, name) for name, url in urls.items()))

        asyncio.run(load(2.0, 8))
        before = {name: cpu_seconds(process.pid) for name, (process, _) in started.items()}
        began = time.perf_counter()
        outcomes = asyncio.run(load(options.seconds, options.concurrency))
        wall = time.perf_counter() - began
        used = {name: cpu_seconds(process.pid) - before[name] for name, (process, _) in started.items()}
    finally:
        for process, _ in started.values():
            process.terminate()
            process.wait(30)
    results = {}
    for name, (latencies, errors) in zip(started, outcomes, strict=True):
        if errors:
            raise SystemExit(f"{errors} tasks failed on {checkouts[name]}")
        results[name] = (len(latencies) / wall, 1000 * used[name] / max(1, len(latencies)))
    return results


def main(options: argparse.Namespace) -> None:
    raise_fd_limit()
    cores = sorted(os.sched_getaffinity(0))
    server_core = cores[-1] if len(cores) > 1 else None
    if server_core is not None:
        os.sched_setaffinity(0, set(cores[:-1]))  # inherited by the clients and the fakes
    if options.redis and shutil.which("redis-server") is None:
        raise SystemExit("--redis needs redis-server (apt-get install redis-server)")
    with contextlib.ExitStack() as cleanup:
        redis = start_redis() if options.redis else None
        if redis is not None:
            cleanup.callback(redis.stop)
        fakes = cleanup.enter_context(upstreams(pages=options.pages))
        llm = {"LLM_BASE_URL": cleanup.enter_context(model()), "LLM_MODEL": "small"} if options.llm else {}
        checkouts = {"this": ROOT, "against": options.against.resolve()}
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in checkouts}
        print(f"this: {ROOT}  against: {checkouts['against']}  server pinned to core {server_core}")
        print(f"{'round':>5} {'checkout':>8} {'tasks/s':>8} {'CPU ms/task':>12}")
        for number in range(1, options.rounds + 1):
            env = start_server_env(fakes.tavily_url, fakes.google_url, fakes.pages_hosts) | llm
            # with Redis, a database each: a key's task slots and the answer cache are not shared
            envs = {
                name: env if redis is None else {**env, "FEDRESEARCH_REDIS_URL": f"{redis.url}?db={index}"}
                for index, name in enumerate(checkouts)
            }
            envs["this"] = {**envs["this"], **dict(pair.split("=", 1) for pair in options.this_env)}
            if redis is not None:
                with Redis.from_url(redis.url) as client:
                    client.flushall()  # each round starts from nothing, as the first
            if options.together:
                measured = measure_together(checkouts, envs, server_core, options)
            else:
                measured = {
                    name: measure(checkout, envs[name], server_core, options) for name, checkout in checkouts.items()
                }
            for name, (rate, cpu) in measured.items():
                results[name].append((rate, cpu))
                print(f"{number:>5} {name:>8} {rate:>8.1f} {cpu:>12.2f}", flush=True)
    medians = {name: statistics.median(cpu for _, cpu in rows) for name, rows in results.items()}
    rates = {name: statistics.median(rate for rate, _ in rows) for name, rows in results.items()}
    paired = sorted(this[1] / other[1] for this, other in zip(results["this"], results["against"], strict=True))
    print(
        f"median CPU per task: this {medians['this']:.2f} ms, against {medians['against']:.2f} ms "
        f"(ratio {medians['this'] / medians['against']:.2f}); tasks/s {rates['this']:.1f} vs {rates['against']:.1f}"
    )
    print(f"ratio per round: median {statistics.median(paired):.2f}, from {paired[0]:.2f} to {paired[-1]:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--redis", action="store_true", help="jobs and shared state in a redis-server started here")
    parser.add_argument("--llm", action="store_true", help="reports written by a fake model answering at once")
    parser.add_argument("--pages", action="store_true", help="each task reads the 6 pages behind its results")
    parser.add_argument("--this-env", action="append", default=[], help="KEY=VALUE for this checkout's server")
    parser.add_argument(
        "--together", action="store_true", help="load both servers at once on one core, not one after the other"
    )
    parser.add_argument("--rate", type=float, default=0.0, help="tasks a second to each server in turn (steady)")
    arguments = parser.parse_args()
    if arguments.together and arguments.rate:
        parser.error("--rate loads one server at a time: not with --together")
    main(arguments)
