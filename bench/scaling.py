"""Research throughput and overhead by worker count, side by side in one run.

    python -m bench.scaling [--workers 1,2] [--balance reuseport,shared] [--seconds 8]
                            [--concurrency 64] [--sockets 1000] [--rate 0.5] [--client-procs 1]
                            [--fake-procs cores/8] [--state redis,cluster] [--pin] [--pages]

For each worker count N (and each way of sharing the port), `fedresearch serve --workers N` runs
as in production, with its shared state in a real redis-server started here (N = 1 also runs
without Redis: today's single process); `--state redis,cluster` runs each row a second time with
the state in a Redis Cluster of three primaries on this machine (FEDRESEARCH_REDIS_CLUSTER), whose
efficiency is against one worker on the cluster. Fake Tavily and Google answer in 50 ms from
`--fake-procs` processes of their own (sharing two ports); clients run in `--client-procs`
processes of their own. The `cli` and `fakes` columns are the cores those used: near their
process counts, the load generator or the fakes, not the server, set the row. Two scenarios per row:

  closed loop: `--concurrency` sockets run tasks back to back for `--seconds`: tasks/s, latency
      overhead beyond the 50 ms upstream (p50/p99), the workers' CPU per task, and how evenly the
      workers shared the work (the least busy worker's CPU over the busiest's);
  steady: `--sockets` open sockets, then (once every client process has opened its share) tasks
      arriving at `--rate` x the closed loop's tasks/s, each on an idle socket: overhead p50/p99
      below capacity.

On a 16-core machine: `python -m bench.scaling --workers 1,2,4,8,16 --client-procs 4 --concurrency 512`
(clients and fakes need cores too: leave them about a quarter).

`--pin`: each row's server (the supervisor and its N workers) runs on N cores of its own and
everything else (clients, fakes, Redis, this script) on the others, so the efficiency says how the
server scales when the load does not compete with it for cores, as with the load on other
machines; rows with as many workers as there are cores are skipped.

`--pages`: each task also reads the pages behind its six results, as a task does by default: a
site in the fakes' processes serves a new set per task (bench/extract.py's `site`, about 10 kB of
HTML a page), so the overheads include fetching and reading them.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import json
import multiprocessing
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier
from typing import Any

import websockets
from aiohttp import web

from bench.extract import site
from bench.load import ROOT, UPSTREAM_S, cpu_seconds, cpu_topology, free_port, machine_busy, percentile, raise_fd_limit
from tests.fakes.google import FakeGoogle
from tests.fakes.tavily import FakeTavily
from tests.redis_cluster import RedisCluster, start_redis_cluster
from tests.redis_server import RedisServer, start_redis

TASK = {"headers": {"retrievers": "tavily,google"}}


# The pages' site listens on as many loopback addresses (all of 127.0.0.0/8 is the loopback
# interface): a reader fetches FETCH_PER_HOST pages of a host at a time, and one host for every page
# made that limit, not the server, the bench's ceiling.
PAGE_HOSTS = tuple(f"127.0.1.{n}" for n in range(1, 33))


def run_upstreams(pipe: Connection, ports: tuple[int, int, int | None]) -> None:
    """The fakes, in a process of their own (so their CPU is not the server's or the clients'),
    sharing their ports with the other fake processes; with a third port, a web site whose pages
    the fakes' results link to (bench/extract.py's `site`, on each of PAGE_HOSTS), a set of pages
    per query."""

    async def serve() -> None:
        tavily = await FakeTavily().start(ports[0], reuse_port=True)
        google = await FakeGoogle().start(ports[1], reuse_port=True)
        pages_urls: tuple[str, ...] = ()
        if ports[2] is not None:
            runner = web.AppRunner(site(), access_log=None)
            await runner.setup()
            for host in PAGE_HOSTS:
                await web.TCPSite(runner, host, ports[2], reuse_port=True).start()
            pages_urls = tuple(f"http://{host}:{ports[2]}" for host in PAGE_HOSTS)
        for fake in (tavily, google):
            fake.behaviour.delay_s = UPSTREAM_S
            fake.behaviour.link_bases = pages_urls
        pipe.send((tavily.url, google.url, ",".join(PAGE_HOSTS) if pages_urls else None))
        await asyncio.get_running_loop().run_in_executor(None, pipe.recv)  # until told to stop

    asyncio.run(serve())


@dataclass
class Fakes:
    tavily_url: str
    google_url: str
    pages_hosts: str | None  # the hosts of the site the results link to (a comma list), when pages are read
    pids: list[int]  # the processes answering both: their CPU says whether the fakes limit a row


def fake_processes_for_this_machine() -> int:
    # one fake process answers about 1,000 tasks' requests a second on a core (2 requests a task,
    # about 1 ms of its CPU a task here): at 16 workers one process could be the ceiling
    return max(1, (os.cpu_count() or 1) // 8)


def _first_word(pipe: Connection, process: multiprocessing.process.BaseProcess) -> Any:
    """What a fakes' process sends once it listens; SystemExit if it dies first (a dataset missing,
    a port taken), where waiting on the pipe would wait forever."""
    while not pipe.poll(0.5):
        if not process.is_alive():
            raise SystemExit(f"a fakes' process exited ({process.exitcode}) before it listened (its traceback above)")
    return pipe.recv()


@contextlib.contextmanager
def upstreams(processes: int = 1, pages: bool = False) -> Iterator[Fakes]:
    """The fakes running in `processes` processes of their own (one port each for Tavily and Google,
    and with `pages` for the site their results link to, shared with SO_REUSEPORT) while the block
    runs."""
    context = multiprocessing.get_context("spawn")
    ports = (free_port(), free_port(), free_port() if pages else None)
    pipes, children = [], []
    for _ in range(processes):
        ours, theirs = context.Pipe()
        process = context.Process(target=run_upstreams, args=(theirs, ports), daemon=True)
        process.start()
        pipes.append(ours)
        children.append(process)
    try:
        urls = [_first_word(pipe, process) for pipe, process in zip(pipes, children, strict=True)]
        yield Fakes(*urls[0], pids=[process.pid for process in children if process.pid is not None])
    finally:
        for pipe, process in zip(pipes, children, strict=True):
            pipe.send("stop")
            process.join(10)


async def one_task(ws: Any, question: str) -> float:
    started = time.perf_counter()
    await ws.send("start " + json.dumps({**TASK, "task": question}))
    async for raw in ws:
        frame = json.loads(raw)
        if frame.get("type") in ("error", "path") or frame.get("content") == "retriever_failed":
            if frame.get("type") != "path":
                raise RuntimeError(frame.get("output"))
            return time.perf_counter() - started
    raise RuntimeError("closed before the report")


async def closed_loop(url: str, sockets: int, seconds: float, tag: str) -> tuple[list[float], int]:
    latencies: list[float] = []
    errors = 0

    async def client(number: int) -> None:
        nonlocal errors
        async with websockets.connect(url, max_size=None, open_timeout=60, ping_interval=None) as ws:
            deadline, count = time.perf_counter() + seconds, 0
            while time.perf_counter() < deadline:
                count += 1
                try:
                    latencies.append(await one_task(ws, f"rank fusion {tag}-{number}-{count}"))
                except RuntimeError:
                    errors += 1

    await asyncio.gather(*(client(n) for n in range(sockets)))
    return latencies, errors


async def steady(
    url: str, sockets: int, rate: float, seconds: float, tag: str, together: Barrier | None = None
) -> tuple[list[float], int]:
    """`sockets` open at once; once every client process has opened its own (`together`), a task
    every 1/rate s on an idle one (none idle: counted as an error). Without the wait, the first
    process's tasks ran while the others were still opening theirs (0.7 s apart on 2 cores), and
    those tasks, queued behind hundreds of handshakes, were the p99: steady arrivals, not a
    connection storm, is what this scenario measures."""
    connections = await asyncio.gather(
        *(websockets.connect(url, max_size=None, open_timeout=120, ping_interval=None) for _ in range(sockets))
    )
    if together is not None:
        await asyncio.to_thread(together.wait)
    idle, latencies, errors, running = list(connections), [], 0, set()

    async def task(ws: Any, number: int) -> None:
        nonlocal errors
        try:
            latencies.append(await one_task(ws, f"steady {tag}-{number}"))
        except RuntimeError:
            errors += 1
        idle.append(ws)

    started, number = time.perf_counter(), 0
    while (due := started + number / rate) < started + seconds:
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        if idle:
            job = asyncio.create_task(task(idle.pop(), number))
            running.add(job)
            job.add_done_callback(running.discard)
        else:
            errors += 1
        number += 1
    await asyncio.gather(*running)
    await asyncio.gather(*(ws.close() for ws in connections))
    return latencies, errors


def client_process(scenario: str, args: tuple[Any, ...], pipe: Connection) -> None:
    raise_fd_limit()
    runner = closed_loop if scenario == "closed" else steady
    started = time.process_time()
    latencies, errors = asyncio.run(runner(*args))  # type: ignore[operator]
    pipe.send((latencies, errors, time.process_time() - started))


def in_client_processes(procs: int, scenario: str, make_args: Any) -> tuple[list[float], int, float]:
    """Run a scenario split over `procs` client processes; their latencies, errors and CPU seconds together."""
    context = multiprocessing.get_context("spawn")
    pipes, workers = [], []
    together = context.Barrier(procs) if scenario == "steady" else None
    for number in range(procs):
        ours, theirs = context.Pipe()
        args = make_args(number) + ((together,) if together is not None else ())
        worker = context.Process(target=client_process, args=(scenario, args, theirs))
        worker.start()
        pipes.append(ours)
        workers.append(worker)
    latencies, errors, cpu = [], 0, 0.0
    for pipe, worker in zip(pipes, workers, strict=True):
        got, failed, used = pipe.recv()
        latencies += got
        errors += failed
        cpu += used
        worker.join()
    return latencies, errors, cpu


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    port: int
    pids: set[int]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(40)
        except subprocess.TimeoutExpired:
            self.process.kill()


def start_server(workers: int, balance: str, env: dict[str, str], cores: set[int] | None = None) -> Server:
    port = free_port()
    command = [sys.executable, "-m", "fedresearch", "serve", "--port", str(port), "--workers", str(workers)]
    command += ["--balance", balance]

    def prepare() -> None:
        raise_fd_limit()
        if cores is not None:
            os.sched_setaffinity(0, cores)  # the workers inherit it

    process = subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.DEVNULL, preexec_fn=prepare)
    return Server(process, port, wait_for_workers(port, workers, process))


def pin(pids: list[int], cores: set[int]) -> None:
    """Every thread of these processes on `cores` (a process's affinity is its main thread's alone)."""
    for pid in pids:
        for thread in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(int(thread), cores)


def wait_for_workers(port: int, workers: int, process: subprocess.Popen[bytes]) -> set[int]:
    """The pids of the `workers` processes answering on `port`, once all of them answer."""
    pids: set[int] = set()
    deadline = time.monotonic() + 180
    while len(pids) < workers:
        if time.monotonic() > deadline or process.poll() is not None:
            raise RuntimeError(f"{workers} workers did not start")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
                pids.add(json.load(answer)["pid"])
        except OSError:
            time.sleep(0.2)
    return pids


def start_server_env(tavily_url: str, google_url: str, pages_hosts: str | None = None) -> dict[str, str]:
    """A server's environment for the fakes; with `pages_hosts`, the pages behind results are read
    (8 a task at most, as by default), from those hosts alone."""
    data_dir = tempfile.mkdtemp(prefix="bench-scaling-")
    # a run leaves thousands of files a second behind; left in place, they slow every later file
    # creation on the same file system (and so the next runs of this bench)
    atexit.register(shutil.rmtree, data_dir, ignore_errors=True)
    return {
        **os.environ,
        "FEDRESEARCH_DATA_DIR": data_dir,
        "TAVILY_API_KEY": FakeTavily.api_key,
        "TAVILY_API_BASE_URL": tavily_url,
        "GOOGLE_API_KEY": FakeGoogle.api_key,
        "GOOGLE_CX_KEY": FakeGoogle.cx,
        "GOOGLE_API_BASE_URL": google_url,
        "FEDRESEARCH_API_KEYS": "",
        "MAX_TASKS_PER_KEY": "100000",
        "TASK_TIMEOUT_S": "120",
        "RETRIEVER_TIMEOUT_S": "60",
        "FEDRESEARCH_EMBEDDINGS": "false",
        # without the site the fakes' result URLs are served nowhere: reading them would measure DNS
        # timeouts
        "FETCH_PAGES": "false",
    } | ({"FETCH_PAGES": "true", "FETCH_ALLOWED_HOSTS": pages_hosts} if pages_hosts else {})


def overheads(latencies: list[float]) -> tuple[float, float]:
    over = [(value - UPSTREAM_S) * 1000 for value in latencies]
    return statistics.median(over), percentile(over, 0.99)


def measure(server: Server, fakes: Fakes, options: argparse.Namespace, label: str) -> dict[str, Any]:
    url = f"ws://127.0.0.1:{server.port}/ws"
    procs, per = options.client_procs, max(1, options.concurrency // options.client_procs)
    in_client_processes(1, "closed", lambda n: (url, 8, 1.0, f"warm-{label}"))
    before = {pid: cpu_seconds(pid) for pid in server.pids}
    fakes_before = sum(cpu_seconds(pid) for pid in fakes.pids)
    busy_before, total_before = machine_busy()
    started = time.perf_counter()
    latencies, errors, client_cpu = in_client_processes(
        procs, "closed", lambda n: (url, per, options.seconds, f"{label}-{n}")
    )
    wall = time.perf_counter() - started
    used = {pid: cpu_seconds(pid) - before[pid] for pid in server.pids}
    fakes_used = sum(cpu_seconds(pid) for pid in fakes.pids) - fakes_before
    busy_after, total_after = machine_busy()
    throughput = len(latencies) / wall
    p50, p99 = overheads(latencies)
    rate = options.rate * throughput / procs
    steady_latencies, steady_errors, _ = in_client_processes(
        procs, "steady", lambda n: (url, options.sockets // procs, rate, options.seconds, f"{label}-{n}")
    )
    s50, s99 = overheads(steady_latencies)
    return {
        "tasks/s": throughput,
        "p50 over": p50,
        "p99 over": p99,
        "CPU ms/task": 1000 * sum(used.values()) / max(1, len(latencies)),
        "balance": min(used.values()) / max(max(used.values()), 1e-9),
        # the whole machine's CPU in use (server, clients, fakes, Redis): near 1, the box is the limit
        "machine busy": (busy_after - busy_before) / max(total_after - total_before, 1e-9),
        "client cores": client_cpu / wall,  # near --client-procs: the load generator is the limit
        "fake cores": fakes_used / wall,  # near --fake-procs: the fakes are the limit
        "errors": errors,
        "steady rate": rate * procs,
        "steady p50": s50,
        "steady p99": s99,
        "steady errors": steady_errors,
    }


def configurations(options: argparse.Namespace) -> list[tuple[int, str, str]]:
    """(workers, balance, state): state is "process" (nothing shared), "redis" or "cluster"."""
    rows: list[tuple[int, str, str]] = []
    for workers in options.workers:
        if workers == 1:
            rows.append((1, "reuseport", "process"))  # today's single process, nothing shared
            rows += [(1, "reuseport", state) for state in options.state]
        else:
            rows += [(workers, balance, state) for balance in options.balance for state in options.state]
    return rows


def print_row(workers: int, balance: str, state: str, row: dict[str, Any], base: float) -> None:
    efficiency = row["tasks/s"] / (workers * base) if base else float("nan")
    print(
        f"{workers:>7} {balance if workers > 1 else '-':>9} {state:>7} {row['tasks/s']:>8.1f} {efficiency:>6.2f} "
        f"{row['p50 over']:>8.1f} {row['p99 over']:>8.1f} {row['CPU ms/task']:>7.2f} {row['balance']:>7.2f} "
        f"{row['errors']:>4} {row['machine busy']:>5.0%} {row['client cores']:>5.1f} {row['fake cores']:>5.2f} | "
        f"{row['steady rate']:>7.1f} {row['steady p50']:>8.1f} {row['steady p99']:>8.1f} "
        f"{row['steady errors']:>4} | {os.getloadavg()[0]:>5.2f}",
        flush=True,
    )


def warn_unfilled(row: dict[str, Any]) -> None:
    """The efficiency divides by one worker's tasks/s, which is its capacity only if the closed loop
    kept its core busy: on a fast 2-core VM, 32 sockets kept one worker with Redis at 73% of a core
    (each socket waiting on its own task's round trips), and two workers showed 0.65 against 0.82
    with 128 sockets."""
    used = row["tasks/s"] * row["CPU ms/task"] / 1000
    if used >= 0.9:
        return
    if row["machine busy"] >= 0.9:
        why = "the machine was full (the load, or something else, took the rest): the box is the limit"
    else:
        why = "the closed loop did not fill it, so the efficiencies below say more about the clients' latency"
        why += " than the workers; raise --concurrency"
    print(f"        one worker used {used:.0%} of a core: {why}", flush=True)


def main(options: argparse.Namespace) -> None:
    raise_fd_limit()
    if shutil.which("redis-server") is None:
        raise SystemExit("bench.scaling needs redis-server (apt-get install redis-server)")
    with upstreams(options.fake_procs, pages=options.pages) as fakes:
        redis: RedisServer = start_redis()
        cluster: RedisCluster | None = start_redis_cluster() if "cluster" in options.state else None
        env = start_server_env(fakes.tavily_url, fakes.google_url, fakes.pages_hosts)
        cores = sorted(os.sched_getaffinity(0))
        pinned = "; each row's server on cores of its own (--pin)" if options.pin else ""
        print(
            f"{cpu_topology()}; closed loop: {options.concurrency} sockets for {options.seconds:g} s; steady: "
            f"{options.sockets} sockets at {options.rate:g} x the closed loop's tasks/s; overheads in ms; "
            f"{options.fake_procs} fake upstream processes{pinned}"
        )
        print(
            f"{'workers':>7} {'balance':>9} {'state':>7} {'tasks/s':>8} {'eff':>6} {'p50 over':>8} {'p99 over':>8} "
            f"{'CPU ms':>7} {'spread':>7} {'err':>4} {'busy':>5} {'cli':>5} {'fakes':>5} | "
            f"{'rate/s':>7} {'p50 over':>8} {'p99 over':>8} {'err':>4} | "
            f"{'load':>5}"
        )
        base: dict[str, float] = {}  # tasks/s of one worker, per state
        try:
            for workers, balance, state in configurations(options):
                server_env = dict(env)
                if state == "redis":
                    server_env["FEDRESEARCH_REDIS_URL"] = redis.url
                elif state == "cluster" and cluster is not None:
                    server_env.update(FEDRESEARCH_REDIS_URL=cluster.url, FEDRESEARCH_REDIS_CLUSTER="true")
                server_cores = None
                if options.pin:
                    if workers >= len(cores):
                        print(f"{workers:>7} workers: skipped, no core left for the load (--pin)", flush=True)
                        continue
                    server_cores, load_cores = set(cores[:workers]), set(cores[workers:])
                    load = [os.getpid(), *fakes.pids, redis.process.pid]
                    pin(load + ([process.pid for process in cluster.processes] if cluster else []), load_cores)
                server = start_server(workers, balance, server_env, server_cores)
                try:
                    row = measure(server, fakes, options, f"{workers}{balance}{state}")
                finally:
                    server.stop()
                if workers == 1:
                    base[state] = row["tasks/s"]
                print_row(workers, balance, state, row, base.get(state, 0.0) if state != "process" else 0.0)
                if workers == 1 and state != "process":
                    warn_unfilled(row)
        finally:
            redis.stop()
            if cluster is not None:
                cluster.stop()


def numbers(text: str) -> list[int]:
    return [int(n) for n in re.split(r"[ ,]+", text.strip())]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=numbers, default=[1, 2])
    parser.add_argument("--balance", type=lambda text: text.split(","), default=["reuseport", "shared"])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--sockets", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=0.5, help="steady arrivals as a fraction of capacity")
    parser.add_argument("--client-procs", type=int, default=1)
    parser.add_argument(
        "--state", type=lambda text: text.split(","), default=["redis"], help="redis, cluster or both (redis,cluster)"
    )
    parser.add_argument(
        "--fake-procs", type=int, default=fake_processes_for_this_machine(), help="processes answering as the fakes"
    )
    parser.add_argument("--pin", action="store_true", help="each row's server on cores of its own, the load on others")
    parser.add_argument("--pages", action="store_true", help="each task reads the 6 pages behind its results")
    main(parser.parse_args())
