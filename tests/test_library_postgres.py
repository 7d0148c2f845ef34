"""What only the PostgreSQL store has: its schema's versioning, and the HNSW path for large users."""

from __future__ import annotations

import psycopg
import pytest

from fedresearch.core.settings import Settings
from fedresearch.library.embedded import Library
from fedresearch.library.ingest import ingest
from fedresearch.library.postgres import LibraryDatabaseError, PostgresStore, StoredDocument, StoredPassage
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


_RECOUNTED_TERMS = (
    "SELECT f.field, f.lexeme, count(*) AS passages FROM library_passages p CROSS JOIN LATERAL"
    " (SELECT 'english' AS field, unnest(tsvector_to_array(p.english)) AS lexeme"
    " UNION ALL SELECT 'cjk', unnest(tsvector_to_array(p.cjk))) f WHERE p.user_id = %s GROUP BY 1, 2"
)
_RECOUNTED_USER = (
    "SELECT count(*), COALESCE(sum(length(english)), 0), COALESCE(sum(length(cjk)), 0)"
    " FROM library_passages WHERE user_id = %s"
)


def _counts(url: str, user: str) -> tuple[set[tuple[str, str, int]], set[tuple[str, str, int]], tuple, tuple]:
    """(kept term counts, recounted term counts, kept user totals, recounted user totals)."""
    with psycopg.connect(url) as db:
        kept = set(db.execute("SELECT field, lexeme, passages FROM library_terms WHERE user_id = %s", (user,)))
        recounted = set(db.execute(_RECOUNTED_TERMS, (user,)))
        totals = db.execute(
            "SELECT passages, english_lexemes, cjk_lexemes FROM library_users WHERE user_id = %s", (user,)
        ).fetchone()
        return kept, recounted, totals, db.execute(_RECOUNTED_USER, (user,)).fetchone()


def _document(source: str, text: str) -> StoredDocument:
    return StoredDocument(
        "highlight", source, text, source, [], None, None, None, [], {}, [StoredPassage("", None, 0, text, None)]
    )


def test_document_frequencies_stay_exact_through_ingest_replace_and_delete(postgres_url):
    library = Library(postgres_url)
    store = library.store
    assert isinstance(store, PostgresStore)
    ingest(library, "alice", [EXAMPLES])
    ingest(library, "bob", [EXAMPLES])
    kept, recounted, totals, recounted_totals = _counts(postgres_url, "alice")
    assert kept == recounted and totals == recounted_totals and totals[0] > 0
    assert any(field == "cjk" for field, _, _ in kept)  # the example library holds Chinese notes
    # replaced (a new text), a source twice in one call (the last one stays), then deleted
    assert store.write("alice", [_document("x.md", "fusion of rankings"), _document("y.md", "rankings")]) == (2, 0)
    assert store.write("alice", [_document("x.md", "rankings merged"), _document("x.md", "fused lists 融合")]) == (0, 2)
    kept, recounted, totals, recounted_totals = _counts(postgres_url, "alice")
    assert kept == recounted and totals == recounted_totals
    assert ("english", "fusion", 1) not in kept  # "fusion of rankings" was replaced
    for document in library.list_documents("alice"):
        assert store.delete("alice", document.id)
    kept, _, totals, _ = _counts(postgres_url, "alice")
    assert kept == set() and totals == (0, 0, 0)  # no lexeme is left at zero
    assert _counts(postgres_url, "bob")[0] == _counts(postgres_url, "bob")[1]  # bob's untouched
    library.close()


def test_a_version_1_library_gets_its_document_frequencies_when_upgraded(postgres_url):
    library = Library(postgres_url)
    ingest(library, "alice", [EXAMPLES])
    before = library.search("alice", "reciprocal rank fusion", None, 5, mode="bm25")
    library.close()
    with psycopg.connect(postgres_url, autocommit=True) as db:
        db.execute("DROP TABLE library_terms")
        db.execute("UPDATE library_schema SET version = 1")
    library = Library(postgres_url)
    kept, recounted, _, _ = _counts(postgres_url, "alice")
    assert kept == recounted and kept
    after = library.search("alice", "reciprocal rank fusion", None, 5, mode="bm25")
    assert [(p.chunk_id, p.score) for p in after] == [(p.chunk_id, p.score) for p in before]
    library.close()


def test_bm25_beside_the_vector_search_ranks_as_one_after_the_other(postgres_url, encoder):
    library = Library(postgres_url, encoder=encoder)
    ingest(library, "alice", [EXAMPLES])
    assert library.store.concurrent_searches
    questions = ["reciprocal rank fusion", "融合 排序", "dense retrieval with filters"]
    beside = [library.search("alice", q, None, 10, "hybrid") for q in questions]
    library.store.concurrent_searches = False
    in_turn = [library.search("alice", q, None, 10, "hybrid") for q in questions]
    assert [[(p.chunk_id, p.score) for p in found] for found in beside] == [
        [(p.chunk_id, p.score) for p in found] for found in in_turn
    ]
    assert all(beside)
    library.close()
