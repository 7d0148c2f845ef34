"""Issue 16: ingests running at once take turns on the library's write lock; one that cannot get
it in time says so before storing anything, never with a traceback or a half-written file."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fedresearch.library import locking
from fedresearch.library.facade import Library
from fedresearch.library.ingest import ingest


def _notes(folder, prefix: str, count: int):
    folder.mkdir()
    for number in range(count):
        (folder / f"{prefix}{number}.md").write_text(f"# {prefix} {number}\n\nNote {number} on rank fusion.\n")
    return folder


def test_two_ingests_at_once_both_finish(tmp_path):
    env = {**os.environ, "FEDRESEARCH_DATA_DIR": str(tmp_path / "data"), "FEDRESEARCH_EMBEDDINGS": "false"}
    command = [sys.executable, "-m", "fedresearch", "ingest", "--user", "alice"]
    runs = [
        subprocess.Popen(
            [*command, str(_notes(tmp_path / name, name, 40))],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    for run in runs:
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0 and "40 documents added" in out and "Traceback" not in err, (out, err)
    library = Library(tmp_path / "data" / "library")
    assert len(library.list_documents("alice")) == 80
    assert library.index.repaired is None
    assert library.records.indexed_chunk_count() == len(library.search("alice", "rank fusion", top_k=100, mode="bm25"))


def test_an_ingest_that_cannot_get_the_lock_stores_nothing_and_says_why(tmp_path, monkeypatch):
    library = Library(tmp_path / "lib")
    notes = _notes(tmp_path / "notes", "n", 3)
    monkeypatch.setattr(locking, "WRITER_WAIT_S", 0.3)
    busy = pytest.raises(locking.IndexBusy, match=f"process {os.getpid()} .* nothing more was stored")
    with locking.exclusive(tmp_path / "lib" / "write.lock"), busy:  # held as another process's ingest would
        ingest(library, "alice", [notes])
    assert library.list_documents("alice") == [] and library.records.unindexed() == []
    assert ingest(library, "alice", [notes]).added == 3
