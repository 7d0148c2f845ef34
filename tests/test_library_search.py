"""Library v1: the numpy encoder, hybrid search, filters, and isolation in every mode."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from library.ingest import ingest
from library.store import Library, SearchFilters
from tests.conftest import EXAMPLES

REFERENCE = json.loads((Path(__file__).parent / "data" / "minilm_reference.json").read_text())


def test_numpy_encoder_matches_sentence_transformers(encoder):
    vectors = encoder.encode(REFERENCE["texts"], batch_size=4)  # mixed lengths: padding, truncation, Chinese
    reference = np.array(REFERENCE["vectors"], dtype=np.float32)
    assert np.abs(vectors - reference).max() < 1e-5
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


@pytest.fixture
def library(tmp_path, encoder):
    library = Library(tmp_path / "lib", encoder=encoder)
    ingest(library, "alice", [EXAMPLES])
    return library


def titles(items):
    return [item["metadata"]["title"] for item in items]


def test_dense_finds_meaning_that_shares_no_words(library):
    query = "merging the ordered outputs of several search systems into one list"
    dense = titles(library.search_items("alice", "biblio", query, 3, mode="dense"))
    assert any("Fusion" in title for title in dense)


def test_hybrid_ranks_and_scores_mean_similarity(library):
    items = library.search_items("alice", "biblio", "reciprocal rank fusion", 5)
    assert items[0]["metadata"]["structured_data"]["doi"] == "10.1145/1571941.1572114"
    assert all(0.0 <= item["score"] <= 1.0 for item in items)
    assert items[0]["score"] > 0.5  # a strong match is a strong score, whatever the query
    weak = library.search_items("alice", "biblio", "chocolate cake recipe with strawberries", 3)
    assert all(item["score"] < 0.3 for item in weak)


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
def test_filters_hold_in_every_mode(library, mode):
    years = SearchFilters(year_min=2019, year_max=2020)
    in_range = library.search_items("alice", "biblio", "retrieval", 20, mode, years)
    assert in_range and all(2019 <= i["metadata"]["structured_data"]["year"] <= 2020 for i in in_range)
    by_author = library.search_items("alice", "biblio", "retrieval", 20, mode, SearchFilters(authors=("omar khattab",)))
    assert titles(by_author) == [t for t in titles(by_author) if t.startswith("ColBERT")] and by_author
    by_tag = library.search_items("alice", None, "retrieval", 20, mode, SearchFilters(tags=("RAG",)))
    assert by_tag and all("rag" in [t.lower() for t in i["metadata"]["tags"]] for i in by_tag)
    document = by_tag[0]["metadata"]["document_id"]
    only = library.search_items("alice", None, "retrieval", 20, mode, SearchFilters(document_ids=(document,)))
    assert {i["metadata"]["document_id"] for i in only} == {document}


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
def test_isolation_in_every_mode(tmp_path, encoder, mode):
    library = Library(tmp_path / "lib", encoder=encoder)
    secret = tmp_path / "secret.md"
    secret.write_text("# Alice only\n\nThe zebrafish experiment results are confidential.\n")
    ingest(library, "alice", [secret])
    ingest(library, "bob", [EXAMPLES])
    for kind in (None, "biblio", "highlight", "file"):
        found = library.search_items("bob", kind, "zebrafish experiment confidential", 100, mode)
        assert not any("zebrafish" in item["content"] for item in found)
    assert library.search_items("carol", None, "zebrafish", 10, mode) == []


def test_a_second_process_sees_writes_and_deletes(tmp_path, encoder):
    reader = Library(tmp_path / "lib", encoder=encoder)
    assert reader.search_items("alice", None, "quokka marsupial", 5) == []
    writer = Library(tmp_path / "lib", encoder=encoder)  # as `fedresearch ingest` beside a running server
    note = tmp_path / "quokka.md"
    note.write_text("# Quokka\n\nThe quokka is a small marsupial from Rottnest Island.\n")
    ingest(writer, "alice", [note])
    for mode in ("bm25", "dense"):
        assert reader.search_items("alice", None, "quokka marsupial", 5, mode)[0]["content"].startswith("The quokka")
    writer.delete_document("alice", writer.list_documents("alice")[0].id)
    for mode in ("bm25", "dense", "hybrid"):
        assert reader.search_items("alice", None, "quokka marsupial", 5, mode) == []


def test_a_library_built_without_vectors_gets_them_on_the_next_ingest(tmp_path, encoder):
    plain = Library(tmp_path / "lib")
    ingest(plain, "alice", [EXAMPLES])
    upgraded = Library(tmp_path / "lib", encoder=encoder)
    assert upgraded.search_items("alice", "biblio", "reciprocal rank fusion", 3)[0]["metadata"]["biblio_id"]
    assert upgraded.search_items("alice", "biblio", "reciprocal rank fusion", 3, mode="dense") == []
    report = ingest(upgraded, "alice", [EXAMPLES])
    assert report.added == 0 and report.unchanged > 0
    query = "merging the ordered outputs of several search systems into one list"
    assert any("Fusion" in t for t in titles(upgraded.search_items("alice", "biblio", query, 3, mode="dense")))
