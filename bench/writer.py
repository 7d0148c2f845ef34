"""The extractive writer's time by the size of its evidence: this checkout against another, side by side.

    python -m bench.writer [--against DIR] [--rounds 5] [--sizes 6x400,20x600,20x5000,p8x5000,p8x20000,...]

Evidence is real prose: CISI's abstracts (../shared/datasets/cisi), those judged relevant to its
first question first, run together to the length wanted. A size NxC is N results whose bodies are C
characters each (6x400 is bench/scaling.py's task: two retrievers' three snippets each; 20x5000 a
search whose results carry long texts); pNxC is N results of 400-character snippets, each with a
page of C characters read behind it (FETCH_MAX_PAGES is 8 by default), which the writer cuts into
passages of 120 tokens. Each size is written as the server writes it, report and verification of
its cited sentences in one call (`write_extractive`, embeddings off), the fastest of `--repeat` (5)
in a fresh process per checkout and round, the texts' terms cache emptied before each (a task
meets texts no task met before), the two checkouts alternating, so drift on a shared machine hits
both. Printed: each size's median CPU time per report (ms) in each checkout and their ratio. DIR is
another checkout of the project (`git worktree add /tmp/old <commit>`) whose
`fedresearch.report.compose.write_extractive` takes the same arguments (main since the namespace).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.load import ROOT
from bench.quality import DEFAULT_DATASETS, load_collection

DEFAULT_SIZES = "6x400,20x600,20x5000,40x5000,20x20000,40x20000,p8x5000,p8x20000,p16x20000"

# runs in the checkout being measured, so only names every checkout since the namespace has
_CHILD = """
import gc, json, sys, time
from fedresearch.core.models import FusedResult, ReportType
from fedresearch.library.formats import Section
from fedresearch.report import evidence as passages
from fedresearch.report.compose import write_extractive
from fedresearch.report.writer import Brief, Writing
spec = json.load(sys.stdin)
gc.collect()  # the collector as a server process sets it (core/collector.py): start-up frozen, a
gc.freeze()  # young collection every 10,000 objects; CPython's defaults made single runs differ 2x
gc.set_threshold(10_000, *gc.get_threshold()[1:])
times = {}
for size, evidence in spec["sizes"].items():
    sources = [FusedResult.model_validate(result) for result in evidence["results"]]
    writing = lambda: Writing(pages={key: [Section(text)] for key, text in evidence["pages"].items()})
    write_extractive(Brief(spec["question"], ReportType.research_report, sources, [], writing()))  # warm
    spent = []
    for _ in range(spec["repeat"]):
        # a server's task reads texts no task read before: its terms are not in the cache yet
        getattr(getattr(passages, "_terms", None), "cache_clear", lambda: None)()
        started = time.process_time()
        write_extractive(Brief(spec["question"], ReportType.research_report, sources, [], writing()))
        spent.append(time.process_time() - started)
    times[size] = min(spent)
print(json.dumps(times))
"""


def results(count: int, chars: int, texts: list[str], skip: int = 0) -> list[dict[str, object]]:
    """`count` results of `chars` characters each, cut from `texts` in turn from `skip`."""
    found, at = [], skip
    for index in range(count):
        body = ""
        while len(body) < chars:
            body = f"{body} {texts[at % len(texts)]}".strip()
            at += 1
        found.append(
            {
                "key": f"https://example.org/{index}",
                "href": f"https://example.org/{index}",
                "title": f"Source {index + 1}",
                "body": body[:chars],
                "score": 1 / (index + 1),
                "retrievers": ["tavily"],
                "ranks": {"tavily": index + 1},
                "kinds": ["web"],
            }
        )
    return found


def evidence(size: str, texts: list[str]) -> dict[str, Any]:
    """The results (and pages read behind them) a size names: NxC, or pNxC."""
    count, chars = (int(part) for part in size.removeprefix("p").split("x"))
    if not size.startswith("p"):
        return {"results": results(count, chars, texts), "pages": {}}
    snippets = results(count, 400, texts)
    pages = results(count, chars, texts, skip=len(texts) // 2)
    return {"results": snippets, "pages": {s["key"]: p["body"] for s, p in zip(snippets, pages, strict=True)}}


def characters(evidence: dict[str, Any]) -> int:
    return sum(len(result["body"]) for result in evidence["results"]) + sum(map(len, evidence["pages"].values()))


def measure(checkout: Path, spec: dict[str, object]) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD],
        cwd=checkout,
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(checkout), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the writer in {checkout} failed:\n{done.stderr[-2000:]}")
    return {size: float(seconds) for size, seconds in json.loads(done.stdout).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", type=Path, help="another checkout to measure beside this one")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=5, help="reports per size and round (the fastest counts)")
    parser.add_argument("--sizes", default=DEFAULT_SIZES)
    parser.add_argument("--datasets", type=Path, default=DEFAULT_DATASETS)
    args = parser.parse_args()

    corpus, queries, qrels = load_collection(args.datasets / "cisi")
    question_id = next(iter(queries))
    relevant = [doc["text"] for doc in corpus if doc["_id"] in qrels[question_id]]
    texts = relevant + [doc["text"] for doc in corpus if doc["_id"] not in qrels[question_id]]
    sizes = {size: evidence(size, texts) for size in args.sizes.split(",")}
    spec = {"question": queries[question_id], "sizes": sizes, "repeat": args.repeat}

    checkouts = {"this": ROOT} | ({"against": args.against.resolve()} if args.against else {})
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in checkouts}
    for round_index in range(args.rounds):
        for name, checkout in checkouts.items():
            runs[name].append(measure(checkout, spec))
        print(f"round {round_index + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    header = f"{'evidence':>10} {'chars':>8} {'this (ms)':>10}"
    print(header + (f" {'against (ms)':>12} {'ratio':>6}" if args.against else ""))
    for size in sizes:
        this = statistics.median(run[size] for run in runs["this"]) * 1000
        line = f"{size:>10} {characters(sizes[size]):>8} {this:>10.2f}"
        if args.against:
            other = statistics.median(run[size] for run in runs["against"]) * 1000
            line += f" {other:>12.2f} {this / other:>6.2f}"
        print(line)


if __name__ == "__main__":
    main()
