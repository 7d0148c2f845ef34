"""Soak: mixed traffic against one server process for a bounded time, watching for leaks and stalls.

    python -m bench.soak --minutes 10 [--every 30] [--research 4] [--retrieval 2] [--hostile]

The server runs as its own process (`python server.py`, embeddings on when installed) with API
keys and two knowledge bases; fake Tavily and Google answer in 50 ms from this process. At once:
research tasks over /ws (every fourth client closes its socket mid-task, after 1 to 12 frames), POST /retrieval on a
library base and a web base, the literature API, and uploads to POST /api/documents (three new
notes each time, every fifth upload with a 0.15 MB flate-bomb PDF that must be refused). A probe
asks GET /healthz every 100 ms: its latency bounds the server loop's lag from above (it includes
this client's own delays on a shared machine).

`--hostile` adds round three's attacks: web results whose text, titles and links carry Markdown
images, raw HTML and newlines pointing at a trap server on 127.0.0.1 (every third report's PDF is
then downloaded: any request the trap sees is an error); a model (a fake OpenAI endpoint, the LLM
writer on) whose every third answer is a 4 MB stream; uploads of a 1 MB text file beside the
searches; and a client growing a saved report's chat with 60 KB messages until the server's cap
refuses it (then it starts another; so too when retention removes the entry). The server's
temporary folder and data folder sizes are printed with the rest.

Printed every `--every` seconds and at the end: the server's RSS and open file descriptors, the
probe's p99 over the interval, requests by kind and errors by kind. An error is anything but the
expected answer: an exception, an unexpected status, an error frame, a socket closed before the
report. A 429 (a per-key limit) is counted apart, as `refused`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterable, AsyncIterator, Coroutine, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web
import websockets

from bench.load import free_port, percentile, raise_fd_limit
from tests.fakes.google import FakeGoogle
from tests.fakes.openai_chat import Answer, FakeOpenAI
from tests.fakes.tavily import FakeTavily
from tests.pdfs import write_flate_bomb

ROOT = Path(__file__).resolve().parent.parent
KEY = "soak-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
BASES = """
[knowledge_bases.lab]
user_id = "alice"
retrievers = ["internal_biblio", "internal_highlight"]

[knowledge_bases.web]
user_id = "alice"
retrievers = ["tavily", "google"]
"""
TOPICS = ["rank fusion", "dense retrieval", "BM25 scoring", "query expansion", "zero-shot benchmarks"]


class Trap:
    """A server on 127.0.0.1 that records every request: a report's export must never reach it."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.runner: aiohttp.web.AppRunner | None = None
        self.url = ""

    async def start(self) -> Trap:
        app = aiohttp.web.Application()
        app.router.add_route("*", "/{tail:.*}", self.record)
        self.runner = aiohttp.web.AppRunner(app)
        await self.runner.setup()
        site = aiohttp.web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        return self

    async def record(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        self.seen.append(f"{request.method} {request.path}")
        return aiohttp.web.Response(body=b"\x89PNG\r\n\x1a\n" + b"\0" * 64, content_type="image/png")

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def hostile_results(trap: str) -> list[dict[str, Any]]:
    """Web results as a hostile page's search entry would read: Markdown images, raw HTML, a
    reference definition smuggled in through newlines in the URL, a title holding a link."""
    return [
        {
            "url": f"https://b.example/x?{number}\n\n![r][r]\n\n[r]: {trap}/ref-{number}.png",
            "title": f"Rank fusion ![t]({trap}/title.png) <img src={trap}/raw.png> {number}",
            "content": f"Rank fusion combines lexical and dense rankings well ![q]({trap}/body.png). "
            f"<img src='{trap}/html.png'> Reciprocal rank fusion needs no score normalisation {number}.",
            "score": 0.9 - number / 10,
            "raw_content": None,
        }
        for number in range(1, 4)
    ]


def model_script(body: dict[str, Any], calls: list[int]) -> Answer:
    """Every third answer 4 MB long (the writer must cut it and finish the report); the others short."""
    calls[0] += 1
    if calls[0] % 3 == 0:
        return Answer(pieces=["Rank fusion combines rankings [1]. " * 1800] * 64)
    return Answer(pieces=["## Findings\n\n", "Rank fusion combines lexical and dense rankings well [1].\n"])


class Tally:
    """Requests by kind, errors by kind (with a few examples), 429s, and /healthz latencies."""

    def __init__(self) -> None:
        self.requests: collections.Counter[str] = collections.Counter()
        self.errors: collections.Counter[str] = collections.Counter()
        self.refused: collections.Counter[str] = collections.Counter()
        self.examples: list[str] = []
        self.lags: list[float] = []

    def error(self, kind: str, what: object) -> None:
        self.errors[kind] += 1
        if len(self.examples) < 10:
            self.examples.append(f"{kind}: {what}"[:300])


def folder_mb(folder: Path) -> float:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total / 1e6


def server_figures(pid: int) -> tuple[float, int, int]:
    """RSS in MB, open file descriptors and threads of the server process."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024
    threads = next(int(line.split()[1]) for line in status if line.startswith("Threads:"))
    return rss, len(os.listdir(f"/proc/{pid}/fd")), threads


async def aiter_enumerate(frames: AsyncIterable[Any]) -> AsyncIterator[tuple[int, Any]]:
    count = 0
    async for frame in frames:
        count += 1
        yield count, frame


async def research(url: str, number: int, tally: Tally, stop: float, exports: str | None = None) -> None:
    """Tasks one after another on new sockets; every fourth client leaves each task mid-way, after
    1 to 12 frames (from the first retriever's start to the report's first paragraphs). With
    `exports` (the server's base URL), every third report's PDF is downloaded."""
    run = 0
    while time.monotonic() < stop:
        run += 1
        leaves = number % 4 == 3
        leave_after = run % 12 + 1 if leaves else -1
        kind = "research_disconnect" if leaves else "research"
        tally.requests[kind] += 1
        headers = {"retrievers": "tavily,google,internal_biblio", "user_id": "alice"}
        task = {"task": f"{TOPICS[run % len(TOPICS)]} question {number}-{run}", "headers": headers}
        try:
            async with websockets.connect(url + f"?token={KEY}", max_size=None, open_timeout=60) as ws:
                await ws.send("start " + json.dumps(task))
                async for seen, raw in aiter_enumerate(ws):
                    frame = json.loads(raw)
                    if frame.get("type") == "error":
                        tally.error(kind, frame.get("output"))
                        break
                    if frame.get("type") == "path" and exports and run % 3 == 0:
                        await export(exports, frame["output"]["pdf"], tally)
                    if frame.get("type") == "path" or seen == leave_after:
                        break
                else:
                    tally.error(kind, "socket closed before the report")
        except Exception as failure:
            tally.error(kind, repr(failure))


async def export(base: str, path: str, tally: Tally) -> None:
    """A report's PDF: 200 with a PDF, or 503 (the exports' pool busy: refused); else an error."""
    tally.requests["export"] += 1
    timeout = aiohttp.ClientTimeout(total=120)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(f"{base}/{path.lstrip('/')}", headers=AUTH) as response,
    ):
        body = await response.read()
    if response.status == 503:
        tally.refused["export"] += 1
    elif response.status != 200 or not body.startswith(b"%PDF"):
        tally.error("export", f"HTTP {response.status}: {body[:200]!r}")


async def chat_growth(session: aiohttp.ClientSession, url: str, tally: Tally, stop: float) -> None:
    """A saved report's chat grown by 60 KB messages, twice a second, until the server refuses
    more (409: the cap); then another report."""
    entry = 0
    while time.monotonic() < stop:
        entry += 1
        name = f"soak-chat-{entry}"
        async with session.post(url, json={"id": name, "question": "q?", "answer": "a" * 60_000}, headers=AUTH) as r:
            await r.read()
        while time.monotonic() < stop:
            tally.requests["chat_message"] += 1
            message = {"role": "user", "content": "词" * 20_000, "timestamp": int(time.time() * 1000)}
            try:
                async with session.post(f"{url}/{name}/chat", json=message, headers=AUTH) as response:
                    text = await response.text()
                if response.status == 409:
                    tally.refused["chat_message"] += 1
                    break
                if response.status == 404:  # retention removed the entry (REPORT_MAX_PER_USER): another
                    tally.requests["chat_entry_retired"] += 1
                    break
                if response.status != 200:
                    tally.error("chat_message", f"HTTP {response.status}: {text[:200]}")
            except Exception as failure:
                tally.error("chat_message", repr(failure))
            await asyncio.sleep(0.5)


async def post_loop(
    session: aiohttp.ClientSession, kind: str, url: str, bodies: list[dict[str, Any]], tally: Tally, stop: float
) -> None:
    """POST each body in turn until `stop`; a 200 is success, a 429 is refused, anything else an error."""
    number = 0
    while time.monotonic() < stop:
        body = bodies[number % len(bodies)] | {"query": f"{TOPICS[number % len(TOPICS)]} {number}"}
        number += 1
        tally.requests[kind] += 1
        try:
            async with session.post(url, json=body, headers=AUTH) as response:
                text = await response.text()
                if response.status == 429:
                    tally.refused[kind] += 1
                    await asyncio.sleep(float(response.headers.get("Retry-After", "1")))
                elif response.status != 200:
                    tally.error(kind, f"HTTP {response.status}: {text[:200]}")
        except Exception as failure:
            tally.error(kind, repr(failure))


async def uploads(
    session: aiohttp.ClientSession, url: str, bomb: Path, tally: Tally, stop: float, big: bool = False
) -> None:
    """Three new notes every 5 s; every fifth upload also carries the bomb, which must be refused;
    `big`: each also carries a 1 MB text file."""
    number = 0
    while time.monotonic() < stop:
        number += 1
        tally.requests["upload"] += 1
        form = aiohttp.FormData()
        for note in range(3):
            text = f"# Soak note {number}-{note}\n\nNote {number} on {TOPICS[note]} and rank fusion.\n"
            form.add_field("file", text.encode(), filename=f"soak-{number}-{note}.md")
        with_bomb = number % 5 == 0
        if big:
            text = f"# Soak long note {number}\n\n" + "Rank fusion and dense retrieval, long notes. " * 23_000
            form.add_field("file", text.encode(), filename=f"soak-long-{number}.txt")
        if with_bomb:
            form.add_field("file", bomb.read_bytes(), filename="bomb.pdf", content_type="application/pdf")
        try:
            async with session.post(url + "?user_id=alice", data=form, headers=AUTH) as response:
                answer = await response.json()
            expected = 3 + with_bomb + big
            added = answer.get("added", 0)
            if response.status == 429:
                tally.refused["upload"] += 1
            elif response.status != 201 or added != 3 + big or len(answer.get("files", [])) != expected:
                tally.error("upload", f"HTTP {response.status}: {json.dumps(answer)[:200]}")
        except Exception as failure:
            tally.error("upload", repr(failure))
        await asyncio.sleep(5)


async def probe(url: str, tally: Tally, stop: float) -> None:
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < stop:
            started = time.perf_counter()
            try:
                async with session.get(url + "/healthz") as response:
                    await response.read()
                tally.lags.append(time.perf_counter() - started)
            except Exception as failure:
                tally.error("healthz", repr(failure))
            await asyncio.sleep(0.1)


def report_line(elapsed: float, pid: int, tally: Tally, lags: list[float], directory: Path) -> str:
    rss, fds, threads = server_figures(pid)
    p99 = percentile(lags, 0.99) * 1000 if lags else float("nan")
    kinds = " ".join(f"{kind}={count}" for kind, count in sorted(tally.requests.items()))
    errors = sum(tally.errors.values())
    refused = sum(tally.refused.values())
    return (
        f"{elapsed / 60:5.1f} min  RSS {rss:6.0f} MB  fds {fds:4d}  threads {threads:3d}  healthz p99 {p99:6.0f} ms  "
        f"errors {errors}  refused {refused}  tmp {folder_mb(directory / 'tmp'):.0f} MB  "
        f"data {folder_mb(directory / 'data'):.0f} MB  load {os.getloadavg()[0]:.1f}  | {kinds}"
    )


async def report(pid: int, tally: Tally, every: float, stop: float, started: float, directory: Path) -> None:
    seen = 0
    while time.monotonic() < stop:
        await asyncio.sleep(min(every, max(0.0, stop - time.monotonic())))
        lags = tally.lags[seen:]
        line = await asyncio.to_thread(report_line, time.monotonic() - started, pid, tally, lags, directory)
        print(line, flush=True)
        seen = len(tally.lags)


def start_server(
    tavily_url: str, google_url: str, directory: Path, model_url: str | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    (directory / "knowledge.toml").write_text(BASES)
    (directory / "tmp").mkdir(exist_ok=True)
    port = free_port()
    env = {
        **os.environ,
        "FEDRESEARCH_DATA_DIR": str(directory / "data"),
        "FEDRESEARCH_PORT": str(port),
        "FEDRESEARCH_API_KEYS": f"{KEY}:alice",
        "FEDRESEARCH_KNOWLEDGE_BASES": str(directory / "knowledge.toml"),
        "TAVILY_API_KEY": FakeTavily.api_key,
        "TAVILY_API_BASE_URL": tavily_url,
        "GOOGLE_API_KEY": FakeGoogle.api_key,
        "GOOGLE_CX_KEY": FakeGoogle.cx,
        "GOOGLE_API_BASE_URL": google_url,
        "FETCH_PAGES": "false",
        "MAX_TASKS_PER_KEY": "64",
        "MAX_QUERIES_PER_KEY": "64",
        "TASK_TIMEOUT_S": "120",
        "TMPDIR": str(directory / "tmp"),  # uploads are spooled here: its size is watched
    }
    if model_url is not None:
        env |= {"LLM_BASE_URL": model_url, "LLM_MODEL": "soak-model", "LLM_API_KEY": "soak-llm-key"}
    log = (directory / "server.log").open("wb")
    server = subprocess.Popen([sys.executable, "server.py"], cwd=ROOT, env=env, stderr=log, preexec_fn=raise_fd_limit)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return server, port
        except OSError:
            time.sleep(0.1)
    server.terminate()
    raise SystemExit(f"the server did not start; see {directory / 'server.log'}")


def traffic(
    base: str, session: aiohttp.ClientSession, args: argparse.Namespace, bomb: Path, tally: Tally, stop: float
) -> Iterator[Coroutine[Any, Any, None]]:
    """Every client coroutine of the soak."""
    ws = base.replace("http://", "ws://") + "/ws"
    lab = {"knowledge_id": "lab", "retrieval_setting": {"top_k": 5, "score_threshold": 0.0}}
    web = {"knowledge_id": "web", "retrieval_setting": {"top_k": 5, "score_threshold": 0.0}}
    literature = [{"user_id": "alice", "type": kind, "top_k": 5} for kind in ("biblio", "highlight")]
    exports = base if args.hostile else None
    yield from (research(ws, number, tally, stop, exports) for number in range(args.research))
    yield from (
        post_loop(session, "retrieval", base + "/retrieval", [lab, web], tally, stop) for _ in range(args.retrieval)
    )
    yield post_loop(session, "literature", base + "/internal/biblios/vector_search/", literature, tally, stop)
    yield uploads(session, base + "/api/documents", bomb, tally, stop, big=args.hostile)
    if args.hostile:
        yield chat_growth(session, base + "/api/reports", tally, stop)
    yield probe(base, tally, stop)


async def main(args: argparse.Namespace) -> None:
    raise_fd_limit()
    # the fake model's stream cut short by the writer (as intended) is logged by its server: not news
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    directory = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    bomb = write_flate_bomb(directory / "bomb.pdf", 45_000_000)
    tavily, google = await FakeTavily().start(), await FakeGoogle().start()
    for fake in (tavily, google):
        fake.behaviour.delay_s = 0.05
    # the model streams 4 MB past any max_tokens: the writer's own cap (LLM_MAX_ANSWER_CHARS) must stop it
    trap, model = await Trap().start(), await FakeOpenAI(keeps_max_tokens=False).start()
    calls = [0]
    model.script = [lambda body: model_script(body, calls)]
    if args.hostile:
        tavily.behaviour.items = hostile_results(trap.url)
    subprocess.run(
        [sys.executable, "-m", "fedresearch", "ingest", "--user", "alice", str(ROOT / "examples" / "library")],
        env={**os.environ, "FEDRESEARCH_DATA_DIR": str(directory / "data")},
        check=True,
        capture_output=True,
    )
    server, port = start_server(tavily.url, google.url, directory, model.url if args.hostile else None)
    base, tally = f"http://127.0.0.1:{port}", Tally()
    first = server_figures(server.pid)
    print(f"server pid {server.pid}: RSS {first[0]:.0f} MB, {first[1]} fds, {first[2]} threads at start", flush=True)
    started = time.monotonic()
    stop = started + args.minutes * 60
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            clients = list(traffic(base, session, args, bomb, tally, stop))
            await asyncio.gather(report(server.pid, tally, args.every, stop, started, directory), *clients)
        await asyncio.sleep(2)  # let cancelled tasks of the last disconnects finish
        summary(server.pid, first, tally, time.monotonic() - started)
        if args.hostile:
            print(f"  trap: {len(trap.seen)} requests {trap.seen[:5]}; model: {len(model.requests)} answers")
            sizes = folder_mb(directory / "tmp"), folder_mb(directory / "data")
            print(f"  tmp {sizes[0]:.1f} MB, data {sizes[1]:.0f} MB at the end")
    finally:
        server.terminate()
        server.wait(30)
        for upstream in (tavily, google, trap, model):
            await upstream.stop()


def summary(pid: int, first: tuple[float, int, int], tally: Tally, elapsed: float) -> None:
    rss, fds, threads = server_figures(pid)
    lags = tally.lags
    print(f"\n{elapsed / 60:.1f} min, load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    print(f"server RSS {first[0]:.0f} -> {rss:.0f} MB, fds {first[1]} -> {fds}, threads {first[2]} -> {threads}")
    print(
        f"GET /healthz: {len(lags)} probes, p50 {percentile(lags, 0.5) * 1000:.0f} ms, "
        f"p99 {percentile(lags, 0.99) * 1000:.0f} ms, max {max(lags) * 1000:.0f} ms"
    )
    for kind, count in sorted(tally.requests.items()):
        print(
            f"  {kind:20} {count:6d} requests  {tally.errors[kind]:4d} errors  {tally.refused[kind]:4d} refused (429)"
        )
    if tally.errors["healthz"]:
        print(f"  {'healthz':20} {tally.errors['healthz']:4d} errors")
    for example in tally.examples:
        print(f"  error: {example}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--every", type=float, default=30.0, help="seconds between progress lines")
    parser.add_argument("--research", type=int, default=4, help="research clients at once")
    parser.add_argument("--retrieval", type=int, default=2, help="POST /retrieval clients at once")
    parser.add_argument("--hostile", action="store_true", help="round three's attacks added to the mix")
    asyncio.run(main(parser.parse_args()))
