"""Chunk size, chosen without looking at the collection it is reported on.

    python -m bench.chunking [--sizes 100,220,400] [--group 6] [--collections med,cisi]

MED and CISI documents are abstracts of one passage each, so they cannot tell chunk sizes apart.
This builds long documents from them: each collection's abstracts are grouped by topic (greedily:
an abstract and its `group - 1` nearest unassigned neighbours under TF-IDF cosine, in corpus
order) and each group is joined into one document of one section, the paragraphs in group order,
like a review that covers several studies of one topic. A long document is as relevant to a query
as the number of its abstracts the collection's judgments mark relevant (graded gains).

For every size (overlap a fifth of it; the shipped 220 words keep their 40), the long documents are
ingested with real embeddings, and BM25, dense and hybrid (the shipped document-level fusion) are
scored at document level (nDCG@10, Recall@100). The leave-one-out lines pick the size best for
hybrid on one collection and report it on the other.

Chunking is switched by replacing the function embedded.py chunks with: a benchmark-only switch,
not a setting.
"""

from __future__ import annotations

import argparse
import functools
import math
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from bench.quality import DEFAULT_DATASETS, DEPTH, USER, Run, leave_one_out, load_collection, measure
from fedresearch.core.text import STOPWORDS, tokens
from fedresearch.library import embedded
from fedresearch.library.chunking import chunk_sections
from fedresearch.library.embeddings import load_encoder
from fedresearch.library.formats import Document, Section
from fedresearch.library.search import SearchFilters, fuse_documents

SHIPPED = (220, 40)


def tfidf(texts: list[str]) -> np.ndarray:
    """Unit-length TF-IDF rows (log term frequency, smoothed idf) over the texts' content words."""
    counted = [Counter(w.lower() for w in tokens(text) if w.lower() not in STOPWORDS) for text in texts]
    vocabulary = {word: i for i, word in enumerate(sorted({w for c in counted for w in c}))}
    frequency = Counter(w for c in counted for w in c)
    matrix = np.zeros((len(texts), len(vocabulary)), dtype=np.float32)
    for row, counts in enumerate(counted):
        for word, count in counts.items():
            matrix[row, vocabulary[word]] = (1 + math.log(count)) * math.log((1 + len(texts)) / (1 + frequency[word]))
    return matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)


def topic_groups(corpus: list[dict], size: int) -> list[list[int]]:
    """Indexes of abstracts, in groups of `size` (the last may be smaller), each a seed and its nearest."""
    vectors = tfidf([f"{doc.get('title') or ''} {doc['text']}" for doc in corpus])
    similarity = vectors @ vectors.T
    free = np.ones(len(corpus), dtype=bool)
    groups = []
    for seed in range(len(corpus)):
        if not free[seed]:
            continue
        free[seed] = False
        candidates = np.where(free, similarity[seed], -np.inf)
        nearest = [int(i) for i in np.argsort(-candidates)[: size - 1] if free[i]]
        free[nearest] = False
        groups.append([seed, *nearest])
    return groups


def long_documents(corpus: list[dict], groups: list[list[int]]) -> tuple[list[Document], dict[str, list[str]]]:
    """One document per group, and which abstracts each holds."""
    documents, members = [], {}
    for number, group in enumerate(groups):
        source = f"group-{number}"
        members[source] = [corpus[i]["_id"] for i in group]
        text = "\n\n".join(" ".join(f"{corpus[i].get('title') or ''}. {corpus[i]['text']}".split()) for i in group)
        documents.append(Document(kind="biblio", source=source, title="", sections=[Section(text)]))
    return documents, members


def graded(qrels: dict[str, dict[str, int]], members: dict[str, list[str]]) -> dict[str, dict[str, int]]:
    judged = {}
    for query_id, relevant in qrels.items():
        gains = {source: sum(1 for a in held if relevant.get(a, 0) > 0) for source, held in members.items()}
        judged[query_id] = {source: gain for source, gain in gains.items() if gain}
    return judged


def score_size(
    documents: list[Document], queries: dict[str, str], qrels: dict[str, dict[str, int]], size: int, overlap: int
) -> dict[str, dict[str, float]]:
    """BM25, dense and hybrid at document level, with the long documents chunked at `size` words."""
    shipped = embedded.chunk_sections
    embedded.chunk_sections = functools.partial(chunk_sections, size=size, overlap=overlap)  # type: ignore[assignment]
    try:
        library = embedded.Library(Path(tempfile.mkdtemp(prefix=f"bench-chunking-{size}-")), encoder=load_encoder())
        started = time.perf_counter()
        library.add_documents(USER, documents)
        passages = library.records.db().execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
        print(f"    size {size}/{overlap}: {passages} passages in {time.perf_counter() - started:.0f} s", flush=True)
    finally:
        embedded.chunk_sections = shipped  # type: ignore[assignment]
    rows = library.records.db().execute("SELECT id, document_id FROM chunks WHERE user_id = ?", (USER,))
    document_of = {int(chunk): int(document) for chunk, document in rows}
    source_of = {info.id: info.source for info in library.list_documents(USER)}
    runs: dict[str, Run] = {"bm25": {}, "dense": {}, "hybrid": {}}
    for query_id, text in queries.items():
        bm25, dense, _ = library.rankings(USER, text, "biblio", "hybrid", SearchFilters(), DEPTH)
        for mode, kept in (("bm25", (bm25, [])), ("dense", ([], dense)), ("hybrid", (bm25, dense))):
            hits = fuse_documents(*kept, document_of, 100)
            runs[mode][query_id] = {source_of[document_of[h.chunk_id]]: 100.0 - i for i, h in enumerate(hits)}
    return {f"{mode} size={size}": measure(qrels, run) for mode, run in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", type=Path, default=DEFAULT_DATASETS)
    parser.add_argument("--collections", default="med,cisi")
    parser.add_argument("--sizes", default="100,220,400")
    parser.add_argument("--group", type=int, default=6, help="abstracts per long document")
    args = parser.parse_args()
    results: dict[str, dict[str, dict[str, float]]] = {}
    for name in args.collections.split(","):
        corpus, queries, qrels = load_collection(args.datasets / name)
        documents, members = long_documents(corpus, topic_groups(corpus, args.group))
        judged = graded(qrels, members)
        words = sum(len(d.sections[0].text.split()) for d in documents) / len(documents)
        print(f"{name}: {len(documents)} long documents of {args.group} abstracts, {words:.0f} words on average")
        results[name] = {}
        for size in (int(s) for s in args.sizes.split(",")):
            overlap = SHIPPED[1] if size == SHIPPED[0] else size // 5
            results[name] |= score_size(documents, queries, judged, size, overlap)
        for choice, scores in results[name].items():
            print(f"  {choice:<20} nDCG@10 {scores['ndcg@10']:.3f}  Recall@100 {scores['recall@100']:.3f}")
    print("\nleave one collection out (chunk size, hybrid):")
    print("\n".join(leave_one_out(results, "hybrid")))


if __name__ == "__main__":
    main()
