"""What only the PostgreSQL store has: its schema's versioning, and the HNSW path for large users."""

from __future__ import annotations

import psycopg
import pytest

from fedresearch.core.settings import Settings
from fedresearch.library.embedded import Library
from fedresearch.library.ingest import ingest
from fedresearch.library.postgres import LibraryDatabaseError, PostgresStore
from fedresearch.library.search import SearchFilters
from tests.conftest import EXAMPLES


def test_the_schema_is_made_once_and_a_newer_one_is_refused(postgres_url):
    Library(postgres_url).close()
    Library(postgres_url).close()  # idempotent: the second open changes nothing
    with psycopg.connect(postgres_url, autocommit=True) as db:
        assert db.execute("SELECT count(*) FROM library_schema").fetchone() == (1,)
        db.execute("UPDATE library_schema SET version = version + 1")
    with pytest.raises(LibraryDatabaseError, match="newer than this fedresearch"):
        Library(postgres_url)


def test_the_hnsw_path_finds_what_the_exact_scan_finds_and_keeps_filters(postgres_url, encoder):
    library = Library(postgres_url, encoder=encoder)
    ingest(library, "alice", [EXAMPLES])
    ingest(library, "bob", [EXAMPLES])  # another user's rows share the index; they must not leak
    store = library.store
    assert isinstance(store, PostgresStore)
    query = "merging the ordered outputs of several search systems into one list"
    exact = library.search("alice", query, None, 10, mode="dense")
    store.hnsw_from = 0  # every user is "large": the HNSW index answers
    approximate = library.search("alice", query, None, 10, mode="dense")
    assert [p.chunk_id for p in approximate] == [p.chunk_id for p in exact]
    years = library.search("alice", "retrieval", "biblio", 20, "dense", SearchFilters(year_min=2019, year_max=2020))
    assert years and all(2019 <= p.year <= 2020 for p in years)
    owned = {d.id for d in library.list_documents("alice")}
    assert {p.document_id for p in library.search("alice", query, None, 100, mode="dense")} <= owned


def test_a_library_url_must_be_postgresql(tmp_path):
    with pytest.raises(ValueError, match="must be a postgresql:// URL"):
        Settings(_env_file=None, FEDRESEARCH_LIBRARY_URL="mysql://somewhere/db")
    assert Settings(
        _env_file=None, FEDRESEARCH_LIBRARY_URL="", FEDRESEARCH_DATA_DIR=str(tmp_path)
    ).library_location == (tmp_path / "library")
