"""Latency of POST /retrieval (Dify's External Knowledge API) for a knowledge base over the library.

    python -m bench.dify_load [--requests 1000]
    python -m bench.dify_load --requests 60 --concurrency 20 --distinct   # Dify under load

Starts the server on 127.0.0.1 with the bundled example library, then sends requests (distinct
questions cycled, so the query-vector cache is exercised as a real client would; `--distinct`: a
new question every time), `--concurrency` at once in waves, each shaped as Dify's
ExternalDatasetService builds it (every third with a manual metadata filter: a Unix-seconds date and
a condition left empty). Prints p50/p99 of the round trip as the client sees it, the share of
answers past Dify's 5 s, and the share of 200 answers that carried records.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import aiohttp

from bench.retrieval import QUESTIONS, library_server


def dify_body(number: int, distinct: bool) -> dict[str, object]:
    question = QUESTIONS[number % len(QUESTIONS)]
    if distinct:  # every request a new question: no query-vector cache hit
        question = f"{question} {number}"
    body: dict[str, object] = {
        "retrieval_setting": {"top_k": None if number % 2 else 5, "score_threshold": 0.0},
        "query": question,
        "knowledge_id": "lab",
    }
    if number % 3 == 0:  # MetadataCondition.model_dump() of a manual filter
        body["metadata_condition"] = {
            "logical_operator": "and",
            "conditions": [
                {"name": "year", "comparison_operator": "after", "value": 946684800},
                {"name": "authors", "comparison_operator": "contains", "value": None},
            ],
        }
    return body


async def _one(session: aiohttp.ClientSession, url: str, body: dict[str, object]) -> tuple[float, int, bool]:
    headers = {"Authorization": "Bearer bench-key", "Content-Type": "application/json"}
    started = time.perf_counter()
    async with session.post(url, data=json.dumps(body), headers=headers) as response:
        answer = await response.json()
    elapsed = (time.perf_counter() - started) * 1000
    return elapsed, response.status, bool(response.status == 200 and answer.get("records"))


async def main(requests: int, distinct: bool, concurrency: int) -> None:
    runner, url = await library_server()
    outcomes: list[tuple[float, int, bool]] = []
    async with aiohttp.ClientSession() as session:
        # one request first: the encoder and the user's matrix load once per process, not per request
        await _one(session, url, {"knowledge_id": "lab", "query": "warm up", "retrieval_setting": {"top_k": 1}})
        for wave in range(0, requests, concurrency):
            numbers = range(wave, min(requests, wave + concurrency))
            outcomes += await asyncio.gather(*(_one(session, url, dify_body(n, distinct)) for n in numbers))
    await runner.cleanup()
    timings = sorted(outcome[0] for outcome in outcomes)
    p99 = timings[min(len(timings) - 1, int(len(timings) * 0.99))]
    statuses = sorted({outcome[1] for outcome in outcomes})
    with_records = sum(outcome[2] for outcome in outcomes) / len(outcomes)
    late = sum(t > 5000 for t in timings) / len(timings)
    print(
        f"{requests} POST /retrieval, {concurrency} at once (library knowledge base, Dify-shaped, "
        f"{'a new question each time' if distinct else f'{len(QUESTIONS)} questions cycled'}): "
        f"p50 {statistics.median(timings):.2f} ms, p99 {p99:.2f} ms, max {timings[-1]:.2f} ms; "
        f"past 5 s {late:.0%}; statuses {statuses}; answers with records {with_records:.0%}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--distinct", action="store_true", help="a new question every request")
    parser.add_argument("--concurrency", type=int, default=1, help="requests in flight at once")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.requests, arguments.distinct, max(1, arguments.concurrency)))
