"""Papers as papers: in documents mode a paper's passages make one hit and top_k counts papers."""

from __future__ import annotations

import aiohttp
import pytest

from fedresearch.federation.contract import LibraryRequest, SearchOptions
from fedresearch.library.facade import Library
from fedresearch.library.formats import Document, Section
from fedresearch.library.search import fuse_documents
from fedresearch.retrievers.internal_api import InternalApiSettings, LiteratureApi
from tests.conftest import make_settings, settings_at

_FILLER = " ".join(
    f"Sentence {i} of this section discusses tidal energy converters and their mooring loads in storms."
    for i in range(40)
)


def papers() -> list[Document]:
    """One long paper whose every section matches, and short papers that match once each."""
    long = Document(
        "biblio",
        "long",
        "Tidal energy converters: a long review",
        [Section(f"{_FILLER} Part {n}.", heading=f"Part {n}") for n in range(4)],
    )
    short = [
        Document("biblio", f"short{i}", f"Tidal energy note {i}", [Section(f"Tidal energy converters, note {i}.")])
        for i in range(6)
    ]
    return [long, *short]


@pytest.fixture
def library(library_location, encoder):
    library = Library(library_location, encoder=encoder)
    library.add_documents("alice", papers())
    return library


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
def test_top_k_counts_papers_not_passages(library, mode):
    query = "tidal energy converters mooring loads"
    passages = library.search("alice", query, "biblio", 5, mode)
    assert len({p.document_id for p in passages}) < 5  # the long paper's chunks take several places
    papers_found = library.search("alice", query, "biblio", 5, mode, documents=True)
    ids = [p.document_id for p in papers_found]
    assert len(ids) == 5 and len(set(ids)) == 5
    assert [p.rrf for p in papers_found] == sorted((p.rrf for p in papers_found), reverse=True)
    everything = library.search("alice", query, "biblio", 50, mode, documents=True)
    assert len(everything) == 7  # every paper once, however many passages it has


def test_a_paper_is_shown_by_its_best_passage(library):
    hit = library.search("alice", "mooring loads in storms", "biblio", 1, documents=True)[0]
    assert hit.title == "Tidal energy converters: a long review" and "mooring loads" in hit.text
    assert hit.cosine is not None and 0 < hit.score <= 1


@pytest.mark.parametrize("aggregation", ["max", "top2", "rrf"])
def test_aggregations_rank_documents(aggregation):
    document_of = {1: 10, 2: 10, 3: 20, 4: 30}
    bm25 = [(1, 9.0), (2, 8.0), (3, 7.0), (99, 6.0)]  # 99: a passage of a removed document
    dense = [(3, 0.9), (1, 0.8), (4, 0.7)]
    ranked = fuse_documents(bm25, dense, document_of, 10, aggregation)
    assert [document_of[hit.chunk_id] for hit in ranked][:2] in ([10, 20], [20, 10])
    assert {hit.chunk_id for hit in ranked} == {1, 3, 4}  # one representative passage per document
    assert ranked[-1].chunk_id == 4
    assert len(fuse_documents(bm25, dense, document_of, 1, aggregation)) == 1
    if aggregation == "top2":  # two good passages beat one
        assert document_of[ranked[0].chunk_id] == 10


def test_the_internal_adapter_asks_for_papers_only_for_biblio(tmp_path):
    own = make_settings(tmp_path).upstream(InternalApiSettings)
    options = SearchOptions(query="q", max_results=5, user_id="alice")
    for adapter, documents in ((LiteratureApi("b", None, own), True), (LiteratureApi("f", "file", own), False)):
        request = adapter.build_request(options)
        assert isinstance(request, LibraryRequest) and request.documents is documents


async def test_the_literature_api_answers_papers_for_biblio(tmp_path, start_server, encoder, library_location):
    settings = settings_at(tmp_path, library_location)
    Library(settings.library_location, encoder=encoder).add_documents("alice", papers())
    server = await start_server(settings)
    body = {"type": "biblio", "user_id": "alice", "query": "tidal energy mooring loads", "top_k": 5}
    url = f"{server.url}/internal/biblios/vector_search/"
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        items = await response.json()
    ids = [item["metadata"]["biblio_id"] for item in items]
    assert len(ids) == 5 and len(set(ids)) == 5
