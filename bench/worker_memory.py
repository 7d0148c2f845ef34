"""The memory a team's workers hold with the embedding model on: this checkout against another,
side by side in one run.

    python -m bench.worker_memory [--against DIR] [--workers 4] [--queries 200] [--uploads 1]

For each checkout, `fedresearch serve --workers N` starts on a fresh data dir with embeddings on
(as a fresh container does), then once more on the same data dir (as a restart or a reload does).
Each time, once every worker answers, and again after an upload to one of them (`POST
/api/documents`: the example library and a text of 256 paragraphs of about 250 tokens, which that
worker reads and embeds) and `--queries` searches of the literature API (each embeds its question),
printed: the
workers' memory summed over them, PSS (a page shared by several processes counts its share in
each, so the sum is what they take together), RSS (each counts it whole), their private
anonymous memory, the highest peak RSS of one worker while it started (VmHWM: what a container's
memory limit must hold), and the seconds from the start until every worker answered. With
`--uploads K`, K such uploads at once (as K users, each on a connection of its own: the kernel
spreads them over the workers), and printed too: the most private memory the workers held together
while they ran (sampled every 20 ms) and how long they took. DIR is another checkout (`git worktree
add /tmp/old <commit>`), started with this interpreter.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.load import ROOT, free_port, peak_rss_mb
from bench.scaling import wait_for_workers

EXAMPLES = ROOT / "examples" / "library"
QUESTIONS = [
    "federated search over several engines",
    "reciprocal rank fusion of ranked lists",
    "dense retrieval with sentence embeddings",
    "citation verification in generated reports",
    "BM25 term weighting and document length",
]


@dataclass
class Memory:
    pss_mb: float
    rss_mb: float
    anonymous_mb: float
    peak_mb: float


def memory_of(pids: set[int]) -> Memory:
    """Summed over the processes, but the peak: the highest one's (/proc/PID/smaps_rollup, status)."""
    pss = rss = anonymous = peak = 0.0
    for pid in pids:
        fields = {}
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
            name, value = line.split(":", 1)
            fields[name] = int(value.split()[0]) / 1024
        pss, rss, anonymous = pss + fields["Pss"], rss + fields["Rss"], anonymous + fields["Anonymous"]
        peak = max(peak, peak_rss_mb(pid))
    return Memory(pss, rss, anonymous, peak)


def start(checkout: Path, data_dir: Path, workers: int) -> tuple[subprocess.Popen[bytes], int, set[int], float]:
    port = free_port()
    env = {**os.environ, "FEDRESEARCH_DATA_DIR": str(data_dir), "FEDRESEARCH_EMBEDDINGS": "true"}
    env.pop("FEDRESEARCH_MODEL_CACHE_DIR", None)
    env["FEDRESEARCH_API_KEYS"] = ""
    command = [sys.executable, "-m", "fedresearch", "serve", "--port", str(port), "--workers", str(workers)]
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=checkout, env=env, stderr=subprocess.DEVNULL)
    pids = wait_for_workers(port, workers, process)
    return process, port, pids, time.perf_counter() - started


def upload(port: int, long_text: str, user: str = "bench") -> None:
    """The example library and one long text, in one upload: one worker reads and embeds them all."""

    async def send() -> None:
        form = aiohttp.FormData()
        for path in sorted(p for p in EXAMPLES.rglob("*") if p.is_file()):
            form.add_field("file", path.read_bytes(), filename=path.name)
        form.add_field("file", long_text.encode(), filename="long.md", content_type="text/markdown")
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{port}/api/documents?user_id={user}"
            async with session.post(url, data=form, timeout=aiohttp.ClientTimeout(total=600)) as answer:
                if answer.status not in (200, 201):
                    raise SystemExit(f"the upload failed: {answer.status} {await answer.text()}")

    asyncio.run(send())


def long_text() -> str:
    """256 paragraphs of about 250 tokens under headings: the passages of a long PDF."""
    words = [
        "federated",
        "retrieval",
        "merges",
        "the",
        "ranked",
        "lists",
        "of",
        "several",
        "engines",
        "into",
        "one",
        "cited",
        "answer",
    ]
    paragraphs = []
    for number in range(256):
        sentence = " ".join(words[(number + i) % len(words)] for i in range(len(words)))
        paragraphs.append(f"## Section {number}\n\n" + ". ".join([sentence.capitalize()] * 14) + ".")
    return "# A long document\n\n" + "\n\n".join(paragraphs) + "\n"


def anonymous_mb(pids: set[int]) -> float:
    total = 0.0
    for pid in pids:
        status = Path(f"/proc/{pid}/status").read_text()
        total += next(int(line.split()[1]) for line in status.splitlines() if line.startswith("RssAnon")) / 1024
    return total


def uploads_at_once(port: int, pids: set[int], uploads: int) -> tuple[float, float]:
    """`uploads` uploads at once, as as many users: the most private memory the workers held
    together meanwhile, and the seconds until the last one was stored."""
    most, done = anonymous_mb(pids), threading.Event()

    def sample() -> None:
        nonlocal most
        while not done.wait(0.02):
            most = max(most, anonymous_mb(pids))

    sampler = threading.Thread(target=sample)
    sampler.start()
    started, text = time.perf_counter(), long_text()
    try:
        with ThreadPoolExecutor(uploads) as pool:
            list(pool.map(lambda number: upload(port, text, f"bench-{number}"), range(uploads)))
    finally:
        done.set()
        sampler.join()
    return most, time.perf_counter() - started


def search(port: int, queries: int) -> None:
    for number in range(queries):
        body = {"type": "biblio", "user_id": "bench", "query": QUESTIONS[number % len(QUESTIONS)], "top_k": 10}
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/internal/biblios/vector_search/",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as answer:  # a new connection: any worker
            json.load(answer)


def measure(checkout: Path, options: argparse.Namespace) -> tuple[list[tuple[str, Memory, float]], tuple[float, float]]:
    data_dir = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    rows, during = [], (0.0, 0.0)
    try:
        for when in ("fresh data dir", "restarted"):
            process, port, pids, ready_s = start(checkout, data_dir, options.workers)
            try:
                rows.append((f"{when}: started", memory_of(pids), ready_s))
                if when == "fresh data dir" and options.uploads > 1:
                    during = uploads_at_once(port, pids, options.uploads)
                    rows.append((f"{when}: {options.uploads} uploads at once", memory_of(pids), ready_s))
                elif when == "fresh data dir":
                    upload(port, long_text())
                    rows.append((f"{when}: an upload", memory_of(pids), ready_s))
                search(port, options.queries)
                rows.append((f"{when}: {options.queries} searches", memory_of(pids), ready_s))
            finally:
                process.terminate()
                process.wait(60)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    return rows, during


def main(options: argparse.Namespace) -> None:
    checkouts = {"this checkout": ROOT}
    if options.against:
        checkouts[f"against {options.against.name}"] = options.against.resolve()
    results = {name: measure(checkout, options) for name, checkout in checkouts.items()}
    print(f"{options.workers} workers, summed over them (the peak: the highest worker's)")
    print(f"{'checkout':<22} {'when':<32} {'PSS':>8} {'RSS':>8} {'private':>8} {'peak':>7} {'ready':>6}")
    for name, (rows, _) in results.items():
        for when, memory, ready_s in rows:
            print(
                f"{name:<22} {when:<32} {memory.pss_mb:>6.0f}MB {memory.rss_mb:>6.0f}MB "
                f"{memory.anonymous_mb:>6.0f}MB {memory.peak_mb:>5.0f}MB {ready_s:>5.1f}s"
            )
    if options.uploads > 1:
        for name, (_, (most_mb, took_s)) in results.items():
            print(
                f"{name:<22} {options.uploads} uploads at once: the workers' private memory at most {most_mb:.0f} MB "
                f"together, stored in {took_s:.1f} s"
            )
    if len(results) == 2:
        ours, theirs = (rows for rows, _ in results.values())
        for (when, mine, my_ready), (_, other, their_ready) in zip(ours, theirs, strict=True):
            print(
                f"ratio {when:<32} PSS {mine.pss_mb / other.pss_mb:.2f}, peak {mine.peak_mb / other.peak_mb:.2f}, "
                f"ready {my_ready / their_ready:.2f}"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", type=Path)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--uploads", type=int, default=1, help="uploads at once, as as many users")
    main(parser.parse_args())
