"""Library v1: the numpy encoder, hybrid search, filters, and isolation in every mode."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedresearch.library.embeddings import load_encoder
from fedresearch.library.facade import Library
from fedresearch.library.formats import Document, Section
from fedresearch.library.ingest import ingest
from fedresearch.library.search import SearchFilters
from tests.conftest import EXAMPLES

REFERENCE = json.loads((Path(__file__).parent / "data" / "minilm_reference.json").read_text())


@pytest.fixture(scope="module")
def numpy_encoder():
    return load_encoder(backend="numpy")


@pytest.mark.parametrize("backend", ["onnxruntime", "numpy"])
def test_both_encoders_match_sentence_transformers(encoder, numpy_encoder, backend):
    chosen = encoder if backend == "onnxruntime" else numpy_encoder
    assert chosen.backend == backend
    vectors = chosen.encode(REFERENCE["texts"], batch_size=4)  # mixed lengths: padding, truncation, Chinese
    reference = np.array(REFERENCE["vectors"], dtype=np.float32)
    assert np.abs(vectors - reference).max() < 1e-5
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


@pytest.fixture
def library(library_location, encoder):
    library = Library(library_location, encoder=encoder)
    ingest(library, "alice", [EXAMPLES])
    return library


def titles(items):
    return [item.display_title for item in items]


def test_dense_finds_meaning_that_shares_no_words(library):
    query = "merging the ordered outputs of several search systems into one list"
    dense = titles(library.search("alice", query, "biblio", 3, mode="dense"))
    assert any("Fusion" in title for title in dense)


def test_hybrid_ranks_and_scores_mean_similarity(library):
    items = library.search("alice", "reciprocal rank fusion", "biblio", 5)
    assert items[0].doi == "10.1145/1571941.1572114"
    assert all(0.0 <= item.score <= 1.0 for item in items)
    assert items[0].score > 0.5  # a strong match is a strong score, whatever the query
    weak = library.search("alice", "chocolate cake recipe with strawberries", "biblio", 3)
    assert all(item.score < 0.3 for item in weak)


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
def test_filters_hold_in_every_mode(library, mode):
    years = SearchFilters(year_min=2019, year_max=2020)
    in_range = library.search("alice", "retrieval", "biblio", 20, mode, years)
    assert in_range and all(2019 <= i.year <= 2020 for i in in_range)
    by_author = library.search("alice", "retrieval", "biblio", 20, mode, SearchFilters(authors=("omar khattab",)))
    assert titles(by_author) == [t for t in titles(by_author) if t.startswith("ColBERT")] and by_author
    by_tag = library.search("alice", "retrieval", None, 20, mode, SearchFilters(tags=("RAG",)))
    assert by_tag and all("rag" in [t.lower() for t in i.tags] for i in by_tag)
    document = by_tag[0].document_id
    only = library.search("alice", "retrieval", None, 20, mode, SearchFilters(document_ids=(document,)))
    assert {i.document_id for i in only} == {document}


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
def test_isolation_in_every_mode(tmp_path, encoder, mode, library_location):
    library = Library(library_location, encoder=encoder)
    secret = tmp_path / "secret.md"
    secret.write_text("# Alice only\n\nThe zebrafish experiment results are confidential.\n")
    ingest(library, "alice", [secret])
    ingest(library, "bob", [EXAMPLES])
    for kind in (None, "biblio", "highlight", "file"):
        found = library.search("bob", "zebrafish experiment confidential", kind, 100, mode)
        assert not any("zebrafish" in item.text for item in found)
    assert library.search("carol", "zebrafish", None, 10, mode) == []


def test_a_second_process_sees_writes_and_deletes(tmp_path, encoder, library_location):
    reader = Library(library_location, encoder=encoder)
    assert reader.search("alice", "quokka marsupial", None, 5) == []
    writer = Library(library_location, encoder=encoder)  # as `fedresearch ingest` beside a running server
    note = tmp_path / "quokka.md"
    note.write_text("# Quokka\n\nThe quokka is a small marsupial from Rottnest Island.\n")
    ingest(writer, "alice", [note])
    for mode in ("bm25", "dense"):
        assert reader.search("alice", "quokka marsupial", None, 5, mode)[0].text.startswith("The quokka")
    writer.delete_document("alice", writer.list_documents("alice")[0].id)
    for mode in ("bm25", "dense", "hybrid"):
        assert reader.search("alice", "quokka marsupial", None, 5, mode) == []


def test_a_deleted_documents_vectors_never_stand_for_the_one_that_takes_its_ids(tmp_path, encoder, library_location):
    """SQLite gives a deleted document's passage ids to the next one: a cached matrix caught up by
    appending what was new kept the old note's vectors under the cooking note's ids (it scored 0.80
    for rank fusion and 0.04 for pasta)."""
    reader = Library(library_location, encoder=encoder)  # a server's: it keeps the user's vectors
    writer = Library(library_location, encoder=encoder)  # `fedresearch ingest`, or an upload elsewhere
    fusion, cooking = tmp_path / "fusion.md", tmp_path / "cooking.md"
    fusion.write_text("# Fusion\n\nReciprocal rank fusion sums one over sixty plus the rank across rankings.\n")
    cooking.write_text("# Pasta\n\nBoil the pasta in salted water for nine minutes, then drain it.\n")
    ingest(writer, "alice", [fusion])
    assert reader.search("alice", "reciprocal rank fusion", None, 5, "dense")[0].text.startswith("Reciprocal")
    writer.delete_document("alice", writer.list_documents("alice")[0].id)
    ingest(writer, "alice", [cooking])
    (found,) = reader.search("alice", "how long to boil pasta", None, 5, "dense")
    assert found.text.startswith("Boil the pasta") and found.cosine is not None and found.cosine > 0.4
    (unrelated,) = reader.search("alice", "reciprocal rank fusion", None, 5, "dense")
    assert unrelated.cosine is not None and unrelated.cosine < 0.3


def test_a_library_built_without_vectors_gets_them_on_the_next_ingest(encoder, library_location):
    plain = Library(library_location)
    ingest(plain, "alice", [EXAMPLES])
    upgraded = Library(library_location, encoder=encoder)
    assert upgraded.search("alice", "reciprocal rank fusion", "biblio", 3)[0].document_id
    assert upgraded.search("alice", "reciprocal rank fusion", "biblio", 3, mode="dense") == []
    report = ingest(upgraded, "alice", [EXAMPLES])
    assert report.added == 0 and report.unchanged > 0
    query = "merging the ordered outputs of several search systems into one list"
    assert any("Fusion" in t for t in titles(upgraded.search("alice", query, "biblio", 3, mode="dense")))


def test_the_vectors_a_process_keeps_are_bounded_in_bytes_least_recently_searched_first(encoder, tmp_path):
    library = Library(tmp_path / "library", encoder=encoder, vector_cache_mb=1)
    # 300 passages a user: 0.46 MB of vectors and 10 kB of ids each, so 1 MiB holds two users
    words = ["marsupial", "wombat", "quokka", "burrow", "night", "grass"]
    for user in "abcd":
        notes = [
            Document("highlight", f"{user}{i}", "", [Section(f"{user} note {i}: {words[i % 6]}")]) for i in range(300)
        ]
        library.add_documents(user, notes)
    cache = library.embedded._vectors
    assert cache is not None
    fresh = {user: library.search(user, "a wombat at night", None, 5, "dense") for user in "abcd"}
    assert cache.users == ["c", "d"]  # a and b went, the oldest first, as c and d came
    assert cache.held_bytes <= 2**20
    library.search("c", "quokka", None, 5, "dense")  # c searched again: now d is the older
    library.search("a", "quokka", None, 5, "dense")
    assert cache.users == ["c", "a"]
    for user in "abcd":  # reloaded as needed, the same answers
        assert library.search(user, "a wombat at night", None, 5, "dense") == fresh[user]
    assert all(item.text.startswith(f"{user} note") for user in "abcd" for item in fresh[user])


def test_a_user_larger_than_the_vector_bound_is_still_searched(encoder, tmp_path):
    library = Library(tmp_path / "library", encoder=encoder, vector_cache_mb=1)
    notes = [Document("highlight", f"n{i}", "", [Section(f"note {i} on burrows and wombats")]) for i in range(800)]
    library.add_documents("alice", notes)  # 1.2 MB of vectors
    library.add_documents("bob", notes[:10])
    assert len(library.search("alice", "wombat burrows", None, 5, "dense")) == 5
    cache = library.embedded._vectors
    assert cache is not None and cache.users == ["alice"] and cache.held_bytes > 2**20
    assert len(library.search("bob", "wombat burrows", None, 5, "dense")) == 5
    assert cache.users == ["bob"]
