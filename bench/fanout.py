"""Retrieval-stage fan-out: fedresearch against GPT-Researcher 0.16.1 on the same fake upstreams.

    python -m bench.fanout [--runs 5]

Fake Tavily, Google and a third upstream answer after 200, 300 and 400 ms (the third is the
literature API for fedresearch and GPT-Researcher's `custom` retriever endpoint for it). Scenarios:
all healthy; Google slowed to 2 s; Tavily answering 500. For 1, 2 and 3 retrievers, the median wall
time of fedresearch's federation (no report) and of GPT-Researcher's research path (ResearchConductor's
per-sub-query search) and quick_search(all_retrievers=True); no LLM anywhere. GPT-Researcher needs
Python >= 3.12: its venv is built outside the repository on first use (BENCH_GPTR_VENV, default
/tmp/fedresearch-bench-gptr). Our upstream cache is off here so every run reaches the fakes.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import aiohttp

from fedresearch.core.settings import Settings
from fedresearch.federation.contract import SearchOptions
from fedresearch.federation.registry import build_registry
from fedresearch.federation.resilience import Guard
from fedresearch.federation.runner import Deps, federate
from fedresearch.retrievers import ADAPTERS
from tests.fakes.custom_retriever import FakeCustomRetrieverEndpoint
from tests.fakes.google import FakeGoogle
from tests.fakes.literature_api import FakeLiteratureApi
from tests.fakes.tavily import FakeTavily

VENV = Path(os.environ.get("BENCH_GPTR_VENV", "/tmp/fedresearch-bench-gptr"))
PEER = Path(__file__).resolve().parent / "gptr_peer.py"
OURS = ["tavily", "google", "internal_biblio"]
THEIRS = ["tavily", "google", "custom"]
SCENARIOS = {
    "healthy 200/300/400 ms": {},
    "google slowed to 2 s": {"google_delay": 2.0},
    "tavily answers 500": {"tavily_mode": "500"},
}


def python312() -> str:
    found = shutil.which("python3.12") or next(
        iter(sorted(glob.glob("/root/.pyenv/versions/3.12*/bin/python3.12"))), None
    )
    if found is None:
        raise SystemExit("GPT-Researcher needs Python >= 3.12; none found (set PATH or install it)")
    return found


def ensure_peer_venv() -> Path:
    python = VENV / "bin" / "python"
    if not python.exists():
        print(f"building GPT-Researcher 0.16.1's venv in {VENV} (about 2 minutes) ...", flush=True)
        subprocess.run([python312(), "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "gpt-researcher==0.16.1"], check=True)
    return python


async def ours(fakes: dict, names: list[str], runs: int) -> float:
    settings = Settings(
        _env_file=None,
        data_dir=Path(tempfile.mkdtemp()),
        upstreams={
            "tavily_api_key": FakeTavily.api_key,
            "tavily_api_base_url": fakes["tavily"].url,
            "google_api_key": FakeGoogle.api_key,
            "google_cx_key": FakeGoogle.cx,
            "google_api_base_url": fakes["google"].url,
            "internal_api_base_url": fakes["third"].url,
        },
        upstream_cache_ttl_s=0,
        breaker_suspend_s=0,
        breaker_error_suspend_s=0,
    )
    registry = build_registry(settings, ADAPTERS)
    times = []
    async with aiohttp.ClientSession() as session:
        deps = Deps(session=session, settings=settings, guard=Guard(settings))

        async def quiet(event: object) -> None:
            return None

        for run in range(runs + 1):
            options = SearchOptions(query=f"rank fusion {run}", max_results=5, user_id="bench")
            started = time.perf_counter()
            await federate(names, registry, options, deps, quiet)
            if run:  # the first run opens connections; both systems get one warm-up
                times.append(time.perf_counter() - started)
    return statistics.median(times)


async def theirs(python: Path, fakes: dict, names: list[str], runs: int) -> dict[str, float]:
    spec = {
        "tavily": fakes["tavily"].url,
        "google": fakes["google"].url,
        "custom": fakes["custom"].url,
        "tavily_key": FakeTavily.api_key,
        "google_key": FakeGoogle.api_key,
        "google_cx": FakeGoogle.cx,
        "retrievers": ",".join(names),
        "runs": runs,
        "query": "rank fusion",
    }
    process = await asyncio.create_subprocess_exec(
        str(python), str(PEER), json.dumps(spec), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await process.communicate()
    lines = [line for line in out.decode().splitlines() if line.startswith("{")]
    if process.returncode or not lines:
        raise RuntimeError(f"GPT-Researcher peer failed: {err.decode()[-2000:]}")
    return json.loads(lines[-1])


async def main(runs: int) -> None:
    python = ensure_peer_venv()
    fakes = {
        "tavily": await FakeTavily().start(),
        "google": await FakeGoogle().start(),
        "third": await FakeLiteratureApi().start(),
        "custom": await FakeCustomRetrieverEndpoint().start(),
    }
    print(
        f"{'scenario':<24} {'n':>2} {'fedresearch':>12} {'GPTR research':>14} {'GPTR quick':>11} "
        f"{'ratio research':>15} {'ratio quick':>12} {'ours - slowest':>15}"
    )
    try:
        for scenario, change in SCENARIOS.items():
            for fake in fakes.values():
                fake.behaviour.mode = "ok"
            fakes["tavily"].behaviour.delay_s = 0.2
            fakes["google"].behaviour.delay_s = change.get("google_delay", 0.3)
            fakes["third"].behaviour.delay_s = fakes["custom"].behaviour.delay_s = 0.4
            fakes["tavily"].behaviour.mode = change.get("tavily_mode", "ok")
            delays = [fakes["tavily"].behaviour.delay_s, fakes["google"].behaviour.delay_s, 0.4]
            for n in (1, 2, 3):
                mine = await ours(fakes, OURS[:n], runs)
                peer = await theirs(python, fakes, THEIRS[:n], runs)
                slowest = max(delays[:n])
                print(
                    f"{scenario:<24} {n:>2} {mine * 1000:>10.0f}ms {peer['research'] * 1000:>12.0f}ms "
                    f"{peer['quick'] * 1000:>9.0f}ms {peer['research'] / mine:>14.2f}x {peer['quick'] / mine:>11.2f}x "
                    f"{(mine - slowest) * 1000:>+13.0f}ms",
                    flush=True,
                )
    finally:
        for fake in fakes.values():
            await fake.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    asyncio.run(main(parser.parse_args().runs))
