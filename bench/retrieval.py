"""Latency of POST /retrieval (Dify's External Knowledge API) for a knowledge base over the library.

    python -m bench.retrieval [--requests 1000]
    python -m bench.retrieval --concurrent 20 [--rounds 3]

Starts the server on 127.0.0.1 with the bundled example library, then sends sequential requests
(distinct questions cycled, so the query-vector cache is exercised as a real client would) and
prints p50/p99 of the round trip as the client sees it.

--concurrent N sends N new questions at once, `rounds` times, to a knowledge base that also
searches the web (a local server answering as Tavily does, 20 results of ~500 characters per
question, so every answer has 20 foreign records to score), and prints p50/p99 and how many
answers came back empty: once as shipped (records still waiting for the encoder 1 s into a
request keep their capped retriever score) and once embedding every record, side by side.
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
from fedresearch.knowledge import retrieval
from fedresearch.library.ingest import ingest
from fedresearch.library.open import open_library
from fedresearch.web.app import create_app
from tests.fakes.tavily import FakeTavily

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


class WebSearch(FakeTavily):
    """Tavily's answer shape with 20 long, question-specific results: nothing is cached across questions."""

    async def search(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        query = body["query"]
        results = [
            {
                "url": f"https://example.org/{abs(hash(query))}/{i}",
                "title": f"Result {i} on {query}",
                "content": f"Result {i} discusses {query}. " + "It compares retrieval methods on several corpora. " * 9,
                "score": round(0.95 - i * 0.04, 2),
                "raw_content": None,
            }
            for i in range(body.get("max_results", 5))
        ]
        return web.json_response({"query": query, "results": results, "response_time": 0.1, "images": []})


async def concurrent(clients: int, rounds: int, shipped_only: bool) -> None:
    # over 40 lines: one scenario (web fake, server, rounds, both scorings) read top to bottom
    web_search = await WebSearch().start()
    directory = Path(tempfile.mkdtemp(prefix="bench-retrieval-load-"))
    bases = directory / "kb.toml"
    bases.write_text('[knowledge_bases.lab]\nuser_id = "alice"\nretrievers = ["internal_biblio", "tavily"]\n')
    settings = Settings(
        _env_file=None,
        data_dir=directory / "data",
        knowledge_bases=bases,
        api_keys="bench-key:alice",
        upstreams={"tavily_api_key": FakeTavily.api_key, "tavily_api_base_url": web_search.url},
    )
    ingest(open_library(settings), "alice", [EXAMPLES])
    runner = web.AppRunner(create_app(settings), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/retrieval"  # type: ignore[union-attr]
    headers = {"Authorization": "Bearer bench-key", "Content-Type": "application/json"}

    async def ask(session: aiohttp.ClientSession, question: str) -> tuple[float, int]:
        body = {"knowledge_id": "lab", "query": question, "retrieval_setting": {"top_k": 10, "score_threshold": 0.0}}
        started = time.perf_counter()
        async with session.post(url, data=json.dumps(body), headers=headers) as response:
            assert response.status == 200, await response.text()
            records = (await response.json())["records"]
        return (time.perf_counter() - started) * 1000, len(records)

    shipped = retrieval._EMBED_UNTIL_S
    async with aiohttp.ClientSession() as session:
        await ask(session, "warm up")
        runs = [("as shipped", shipped)] + ([] if shipped_only else [("embedding every record", 3600.0)])
        for label, embed_until in runs:
            retrieval._EMBED_UNTIL_S = embed_until
            answers = []
            for round_ in range(rounds):
                questions = [f"{QUESTIONS[i % len(QUESTIONS)]} {label} {round_} {i}" for i in range(clients)]
                this_round = await asyncio.gather(*(ask(session, question) for question in questions))
                print(f"  round {round_ + 1}: slowest {max(t for t, _ in this_round):.0f} ms", flush=True)
                answers += this_round
            timings = sorted(t for t, _ in answers)
            p99 = timings[min(len(timings) - 1, int(len(timings) * 0.99))]
            empty = sum(1 for _, count in answers if count == 0)
            print(
                f"{clients} new questions at once x {rounds} ({label}): p50 {statistics.median(timings):.0f} ms, "
                f"p99 {p99:.0f} ms, max {timings[-1]:.0f} ms, answers without records {empty}/{len(answers)}",
                flush=True,
            )
    retrieval._EMBED_UNTIL_S = shipped
    await runner.cleanup()
    await web_search.stop()


async def library_server() -> tuple[web.AppRunner, str]:
    """A server on 127.0.0.1 with the example library behind knowledge base `lab` (key `bench-key`),
    and the URL of its /retrieval."""
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
    return runner, url


async def main(requests: int, distinct: bool) -> None:
    runner, url = await library_server()
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
    parser.add_argument("--concurrent", type=int, help="this many new questions at once, with web results to score")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shipped-only", action="store_true", help="skip the embed-everything comparison")
    arguments = parser.parse_args()
    if arguments.concurrent:
        asyncio.run(concurrent(arguments.concurrent, arguments.rounds, arguments.shipped_only))
    else:
        asyncio.run(main(arguments.requests, arguments.distinct))
