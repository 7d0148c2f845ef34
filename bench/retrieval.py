"""Latency of POST /retrieval (Dify's External Knowledge API) for a knowledge base over the library.

    python -m bench.retrieval [--requests 1000]

Starts the server on 127.0.0.1 with the bundled example library, then sends sequential requests
(distinct questions cycled, so the query-vector cache is exercised as a real client would) and
prints p50/p99 of the round trip as the client sees it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from fedresearch.core.settings import Settings
from fedresearch.library.ingest import ingest
from fedresearch.library.open import open_library
from fedresearch.web.app import create_app

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "library"
QUESTIONS = [
    "reciprocal rank fusion",
    "dense passage retrieval",
    "how to evaluate ranking quality",
    "BM25 term weighting",
    "approximate nearest neighbour search",
    "retrieval augmented generation",
    "中文分词",
    "learning to rank",
    "query likelihood language models",
    "near duplicate detection",
]


async def main(requests: int, distinct: bool) -> None:
    directory = Path(tempfile.mkdtemp(prefix="bench-retrieval-"))
    bases = directory / "kb.toml"
    bases.write_text(
        '[knowledge_bases.lab]\nuser_id = "alice"\nretrievers = ["internal_biblio", "internal_highlight"]\n'
    )
    settings = Settings(_env_file=None, data_dir=directory / "data", knowledge_bases=bases, api_keys="bench-key:alice")
    ingest(open_library(settings), "alice", [EXAMPLES])
    runner = web.AppRunner(create_app(settings), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/retrieval"  # type: ignore[union-attr]
    headers = {"Authorization": "Bearer bench-key", "Content-Type": "application/json"}
    timings = []
    async with aiohttp.ClientSession() as session:
        for number in range(requests):
            question = QUESTIONS[number % len(QUESTIONS)]
            if distinct:  # every request a new question: no query-vector cache hit
                question = f"{question} {number}"
            body = {
                "knowledge_id": "lab",
                "query": question,
                "retrieval_setting": {"top_k": 5, "score_threshold": 0.0},
            }
            started = time.perf_counter()
            async with session.post(url, data=json.dumps(body), headers=headers) as response:
                assert response.status == 200, await response.text()
                await response.read()
            timings.append((time.perf_counter() - started) * 1000)
    await runner.cleanup()
    timings.sort()
    p99 = timings[min(len(timings) - 1, int(len(timings) * 0.99))]
    print(
        f"{requests} sequential POST /retrieval (library knowledge base, top_k 5, "
        f"{'a new question each time' if distinct else f'{len(QUESTIONS)} questions cycled'}): "
        f"p50 {statistics.median(timings):.2f} ms, p99 {p99:.2f} ms, max {timings[-1]:.2f} ms"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--distinct", action="store_true", help="a new question every request")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.requests, arguments.distinct))
