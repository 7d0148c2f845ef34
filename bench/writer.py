"""The extractive writer's time by the size of its evidence: this checkout against another, side by side.

    python -m bench.writer [--against DIR] [--rounds 5] [--sizes 6x400,20x600,20x5000,40x5000,20x20000,40x20000]

A size NxC is N results of C characters each: real abstracts from ../shared/datasets/med, those
judged relevant to the question first (MED's first query), run together to C characters, as a
search whose pages were read hands the writer long bodies and one that read none hands it
snippets (6x400 is bench/scaling.py's task: two retrievers' three snippets each). Each size is
written as the server writes it, report and verification of its cited sentences in one call
(`write_extractive`, embeddings off), `--rounds` times in a fresh process per checkout and round,
the two checkouts alternating, so drift on a shared machine hits both. Printed: each size's median
CPU time per report (ms) in each checkout and their ratio. DIR is another checkout of the project
(`git worktree add /tmp/old <commit>`) whose `fedresearch.report.compose.write_extractive` takes the
same arguments (main since the namespace).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from bench.load import ROOT
from bench.quality import DEFAULT_DATASETS, load_collection

DEFAULT_SIZES = "6x400,20x600,20x5000,40x5000,20x20000,40x20000"

# runs in the checkout being measured, so only names every checkout since the namespace has
_CHILD = """
import json, sys, time
from fedresearch.core.models import FusedResult, ReportType
from fedresearch.report.compose import write_extractive
from fedresearch.report.writer import Writing
spec = json.load(sys.stdin)
times = {}
for size, results in spec["sizes"].items():
    sources = [FusedResult.model_validate(result) for result in results]
    write_extractive(spec["question"], ReportType.research_report, sources, [], Writing(), [])  # warm
    spent = []
    for _ in range(spec["repeat"]):
        started = time.process_time()
        write_extractive(spec["question"], ReportType.research_report, sources, [], Writing(), [])
        spent.append(time.process_time() - started)
    times[size] = min(spent)
print(json.dumps(times))
"""


def evidence(count: int, chars: int, texts: list[str]) -> list[dict[str, object]]:
    """`count` results of `chars` characters each, cut from `texts` in turn."""
    results, at = [], 0
    for index in range(count):
        body = ""
        while len(body) < chars:
            body = f"{body} {texts[at % len(texts)]}".strip()
            at += 1
        results.append(
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
    return results


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
    parser.add_argument("--repeat", type=int, default=3, help="reports per size and round (the fastest counts)")
    parser.add_argument("--sizes", default=DEFAULT_SIZES)
    parser.add_argument("--datasets", type=Path, default=DEFAULT_DATASETS)
    args = parser.parse_args()

    corpus, queries, qrels = load_collection(args.datasets / "med")
    question_id = next(iter(queries))
    relevant = [doc["text"] for doc in corpus if doc["_id"] in qrels[question_id]]
    texts = relevant + [doc["text"] for doc in corpus if doc["_id"] not in qrels[question_id]]
    sizes = {}
    for size in args.sizes.split(","):
        count, chars = (int(part) for part in size.split("x"))
        sizes[size] = evidence(count, chars, texts)
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
        count, chars = (int(part) for part in size.split("x"))
        this = statistics.median(run[size] for run in runs["this"]) * 1000
        line = f"{size:>10} {count * chars:>8} {this:>10.2f}"
        if args.against:
            other = statistics.median(run[size] for run in runs["against"]) * 1000
            line += f" {other:>12.2f} {this / other:>6.2f}"
        print(line)


if __name__ == "__main__":
    main()
