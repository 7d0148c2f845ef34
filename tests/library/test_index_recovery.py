"""Issue 16: SQLite is the store of record; a lost, garbage or displaced full-text index is rebuilt at open."""

from __future__ import annotations

import contextlib
import gc
import logging
import shutil
import subprocess
import sys
import threading

import aiohttp
import pytest

from fedresearch.library.facade import Library
from fedresearch.library.ingest import ingest
from tests.conftest import EXAMPLES, make_settings

QUERY = "zero-shot benchmark heterogeneous"


def _bm25_top(library: Library) -> str:
    found = library.search("alice", QUERY, "biblio", 3, mode="bm25")
    return found[0].doi if found else ""


def _delete(index):
    shutil.rmtree(index)


def _garbage_meta(index):
    (index / "meta.json").write_text("garbage")


def _file_instead(index):
    shutil.rmtree(index)
    index.write_text("not a folder")


@pytest.mark.parametrize("damage", [_delete, _garbage_meta, _file_instead])
def test_a_damaged_index_is_rebuilt_from_sqlite_at_open(tmp_path, damage):
    library = Library(tmp_path / "lib")
    ingest(library, "alice", [EXAMPLES])
    assert _bm25_top(library) == "10.48550/arxiv.2104.08663"
    expected = library.records.indexed_chunk_count()
    del library
    gc.collect()  # its tantivy reader, on a cycle, would recreate its lock file in the folder damaged next
    damage(tmp_path / "lib" / "index")
    reopened = Library(tmp_path / "lib")
    assert reopened.index.repaired is not None and "rebuilding it from SQLite" in reopened.index.repaired
    assert _bm25_top(reopened) == "10.48550/arxiv.2104.08663"
    assert reopened.records.indexed_chunk_count() == expected
    assert f"in the index: {expected}" in reopened.index.health(reopened.records)
    del reopened
    assert Library(tmp_path / "lib").index.repaired is None  # whole now: nothing more to do


def test_an_index_another_reader_holds_is_rebuilt_while_its_lock_file_comes_back(tmp_path):
    # A tantivy reader open on the folder (another worker's) recreates .tantivy-meta.lock by path
    # whenever meta.json changes; this thread does the same without pause, as that reader would at
    # the worst moment, while opening finds the index short and rebuilds it.
    library = Library(tmp_path / "lib")
    ingest(library, "alice", [EXAMPLES])
    del library
    gc.collect()
    shutil.rmtree(tmp_path / "lib" / "index")
    lock = tmp_path / "lib" / "index" / ".tantivy-meta.lock"
    stop = threading.Event()

    def recreate_lock() -> None:
        while not stop.is_set():
            with contextlib.suppress(FileNotFoundError):
                lock.touch()

    reader = threading.Thread(target=recreate_lock)
    reader.start()
    try:
        reopened = Library(tmp_path / "lib")
    finally:
        stop.set()
        reader.join()
    assert reopened.index.repaired is not None and "holds 0 of" in reopened.index.repaired
    assert _bm25_top(reopened) == "10.48550/arxiv.2104.08663"
    assert not list((tmp_path / "lib").glob("index.discarded-*"))


def test_library_check_reports_and_repairs(tmp_path):
    ingest(Library(tmp_path / "data" / "library"), "alice", [EXAMPLES])
    gc.collect()
    shutil.rmtree(tmp_path / "data" / "library" / "index")
    env = {"FEDRESEARCH_DATA_DIR": str(tmp_path / "data"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "fedresearch", "library", "check"], env=env, capture_output=True, text=True, check=True
    )
    assert "repaired: the index holds 0 of" in done.stdout, done
    again = subprocess.run(
        [sys.executable, "-m", "fedresearch", "library", "check"], env=env, capture_output=True, text=True, check=True
    )
    assert "whole when opened" in again.stdout


async def test_the_server_starts_on_a_broken_index_and_says_what_it_did(tmp_path, start_server, caplog):
    settings = make_settings(tmp_path, embeddings=False)
    ingest(Library(settings.library_dir), "alice", [EXAMPLES])
    _garbage_meta(settings.library_dir / "index")
    with caplog.at_level(logging.WARNING):
        server = await start_server(settings)
    assert any("rebuilding it from SQLite" in record.getMessage() for record in caplog.records)
    body = {"type": "biblio", "user_id": "alice", "query": QUERY, "top_k": 3}
    url = server.url + "/internal/biblios/vector_search/"
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        assert response.status == 200, await response.text()
        answer = await response.json()
    assert "2104.08663" in str(answer)


def test_an_index_linked_to_another_disk_is_rebuilt_there(tmp_path):
    """An operator's link from the data dir to an index folder elsewhere survives a rebuild: the
    index is rebuilt behind the link, not in a new folder on the data dir's disk."""
    library = Library(tmp_path / "lib")
    ingest(library, "alice", [EXAMPLES])
    del library
    gc.collect()
    elsewhere = tmp_path / "other-disk" / "index"
    elsewhere.parent.mkdir()
    shutil.move(tmp_path / "lib" / "index", elsewhere)
    (tmp_path / "lib" / "index").symlink_to(elsewhere, target_is_directory=True)
    (elsewhere / "meta.json").write_text("garbage")
    reopened = Library(tmp_path / "lib")
    assert reopened.index.repaired is not None
    assert _bm25_top(reopened) == "10.48550/arxiv.2104.08663"
    assert (tmp_path / "lib" / "index").is_symlink() and (elsewhere / "meta.json").read_text() != "garbage"
    assert sorted(p.name for p in elsewhere.parent.iterdir()) == ["index"]  # the damaged one removed
