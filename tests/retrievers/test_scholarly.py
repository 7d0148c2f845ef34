"""The scholarly adapters and the web defaults against their fakes: the fields each maps, their
errors (429 with and without Retry-After, malformed answers, empty results), and their set-up."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from fedresearch.federation.contract import RetrieverFailed, RetrieverSkipped, SearchOptions
from fedresearch.retrievers import arxiv, brave, crossref, europepmc, openalex, pubmed, searxng, semantic_scholar
from fedresearch.retrievers.scholarly import parse_xml
from tests.conftest import make_settings, registry_of, search_with
from tests.fakes import scholarly_settings
from tests.fakes.arxiv import BILLION_LAUGHS
from tests.fakes.brave import FakeBrave
from tests.fakes.crossref import dpr_crossref
from tests.fakes.openalex import FakeOpenAlex, dpr_openalex
from tests.fakes.papers import DPR_ABSTRACT, DPR_ARXIV, DPR_DOI, DPR_TITLE
from tests.fakes.pubmed import FakePubMed
from tests.fakes.semantic_scholar import FakeSemanticScholar, dpr_semantic_scholar

OPTIONS = SearchOptions(query="dense passage retrieval", max_results=5)
ACL_PDF = "https://www.aclweb.org/anthology/2020.emnlp-main.550.pdf"
DPR_AUTHOR_NAMES = ["Vladimir Karpukhin", "Barlas Oguz", "Sewon Min"]


async def search(name, tmp_path, upstreams, options=OPTIONS, **overrides):
    settings = make_settings(tmp_path, **{**scholarly_settings(upstreams), "retry_attempts": 0, **overrides})
    return await search_with(registry_of(settings)[name], options, settings)


def assert_dpr(result, *, venue_part: str, pdf: str | None = ACL_PDF):
    assert result.href == f"https://doi.org/{DPR_DOI}"
    assert result.title == DPR_TITLE and result.body.startswith("Open-domain question answering relies")
    meta = result.metadata
    assert meta["doi"] == DPR_DOI and meta["authors"] == DPR_AUTHOR_NAMES and meta["year"] == 2020
    assert venue_part in meta["venue"] and meta["abstract"] == DPR_ABSTRACT
    assert meta.get("pdf_url") == pdf
    assert result.kind == "scholarly" and result.rank == 1


async def test_openalex_maps_a_work_and_sends_the_key(tmp_path, upstreams):
    hits = await search("openalex", tmp_path, upstreams)
    assert_dpr(hits.results[0], venue_part="EMNLP")
    assert hits.results[0].metadata["arxiv_id"] == DPR_ARXIV  # from its arXiv location
    query = upstreams["openalex"].requests[0]["query"]
    assert query == {"search": "dense passage retrieval", "per-page": "5", "api_key": FakeOpenAlex.api_key}


async def test_openalex_without_a_key_is_skipped_with_the_reason(tmp_path, upstreams):
    with pytest.raises(RetrieverSkipped, match="API key since February 2026: set OPENALEX_API_KEY"):
        await search("openalex", tmp_path, upstreams, openalex_api_key=None)
    assert upstreams["openalex"].requests == []


async def test_crossref_maps_an_item_and_joins_the_polite_pool(tmp_path, upstreams):
    hits = await search("crossref", tmp_path, upstreams, crossref_mailto="ops@example.org")
    assert_dpr(hits.results[0], venue_part="Empirical Methods")  # JATS markup gone from the abstract
    query = upstreams["crossref"].requests[0]["query"]
    assert query["query"] == "dense passage retrieval" and query["rows"] == "5" and query["mailto"] == "ops@example.org"
    assert "mailto" not in (await search("crossref", tmp_path, upstreams)).results[0].metadata


def test_crossref_pdf_counts_only_under_an_open_license():
    closed = {**dpr_crossref(), "license": [{"URL": "https://www.elsevier.com/tdm/userlicense/1.0/"}]}
    hits = crossref.parse_response({"message": {"items": [closed, {"type": "component"}]}})
    assert "pdf_url" not in hits.results[0].metadata
    assert hits.warnings == ["skipped a Crossref record without title or link"]


async def test_arxiv_maps_an_entry_with_its_journal_doi(tmp_path, upstreams):
    hits = await search("arxiv", tmp_path, upstreams)
    result = hits.results[0]
    assert_dpr(result, venue_part="EMNLP 2020", pdf=f"http://arxiv.org/pdf/{DPR_ARXIV}v3")
    assert result.metadata["arxiv_id"] == DPR_ARXIV and result.metadata["url"] == f"http://arxiv.org/abs/{DPR_ARXIV}v3"
    assert result.title == DPR_TITLE  # the feed's line break inside the title is folded
    query = upstreams["arxiv"].requests[0]["query"]
    assert query["search_query"] == "all:dense passage retrieval" and query["max_results"] == "5"


def test_arxiv_entry_without_journal_doi_is_linked_to_its_abstract_page():
    from tests.fakes.arxiv import ATOM_HEAD, dpr_atom_entry

    hits = arxiv.parse_response(f"{ATOM_HEAD}{dpr_atom_entry(journal_doi=False)}</feed>")
    assert hits.results[0].href == f"http://arxiv.org/abs/{DPR_ARXIV}v3" and "doi" not in hits.results[0].metadata


async def test_semantic_scholar_maps_a_paper_with_and_without_key(tmp_path, upstreams):
    hits = await search("semantic_scholar", tmp_path, upstreams)
    assert_dpr(hits.results[0], venue_part="Empirical Methods")
    assert "x-api-key" not in {k.lower() for k in upstreams["semantic_scholar"].requests[0]["headers"]}
    await search("semantic_scholar", tmp_path, upstreams, semantic_scholar_api_key=FakeSemanticScholar.api_key)
    assert upstreams["semantic_scholar"].requests[1]["headers"]["x-api-key"] == FakeSemanticScholar.api_key
    with pytest.raises(RetrieverFailed, match=r"rejected the API key \(403\): Forbidden"):
        await search("semantic_scholar", tmp_path, upstreams, semantic_scholar_api_key="wrong")


async def test_pubmed_searches_then_fetches_with_tool_email_and_key(tmp_path, upstreams):
    overrides = {"pubmed_email": "ops@example.org", "pubmed_api_key": FakePubMed.api_key}
    hits = await search("pubmed", tmp_path, upstreams, **overrides)
    first, second = hits.results
    assert first.href == "https://doi.org/10.1038/s41586-021-03819-2"
    assert first.metadata["authors"] == ["John Jumper", "DeepMind Team"] and first.metadata["venue"] == "Nature"
    assert first.metadata["year"] == 2021 and first.metadata["pmid"] == "34265844"
    assert (
        first.body == "BACKGROUND: Proteins are essential to life. RESULTS: We validate an entirely redesigned version."
    )
    assert second.href == "https://pubmed.ncbi.nlm.nih.gov/30000000/"  # no DOI: its PubMed page
    search_query, fetch_query = (r["query"] for r in upstreams["pubmed"].requests)
    identity = {"tool": "fedresearch", "email": "ops@example.org", "api_key": FakePubMed.api_key}
    assert search_query == {
        "db": "pubmed",
        "term": "dense passage retrieval",
        "retmax": "5",
        "sort": "relevance",
        **identity,
    }
    assert fetch_query["id"] == "34265844,30000000" and fetch_query["retmode"] == "xml"
    assert identity.items() <= fetch_query.items()
    assert str(registry_of(make_settings(tmp_path, **overrides))["pubmed"].about.rate) == "10 requests per s"
    assert str(registry_of(make_settings(tmp_path))["pubmed"].about.rate) == "3 requests per s"


async def test_europepmc_maps_a_core_result_with_its_open_access_pdf(tmp_path, upstreams):
    hits = await search("europepmc", tmp_path, upstreams)
    result = hits.results[0]
    assert result.href == "https://doi.org/10.1038/s41586-021-03819-2"
    assert result.metadata["pdf_url"] == "https://europepmc.org/articles/PMC8371605?pdf=render"
    assert result.metadata["authors"] == ["Jumper J", "Evans R"] and result.metadata["venue"] == "Nature"
    assert result.body.endswith("structure can facilitate.") and result.metadata["pmcid"] == "PMC8371605"
    query = upstreams["europepmc"].requests[0]["query"]
    assert query == {"query": "dense passage retrieval", "format": "json", "resultType": "core", "pageSize": "5"}


async def test_searxng_maps_results_and_reports_silent_engines(tmp_path, upstreams):
    hits = await search("searxng", tmp_path, upstreams)
    assert [r.href for r in hits.results] == [f"https://arxiv.org/abs/{DPR_ARXIV}", "https://example.org/dpr-explained"]
    assert hits.results[0].kind == "web" and hits.results[0].score is None  # SearxNG's score is not 0..1
    assert hits.warnings == ["SearxNG engine google did not answer: timeout"]
    assert upstreams["searxng"].requests[0]["query"]["format"] == "json"


async def test_searxng_403_says_json_must_be_in_search_formats(tmp_path, upstreams):
    upstreams["searxng"].behaviour.mode = "403"
    with pytest.raises(RetrieverFailed, match=r"add json to search\.formats"):
        await search("searxng", tmp_path, upstreams)
    with pytest.raises(RetrieverSkipped, match="set SEARXNG_URL"):
        await search("searxng", tmp_path, upstreams, searxng_url=None)


async def test_brave_maps_results_and_honours_domains(tmp_path, upstreams):
    options = SearchOptions(query="dpr", max_results=2, query_domains=("arxiv.org",))
    hits = await search("brave", tmp_path, upstreams, options)
    assert [r.href for r in hits.results] == ["https://brave.example/1", "https://brave.example/2"]
    assert (
        hits.results[0].title == "Dense Passage Retrieval 1" and hits.results[0].body == "Result 1 on DPR. More on 1."
    )
    sent = upstreams["brave"].requests[0]
    assert sent["query"] == {"q": "dpr (site:arxiv.org)", "count": "2"}
    assert sent["headers"]["X-Subscription-Token"] == FakeBrave.api_key
    with pytest.raises(RetrieverFailed, match=r"Brave rejected the API key \(422 SUBSCRIPTION_TOKEN_INVALID\)"):
        await search("brave", tmp_path, upstreams, brave_api_key="wrong")
    with pytest.raises(RetrieverSkipped, match="BRAVE_API_KEY"):
        await search("brave", tmp_path, upstreams, brave_api_key=None)


ALL = ["openalex", "crossref", "arxiv", "semantic_scholar", "pubmed", "europepmc", "searxng", "brave"]


@pytest.mark.parametrize("name", ALL)
async def test_every_adapter_answers_empty_results_with_none(tmp_path, upstreams, name):
    upstreams[name].behaviour.mode = "empty"
    hits = await search(name, tmp_path, upstreams)
    assert hits.results == []


@pytest.mark.parametrize("name", ALL)
async def test_every_adapter_turns_a_malformed_answer_into_a_clear_failure(tmp_path, upstreams, name):
    upstreams[name].behaviour.mode = "malformed"
    with pytest.raises(RetrieverFailed, match=r"malformed (JSON|XML)"):
        await search(name, tmp_path, upstreams)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("retry_after", [None, "7"])
async def test_every_adapter_names_a_429_and_when_to_retry(tmp_path, upstreams, name, retry_after):
    upstreams[name].behaviour.mode = "429"
    upstreams[name].behaviour.retry_after = retry_after
    with pytest.raises(RetrieverFailed) as failure:
        await search(name, tmp_path, upstreams)
    assert failure.value.status == 429 and "429" in str(failure.value)
    adapter = registry_of(make_settings(tmp_path, **scholarly_settings(upstreams)))[name]
    if retry_after is not None:
        assert failure.value.retry_after == 7.0
    elif adapter.about.rate is not None:  # no Retry-After: the limiter's backoff says when
        assert failure.value.retry_after == adapter.about.rate.backoff_s
    assert not any(key in str(failure.value) for key in (FakeOpenAlex.api_key, FakeBrave.api_key, "127.0.0.1"))


@pytest.mark.parametrize(
    ("name", "mode", "expected"),
    [
        (
            "openalex",
            "403",
            "OpenAlex rate limit exceeded (100 requests/s) (HTTP 403): Rate limit exceeded: Slow down.",
        ),
        ("crossref", "400", "Crossref rejected the request (400): Integer specified as x but must be int"),
        ("arxiv", "400", "arXiv answered HTTP 400: max_results must be an integer"),
        ("semantic_scholar", "400", "Semantic Scholar answered HTTP 400: Unrecognized or unsupported fields"),
        ("pubmed", "error", "PubMed rejected the search: Invalid query syntax"),
        ("europepmc", "500", "Europe PMC answered HTTP 500"),
        ("brave", "500", "Brave answered (500)"),
    ],
)
async def test_upstream_errors_read_as_the_upstream_meant_them(tmp_path, upstreams, name, mode, expected):
    upstreams[name].behaviour.mode = mode
    with pytest.raises(RetrieverFailed) as failure:
        await search(name, tmp_path, upstreams)
    assert expected in str(failure.value)


def test_an_xml_bomb_is_refused_not_expanded():
    with pytest.raises(RetrieverFailed, match="malformed XML"):
        parse_xml(BILLION_LAUGHS, "arXiv")
    with pytest.raises(ET.ParseError):  # the standard library parser itself refuses it (expat >= 2.4)
        ET.fromstring(BILLION_LAUGHS)


def test_recorded_answers_parse_without_a_server():
    assert openalex.parse_response({"results": [dpr_openalex(), "junk"]}).warnings == [
        "skipped a OpenAlex record without title or link"
    ]
    assert (
        semantic_scholar.parse_response({"data": [dpr_semantic_scholar()]}).results[0].metadata["arxiv_id"] == DPR_ARXIV
    )
    assert openalex.abstract_of({"b": [1], "a": [0, 2]}) == "a b a"
    with pytest.raises(RetrieverFailed, match=r"without message\.items"):
        crossref.parse_response({"status": "ok"})


def test_recorded_pubmed_europepmc_searxng_and_brave_answers_parse_without_a_server():
    from fedresearch.federation.contract import HttpRequest
    from tests.fakes.europepmc import alphafold_europepmc
    from tests.fakes.pubmed import EFETCH_HEAD, ESEARCH_HEAD, pubmed_article
    from tests.fakes.searxng import searxng_results

    search = HttpRequest("GET", "https://e.example/entrez/eutils/esearch.fcgi", params={"tool": "t", "term": "q"})
    found = pubmed.parse_response(f"{ESEARCH_HEAD}<eSearchResult><IdList><Id>1</Id></IdList></eSearchResult>", search)
    (fetch,) = found.follow
    assert fetch.url == "https://e.example/entrez/eutils/efetch.fcgi" and fetch.params == {
        "db": "pubmed",
        "id": "1",
        "retmode": "xml",
        "rettype": "abstract",
        "tool": "t",
    }
    fetched = pubmed.parse_response(
        f"{EFETCH_HEAD}<PubmedArticleSet>{pubmed_article('1', 'T')}</PubmedArticleSet>", fetch
    )
    assert fetched.results[0].metadata["pmid"] == "1" and fetched.results[0].metadata["pmcid"] == "PMC8371605"
    with pytest.raises(RetrieverFailed, match="unexpected XML <html>"):
        pubmed.parse_response("<html/>", search)
    assert (
        europepmc.parse_response({"resultList": {"result": [alphafold_europepmc()]}}).results[0].metadata["year"]
        == 2021
    )
    assert searxng.parse_response({"results": searxng_results()}, 1).results[0].href.endswith(DPR_ARXIV)
    assert brave.parse_response({"type": "search", "web": {"results": [{"url": "https://a.example"}]}}).warnings == [
        "skipped a Brave result without url or description"
    ]
