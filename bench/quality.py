"""Retrieval quality of the embedded library on the BEIR-layout collections in ../shared/datasets.

    python -m bench.quality [--datasets DIR] [--collections med,cisi]

Prints nDCG@10 and Recall@100 (pytrec_eval) for BM25, dense and hybrid search, and the ingest
rate with real embeddings. The collections are ingested as biblio records of one user; passages
are scored per document by their best passage.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import pytrec_eval

from fedresearch.library.embedded import Library
from fedresearch.library.embeddings import load_encoder
from fedresearch.library.formats import Document, Section

DEFAULT_DATASETS = Path(__file__).resolve().parents[2] / "shared" / "datasets"
MODES = ("bm25", "dense", "hybrid")


def load_collection(directory: Path) -> tuple[list[dict], dict[str, str], dict[str, dict[str, int]]]:
    corpus = [json.loads(line) for line in (directory / "corpus.jsonl").open()]
    queries = {q["_id"]: q["text"] for q in map(json.loads, (directory / "queries.jsonl").open())}
    qrels: dict[str, dict[str, int]] = {}
    for line in list((directory / "qrels-test.tsv").open())[1:]:
        query_id, doc_id, score = line.rstrip("\n").split("\t")
        qrels.setdefault(query_id, {})[doc_id] = int(score)
    return corpus, {q: t for q, t in queries.items() if q in qrels}, qrels


def evaluate(name: str, directory: Path, encoder) -> dict[str, dict[str, float]]:
    corpus, queries, qrels = load_collection(directory)
    library = Library(Path(tempfile.mkdtemp(prefix=f"bench-{name}-")), encoder=encoder)
    documents = [
        Document(kind="biblio", source=doc["_id"], title=doc.get("title") or "", sections=[Section(doc["text"])])
        for doc in corpus
    ]
    started = time.perf_counter()
    library.add_documents("bench", documents)
    seconds = time.perf_counter() - started
    passages = library.records.db().execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
    print(
        f"{name}: {len(corpus)} documents, {passages} passages ingested in {seconds:.1f} s "
        f"({passages / seconds:.1f} passages/s with embeddings)",
        flush=True,
    )
    source_of = {info.id: info.source for info in library.list_documents("bench")}
    scores: dict[str, dict[str, float]] = {}
    for mode in MODES:
        run: dict[str, dict[str, float]] = {}
        for query_id, text in queries.items():
            ranked: dict[str, float] = {}
            for position, passage in enumerate(library.search("bench", text, "biblio", 300, mode)):
                ranked.setdefault(source_of[passage.document_id], 1000.0 - position)
            run[query_id] = dict(list(ranked.items())[:100])
        measures = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"}).evaluate(run)
        scores[mode] = {
            "ndcg@10": sum(m["ndcg_cut_10"] for m in measures.values()) / len(measures),
            "recall@100": sum(m["recall_100"] for m in measures.values()) / len(measures),
        }
        print(
            f"  {mode:<7} nDCG@10 {scores[mode]['ndcg@10']:.3f}  Recall@100 {scores[mode]['recall@100']:.3f}",
            flush=True,
        )
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", type=Path, default=DEFAULT_DATASETS)
    parser.add_argument("--collections", default="med,cisi")
    args = parser.parse_args()
    encoder = load_encoder()
    if encoder is None:
        raise SystemExit("the embedding model is not installed (make installs it)")
    results = {name: evaluate(name, args.datasets / name, encoder) for name in args.collections.split(",")}
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
