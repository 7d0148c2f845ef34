"""One paper reached four ways (the user's library, Crossref, arXiv with its journal DOI, and a web
page at its arXiv address) is one reference, listing all four retrievers, with the scholarly
record's metadata."""

from __future__ import annotations

import aiohttp

from fedresearch.core.models import SearchResult
from fedresearch.federation.contract import SearchOptions
from fedresearch.federation.fusion import fuse
from fedresearch.federation.registry import build_registry
from fedresearch.federation.runner import Deps, federate
from fedresearch.retrievers import ADAPTERS
from tests.conftest import make_settings
from tests.fakes import scholarly_settings
from tests.fakes.papers import DPR_ARXIV, DPR_DOI

FOUR = ["internal_biblio", "crossref", "arxiv", "searxng"]


async def nothing(event):
    del event


async def test_one_paper_from_library_crossref_arxiv_and_the_web_is_one_reference(tmp_path, fakes, upstreams):
    fakes["internal"].behaviour.items = [
        {
            "content": "Our reading notes on dense passage retrieval for open-domain QA.",
            "score": 0.9,
            "metadata": {
                "biblio_id": "b-dpr",
                "structured_data": {
                    "title": "DPR (my notes)",
                    "year": 2019,
                    "authors": [{"name": "V. K."}],
                    "doi": DPR_DOI,
                },
            },
        }
    ]
    settings = make_settings(
        tmp_path, fakes, internal_api_base_url=fakes["internal"].url, **scholarly_settings(upstreams)
    )
    registry = build_registry(settings, ADAPTERS)
    options = SearchOptions(query="dense passage retrieval", max_results=5, user_id="alice")
    async with aiohttp.ClientSession() as session:
        federated = await federate(FOUR, registry, options, Deps(session, settings), nothing)
    assert [outcome.status.value for outcome in federated.outcomes] == ["done"] * 4
    results = federated.results
    about_dpr = [r for r in results if "example.org" not in r.href]
    assert len(results) == 5 and len(about_dpr) == 4  # before merging: four references to one paper

    fused = fuse(results)
    assert len(fused) == 2  # after: DPR once, and the unrelated blog post
    dpr = next(source for source in fused if source.key == f"doi:{DPR_DOI}")
    assert dpr.retrievers == FOUR and set(dpr.kinds) == {"library", "scholarly", "web"}
    assert dpr.metadata["arxiv_id"] == DPR_ARXIV and dpr.metadata["doi"] == DPR_DOI
    # the scholarly record beats the user's notes and the web page for authors, year and venue
    assert dpr.metadata["authors"] == ["Vladimir Karpukhin", "Barlas Oguz", "Sewon Min"]
    assert dpr.metadata["year"] == 2020 and "Empirical Methods" in dpr.metadata["venue"]
    assert dpr.metadata["pdf_url"] == "https://www.aclweb.org/anthology/2020.emnlp-main.550.pdf"
    assert fused[0] is dpr  # four retrievers agreeing rank it first


def paper(href, retriever, kind, **metadata):
    return SearchResult(href=href, body="b", retriever=retriever, rank=1, kind=kind, metadata=metadata)


def test_the_arxiv_doi_the_abstract_page_and_a_journal_doi_link_up():
    results = [
        paper("https://doi.org/10.48550/arXiv.2004.04906", "datacite", "scholarly"),  # arXiv's own DOI
        paper("https://www.arxiv.org/pdf/2004.04906v2.pdf", "google", "web"),
        paper("http://arxiv.org/abs/2004.04906v3", "arxiv", "scholarly", doi=DPR_DOI, arxiv_id="2004.04906"),
        paper(f"https://doi.org/{DPR_DOI}", "crossref", "scholarly", doi=DPR_DOI),
        paper("https://other.example/paper", "tavily", "web"),
    ]
    fused = fuse(results)
    assert len(fused) == 2
    assert fused[0].retrievers == ["datacite", "google", "arxiv", "crossref"] and fused[0].key == f"doi:{DPR_DOI}"


def test_a_web_snippet_never_overrides_scholarly_metadata_whatever_the_order():
    web = paper("https://arxiv.org/abs/2004.04906", "tavily", "web", year=2024, authors=["Some Blog"])
    scholarly = paper("http://arxiv.org/abs/2004.04906v1", "arxiv", "scholarly", year=2020, authors=["V. Karpukhin"])
    for results in ([web, scholarly], [scholarly, web]):
        (source,) = fuse(results)
        assert source.metadata["year"] == 2020 and source.metadata["authors"] == ["V. Karpukhin"]


async def test_the_report_cites_the_four_way_paper_as_one_reference(tmp_path, fakes, upstreams, start_server):
    from tests.conftest import report_of, run_task, websockets

    settings = make_settings(
        tmp_path, fakes, internal_api_base_url=fakes["internal"].url, **scholarly_settings(upstreams)
    )
    fakes["internal"].behaviour.items = [
        {"content": "Dense passage retrieval notes.", "metadata": {"structured_data": {"doi": DPR_DOI}}}
    ]
    server = await start_server(settings)
    async with websockets.connect(server.ws_url) as ws:
        headers = {"retrievers": ",".join(FOUR), "user_id": "alice"}
        frames = await run_task(ws, {"task": "dense passage retrieval for question answering", "headers": headers})
    references = report_of(frames).split("## References", 1)[1]
    lines = [line for line in references.splitlines() if DPR_DOI in line or DPR_ARXIV in line]
    assert len(lines) == 1, references
