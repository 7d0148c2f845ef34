"""kill -9 in the middle of a large ingest leaves a consistent, searchable library; re-running completes it."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from fedresearch.library.facade import Library

ROOT = Path(__file__).resolve().parents[2]
FILES = 240
MIGRATED = 6_000  # documents of one passage: a migration of about a second


# what the test counts, in each store's tables
CHECKS = {
    "embedded": {
        "documents": "SELECT COUNT(*) FROM documents",
        "sources": "SELECT COUNT(DISTINCT source) FROM documents",
        "empty": "SELECT COUNT(*) FROM documents d WHERE NOT EXISTS"
        " (SELECT 1 FROM chunks c WHERE c.document_id = d.id)",
        "unembedded": "SELECT COUNT(*) FROM chunks WHERE vector IS NULL",
        "unindexed": "SELECT COUNT(*) FROM documents WHERE indexed = 0",
    },
    "postgres": {
        "documents": "SELECT COUNT(*) FROM library_documents",
        "sources": "SELECT COUNT(DISTINCT source) FROM library_documents",
        "empty": "SELECT COUNT(*) FROM library_documents d WHERE NOT EXISTS"
        " (SELECT 1 FROM library_passages p WHERE p.user_id = d.user_id AND p.document_id = d.id)",
        "unembedded": "SELECT COUNT(*) FROM library_passages WHERE embedding IS NULL",
        "unindexed": "SELECT 0",  # full text is written with the passages, in their transaction
    },
}


def counter(location: Path | str, data: Path) -> Callable[[str], int]:
    """count(check) for the library at `location` (embedded: the SQLite file under `data`)."""
    if isinstance(location, str):
        import psycopg

        def count_postgres(check: str) -> int:
            with psycopg.connect(location, connect_timeout=10) as connection:
                row = connection.execute(CHECKS["postgres"][check]).fetchone()
                assert row is not None
                return int(row[0])

        return count_postgres
    db = data / "library" / "library.sqlite3"

    def count_sqlite(check: str) -> int:
        if not db.exists():
            raise sqlite3.OperationalError("not created yet")
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as connection:
            return int(connection.execute(CHECKS["embedded"][check]).fetchone()[0])

    return count_sqlite


def test_sigkill_mid_ingest_then_rerun(tmp_path, encoder, library_location):
    notes = tmp_path / "notes"
    notes.mkdir()
    for number in range(FILES):
        (notes / f"note{number:03}.md").write_text(
            f"# Note {number}\n\nObservation {number}: the specimen zx{number:03}q grew in tank {number % 7}.\n"
        )
    data = tmp_path / "data"
    env = {**os.environ, "FEDRESEARCH_DATA_DIR": str(data)}
    if isinstance(library_location, str):
        env["FEDRESEARCH_LIBRARY_URL"] = library_location
    command = [sys.executable, "-m", "fedresearch", "ingest", "--user", "u", str(notes)]
    count = counter(library_location, data)

    ingest = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # the schema may not be written yet
            if count("documents") >= 20:
                break
        time.sleep(0.05)
    ingest.send_signal(signal.SIGKILL)
    ingest.wait()
    stored = count("documents")
    assert 20 <= stored < FILES, "the kill did not land mid-ingest"

    # consistent: no document without passages, no passage without a vector
    assert count("empty") == 0
    assert count("unembedded") == 0
    library = Library(data / "library" if isinstance(library_location, Path) else library_location, encoder=encoder)
    first = library.search("u", "specimen zx000q", None, 1)
    assert first and "zx000q" in first[0].text  # searchable while half done

    rerun = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{FILES - stored} documents added" in rerun.stdout and f"{stored} unchanged" in rerun.stdout
    assert count("documents") == FILES
    assert count("sources") == FILES
    assert count("unindexed") == 0
    for number in (0, stored - 1, stored, FILES - 1):
        # BM25 must rank the exact note first; for vectors, every note must be in the user's matrix
        # (240 near-identical notes are not something embeddings tell apart)
        for mode, depth in (("bm25", 1), ("dense", FILES)):
            found = library.search("u", f"specimen zx{number:03}q", None, depth, mode)
            assert any(f"zx{number:03}q" in item.text for item in found), (number, mode)


def test_sigkill_mid_copy_of_a_migration_leaves_nothing_then_rerun(tmp_path, postgres_url):
    """`library migrate` is one transaction of binary COPYs: killed while a COPY streams, the
    target holds nothing of it."""
    import numpy as np
    import psycopg

    from fedresearch.library.chunking import chunk_sections
    from fedresearch.library.formats import Document, Section
    from fedresearch.library.records import Prepared

    data = tmp_path / "data"
    embedded = Library(data / "library")
    vectors = np.random.default_rng(7).normal(size=(MIGRATED, 384)).astype(np.float32)
    for start in range(0, MIGRATED, 2000):
        documents = [
            Document("biblio", f"d{i}", f"Paper {i}", [Section(f"specimen zq{i}x grew in tank {i % 7} " * 8)])
            for i in range(start, min(start + 2000, MIGRATED))
        ]
        embedded.store.store(
            "u",
            [Prepared(d, chunk_sections(d.sections), [vectors[i].tobytes()]) for i, d in enumerate(documents, start)],
        )
    embedded.close()
    Library(postgres_url).close()  # the tables, as a server would have made them
    env = {**os.environ, "FEDRESEARCH_DATA_DIR": str(data)}
    command = [sys.executable, "-m", "fedresearch", "library", "migrate", "--to", postgres_url]

    def count(sql: str) -> int:
        with psycopg.connect(postgres_url) as db:
            row = db.execute(sql).fetchone()
            assert row is not None
            return int(row[0])

    migration = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    copied = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and migration.poll() is None:
        copied = count("SELECT COALESCE(max(tuples_processed), 0) FROM pg_stat_progress_copy")
        if copied > 0:
            break
        time.sleep(0.01)
    migration.send_signal(signal.SIGKILL)
    migration.wait()
    assert copied > 0, "the kill did not land mid-COPY"
    deadline = time.monotonic() + 30  # the server ends the killed client's transaction
    while (
        count("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'COPY library_%'") and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    for table in ("library_documents", "library_passages", "library_postings", "library_users"):
        assert count(f"SELECT count(*) FROM {table}") == 0, table

    rerun = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{MIGRATED} documents copied" in rerun.stdout
    assert count("SELECT count(*) FROM library_passages WHERE embedding IS NOT NULL") == MIGRATED
    library = Library(postgres_url)
    for number in (0, MIGRATED // 2, MIGRATED - 1):
        found = library.search("u", f"specimen zq{number}x", None, 1, "bm25")
        assert found and f"zq{number}x" in found[0].text
    library.close()
