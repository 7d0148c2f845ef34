"""PostgreSQL's BM25 ranks as the embedded store's tantivy index does: the same top 10 with the
same scores on a fixed corpus, with filters, in Chinese, and for one user whatever others hold."""

from __future__ import annotations

import pytest

from fedresearch.library.chunking import chunk_sections
from fedresearch.library.facade import Library
from fedresearch.library.formats import Document, Section
from fedresearch.library.ingest import ingest
from fedresearch.library.postgres import StoredDocument
from fedresearch.library.postgres_bm25 import FIELDNORMS, fieldnorm
from fedresearch.library.records import Prepared
from fedresearch.library.search import SearchFilters
from tests.conftest import EXAMPLES

QUESTIONS = [
    "reciprocal rank fusion",
    "dense retrieval with filters",
    "how do we evaluate retrieval quality",
    "融合 排序",
    "检索增强生成的评估",
    "citations and sources in a report the",
    "transformer language model attention",
]
FILTERS = [
    (None, SearchFilters()),
    ("biblio", SearchFilters()),
    ("biblio", SearchFilters(year_min=2019, year_max=2021)),
    (None, SearchFilters(tags=("retrieval",))),
]


def _ranked(library: Library, user: str, question: str, kind: str | None, filters: SearchFilters) -> list:
    found = library.search(user, question, kind, 10, "bm25", filters)
    return [(p.bm25 or 0.0, p.title, p.position) for p in found]


def _same_top_10(embedded: list, postgres: list) -> None:
    """The same passages in the same order with the same scores, but for two things: tantivy adds
    the same amount to every score (the terms each passage must match: the user id, the kind, a
    tag: constants, as all passages in question hold them), and
    passages of equal score come in the order of their ids, which differ between the stores (the
    last tie may so hold other passages of that score)."""
    assert len(embedded) == len(postgres)
    if not embedded:
        return
    offset = embedded[0][0] - postgres[0][0]
    assert offset >= 0
    shifted = [(round(score - offset, 4), title, position) for score, title, position in embedded]
    ours = [(round(score, 4), title, position) for score, title, position in postgres]
    last = shifted[-1][0]
    assert sorted(e for e in shifted if e[0] > last) == sorted(e for e in ours if e[0] > last)
    assert [e[0] for e in shifted] == [e[0] for e in ours]


def test_postgres_ranks_every_question_as_the_embedded_store(postgres_url, tmp_path):
    embedded, postgres = Library(tmp_path / "library"), Library(postgres_url)
    ingest(embedded, "alice", [EXAMPLES])
    ingest(postgres, "alice", [EXAMPLES])
    # another user's documents change nothing of alice's ranking on PostgreSQL (its counts are per user)
    other = Document("note", "other.md", "Fusion", [Section("rank fusion rank fusion 融合 " * 50)])
    postgres.store.write("bob", [_stored(other)])  # type: ignore[attr-defined]
    compared = 0
    for question in QUESTIONS:
        for kind, filters in FILTERS:
            expected = _ranked(embedded, "alice", question, kind, filters)
            _same_top_10(expected, _ranked(postgres, "alice", question, kind, filters))
            compared += bool(expected)
    assert compared >= 15  # most pairs find something: the comparison is not of empty lists
    assert _ranked(postgres, "bob", "fusion", None, SearchFilters())[0][1] == "Fusion"
    assert all(p.title != "Fusion" for p in postgres.search("alice", "fusion", None, 50, "bm25"))
    embedded.close()
    postgres.close()


def test_a_common_word_beyond_the_rarest_terms_is_still_counted(postgres_url, tmp_path):
    """Passages holding only the query's commonest word reach the top 10 when the rare word is in
    two passages: the pruning reads on until no other passage can enter it."""
    embedded, postgres = Library(tmp_path / "library"), Library(postgres_url)
    texts = [f"{'network ' * (1 + i % 7) if i % 2 else 'other'} filler{i}" for i in range(4000)]
    texts += ["zebra network", "zebra"]
    documents = [Document("note", f"n{i}.md", f"n{i}", [Section(t)]) for i, t in enumerate(texts)]
    prepared = [Prepared(d, chunk_sections(d.sections), [None]) for d in documents]  # one chunk each
    for library in (embedded, postgres):
        library.store.store("alice", prepared)
    expected = _ranked(embedded, "alice", "zebra network", None, SearchFilters())
    assert len(expected) == 10 and {title for _, title, _ in expected[:2]} == {"n4000", "n4001"}
    _same_top_10(expected, _ranked(postgres, "alice", "zebra network", None, SearchFilters()))
    embedded.close()
    postgres.close()


@pytest.mark.parametrize("length", [0, 1, 39, 40, 41, 42, 43, 57, 100, 1000, 5000])
def test_lengths_are_bucketed_as_tantivy_buckets_them(length):
    bucket = fieldnorm(length)
    assert bucket in FIELDNORMS and bucket <= length < min(v for v in FIELDNORMS if v > bucket)
    assert list(FIELDNORMS[38:50]) == [38, 39, 40, 42, 44, 46, 48, 50, 52, 54, 56, 60]
    assert FIELDNORMS[96] == 2072 and FIELDNORMS[-1] > 2_000_000_000 and len(FIELDNORMS) == 256


def _stored(document: Document) -> StoredDocument:
    chunks = chunk_sections(document.sections)
    return StoredDocument.of(Prepared(document, chunks, [None] * len(chunks)))
