"""Runs inside GPT-Researcher's own venv (Python 3.12): times its retrieval stage, no LLM anywhere.

Invoked by bench/fanout.py with a JSON spec on argv[1]; prints one JSON line of timings. Its Tavily
and Google URLs are hard-coded, so requests' HTTPAdapter.send is wrapped to send those two hosts to
the local fakes, and every other host is refused.
"""

import asyncio
import json
import os
import statistics
import sys
import time
from urllib.parse import urlsplit, urlunsplit

import requests.adapters

SPEC = json.loads(sys.argv[1])
REWRITE = {"api.tavily.com": SPEC["tavily"], "www.googleapis.com": SPEC["google"]}
_send = requests.adapters.HTTPAdapter.send


def redirected_send(self, request, **kwargs):
    parts = urlsplit(request.url)
    if parts.hostname in REWRITE:
        target = urlsplit(REWRITE[parts.hostname])
        request.url = urlunsplit((target.scheme, target.netloc, parts.path, parts.query, ""))
    elif parts.hostname != "127.0.0.1":
        raise requests.exceptions.ConnectionError(f"benchmark refuses host {parts.hostname}")
    return _send(self, request, **kwargs)


requests.adapters.HTTPAdapter.send = redirected_send
os.environ.update(
    TAVILY_API_KEY=SPEC["tavily_key"],
    GOOGLE_API_KEY=SPEC["google_key"],
    GOOGLE_CX_KEY=SPEC["google_cx"],
    RETRIEVER_ENDPOINT=SPEC["custom"] + "/search",
    OPENAI_API_KEY="sk-unused-no-llm-is-called",
)

from gpt_researcher import GPTResearcher  # noqa: E402  (after the transport is redirected)


async def timed(make) -> list[float]:
    times = []
    for run in range(SPEC["runs"]):
        started = time.perf_counter()
        await make(f"{SPEC['query']} {run}")
        times.append(time.perf_counter() - started)
    return times


async def main() -> None:
    os.environ["RETRIEVER"] = SPEC["retrievers"]
    researcher = GPTResearcher(query=SPEC["query"], report_type="research_report")
    conductor = researcher.research_conductor

    async def research_path(query):  # ResearchConductor's per-sub-query search
        return await conductor._search_relevant_source_urls(query)

    async def quick(query):
        return await researcher.quick_search(query, all_retrievers=True)

    research = await timed(research_path)
    quick_times = await timed(quick)
    print(json.dumps({"research": statistics.median(research), "quick": statistics.median(quick_times)}))


asyncio.run(main())
