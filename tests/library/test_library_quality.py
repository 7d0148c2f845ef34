"""A sanity floor on a fixed MED subset: search must find judged documents. Not the benchmark (bench/)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.quality import load_collection
from fedresearch.library.facade import Library
from fedresearch.library.formats import Document, Section

MED = Path(__file__).resolve().parents[3] / "shared" / "datasets" / "med"
QUERIES = ["q1", "q2", "q3", "q4"]


def ndcg_at_10(ranked: list[str], relevant: set[str]) -> float:
    gains = sum(1 / math.log2(i + 2) for i, doc in enumerate(ranked[:10]) if doc in relevant)
    ideal = sum(1 / math.log2(i + 2) for i in range(min(10, len(relevant))))
    return gains / ideal


@pytest.mark.skipif(not MED.is_dir(), reason="../shared/datasets is not beside this checkout")
def test_hybrid_search_clears_a_floor_on_med(encoder, library_location):
    corpus, queries, qrels = load_collection(MED)
    judged = {doc for q in QUERIES for doc in qrels[q]}
    subset = [doc for doc in corpus if doc["_id"] in judged] + [doc for doc in corpus if doc["_id"] not in judged][:60]
    library = Library(library_location, encoder=encoder)
    library.add_documents(
        "u", [Document(kind="biblio", source=d["_id"], title="", sections=[Section(d["text"])]) for d in subset]
    )
    source_of = {info.id: info.source for info in library.list_documents("u")}
    scores = {}
    for mode in ("bm25", "dense", "hybrid"):
        per_query = []
        for query in QUERIES:
            ranked = list(
                dict.fromkeys(
                    source_of[passage.document_id]
                    for passage in library.search("u", queries[query], "biblio", 30, mode)
                )
            )
            per_query.append(ndcg_at_10(ranked, set(qrels[query])))
        scores[mode] = sum(per_query) / len(per_query)
    assert min(scores.values()) >= 0.5, scores
    assert scores["hybrid"] >= min(scores["bm25"], scores["dense"]) - 0.05, scores  # fusion does not break ranking
