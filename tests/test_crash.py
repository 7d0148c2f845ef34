"""kill -9 in the middle of a large ingest leaves a consistent, searchable library; re-running completes it."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from fedresearch.library.embedded import Library

ROOT = Path(__file__).resolve().parent.parent
FILES = 240


def count(db: Path, sql: str) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as connection:
        return connection.execute(sql).fetchone()[0]


def test_sigkill_mid_ingest_then_rerun(tmp_path, encoder):
    notes = tmp_path / "notes"
    notes.mkdir()
    for number in range(FILES):
        (notes / f"note{number:03}.md").write_text(
            f"# Note {number}\n\nObservation {number}: the specimen zx{number:03}q grew in tank {number % 7}.\n"
        )
    data = tmp_path / "data"
    env = {**os.environ, "FEDRESEARCH_DATA_DIR": str(data)}
    command = [sys.executable, "-m", "fedresearch", "ingest", "--user", "u", str(notes)]
    db = data / "library" / "library.sqlite3"

    ingest = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if db.exists() and count(db, "SELECT COUNT(*) FROM documents") >= 20:
                break
        except sqlite3.OperationalError:
            pass  # the file exists a moment before its tables do
        time.sleep(0.05)
    ingest.send_signal(signal.SIGKILL)
    ingest.wait()
    stored = count(db, "SELECT COUNT(*) FROM documents")
    assert 20 <= stored < FILES, "the kill did not land mid-ingest"

    # consistent: no document without passages, no passage without a vector
    assert (
        count(
            db, "SELECT COUNT(*) FROM documents d WHERE NOT EXISTS (SELECT 1 FROM chunks c WHERE c.document_id = d.id)"
        )
        == 0
    )
    assert count(db, "SELECT COUNT(*) FROM chunks WHERE vector IS NULL") == 0
    library = Library(data / "library", encoder=encoder)
    first = library.search("u", "specimen zx000q", None, 1)
    assert first and "zx000q" in first[0].text  # searchable while half done

    rerun = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{FILES - stored} documents added" in rerun.stdout and f"{stored} unchanged" in rerun.stdout
    assert count(db, "SELECT COUNT(*) FROM documents") == FILES
    assert count(db, "SELECT COUNT(DISTINCT source) FROM documents") == FILES
    assert count(db, "SELECT COUNT(*) FROM documents WHERE indexed = 0") == 0
    for number in (0, stored - 1, stored, FILES - 1):
        # BM25 must rank the exact note first; for vectors, every note must be in the user's matrix
        # (240 near-identical notes are not something embeddings tell apart)
        for mode, depth in (("bm25", 1), ("dense", FILES)):
            found = library.search("u", f"specimen zx{number:03}q", None, depth, mode)
            assert any(f"zx{number:03}q" in item.text for item in found), (number, mode)
