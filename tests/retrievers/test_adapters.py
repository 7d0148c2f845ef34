"""Each adapter against its fake upstream: the real answer shapes, errors, delays, malformed JSON."""

from __future__ import annotations

import pytest

from fedresearch.federation.contract import RetrieverFailed, RetrieverSkipped, SearchOptions
from fedresearch.retrievers.internal_api import parse_response
from tests.conftest import make_settings, registry_of, search_with

OPTIONS = SearchOptions(query="rank fusion", max_results=5, user_id="alice")


@pytest.fixture
def session():
    return None  # the runner opens its own; kept so the tests read as before


async def tavily_search(tmp_path, fakes, session, **overrides):
    settings = make_settings(tmp_path, fakes, **overrides)
    return await search_with(registry_of(settings)["tavily"], OPTIONS, settings)


async def test_tavily_maps_results(tmp_path, fakes, session):
    hits = await tavily_search(tmp_path, fakes, session)
    assert [r.href for r in hits.results] == [f"https://example.org/tavily/{i}" for i in (1, 2, 3)]
    assert hits.results[0].score == 0.8 and hits.results[0].rank == 1 and hits.results[0].retriever == "tavily"
    sent = fakes["tavily"].requests[0]
    assert sent["body"]["query"] == "rank fusion" and sent["body"]["max_results"] == 5
    assert "X-Tavily-Access-Mode" not in sent["headers"]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("401", "rejected the API key (401)"),
        ("429", "usage limit exceeded (429)"),
        ("432", "403/432/433"),
        ("500", "HTTP 500"),
        ("malformed", "malformed JSON"),
    ],
)
async def test_tavily_errors_are_clear_failures(tmp_path, fakes, session, mode, expected):
    fakes["tavily"].behaviour.mode = mode
    with pytest.raises(RetrieverFailed, match=expected.replace("(", r"\(").replace(")", r"\)")) as failure:
        await tavily_search(tmp_path, fakes, session)
    assert FakeKeys.none_in(str(failure.value))


async def test_tavily_unreachable_and_keyless(tmp_path, fakes, session):
    with pytest.raises(RetrieverFailed, match="Tavily unreachable: ClientConnectorError"):
        await tavily_search(tmp_path, fakes, session, tavily_api_base_url="http://127.0.0.1:9")
    with pytest.raises(RetrieverSkipped, match="TAVILY_API_KEY"):
        await tavily_search(tmp_path, fakes, session, tavily_api_key=None)
    assert fakes["tavily"].requests == []  # no keyless request ever leaves


async def test_tavily_per_request_key_overrides_the_environment(tmp_path, fakes, session):
    options = SearchOptions(query="q", max_results=3, credentials={"tavily_api_key": "tvly-test-key"})
    settings = make_settings(tmp_path, fakes, tavily_api_key="wrong")
    hits = await search_with(registry_of(settings)["tavily"], options, settings)
    assert len(hits.results) == 3


async def google_search(tmp_path, fakes, session, options=OPTIONS, **overrides):
    settings = make_settings(tmp_path, fakes, **overrides)
    return await search_with(registry_of(settings)["google"], options, settings)


async def test_google_maps_items_and_pages(tmp_path, fakes, session):
    hits = await google_search(tmp_path, fakes, session)
    assert hits.results[0].href.startswith("https://www.example.com/google/1")
    assert hits.results[0].body.startswith("Google snippet 1") and hits.results[0].title == "Google result 1"
    query = fakes["google"].requests[0]["query"]
    assert query["cx"] == "test-cx" and query["num"] == "5" and query["start"] == "1"
    fakes["google"].behaviour.mode = "empty"
    assert (await google_search(tmp_path, fakes, session)).results == []


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("429", "quota exceeded (429 RESOURCE_EXHAUSTED)"),
        ("400", "rejected the API key"),
        ("403", "403 PERMISSION_DENIED"),
        ("500", "HTTP 500"),
        ("malformed", "malformed JSON"),
    ],
)
async def test_google_errors_are_clear_and_never_leak_the_key(tmp_path, fakes, session, mode, expected):
    fakes["google"].behaviour.mode = mode
    with pytest.raises(RetrieverFailed) as failure:
        await google_search(tmp_path, fakes, session)
    assert expected in str(failure.value)
    assert FakeKeys.none_in(str(failure.value))


async def test_google_needs_key_and_cx(tmp_path, fakes, session):
    with pytest.raises(RetrieverSkipped, match="GOOGLE_CX_KEY"):
        await google_search(tmp_path, fakes, session, google_cx_key=None)


async def test_internal_api_wrapped_answers_and_skipped_items(tmp_path, fakes, session):
    fakes["internal"].behaviour.mode = "wrapped"
    fakes["internal"].behaviour.items = [
        {"href": "https://lab.example/p/1", "body": "First passage.", "score": 0.7},
        {"metadata": {"highlight_id": "h-9", "text": "A highlight."}, "score": 3.2},
        {"content": "no identifier at all"},
        {"id": "x-1"},
    ]
    settings = make_settings(tmp_path, fakes, internal_api_base_url=fakes["internal"].url)
    hits = await search_with(registry_of(settings)["internal_highlight"], OPTIONS, settings)
    assert [r.href for r in hits.results] == ["https://lab.example/p/1", "h-9"]
    assert hits.results[1].score is None and hits.results[1].metadata["raw_score"] == 3.2
    assert len(hits.warnings) == 2
    assert "without identifier" in hits.warnings[0] and "content" in hits.warnings[0]
    assert "without content" in hits.warnings[1] and "id" in hits.warnings[1]
    assert fakes["internal"].requests[0]["body"]["type"] == "highlight"


@pytest.mark.parametrize(("mode", "expected"), [("500", "HTTP 500"), ("malformed", "malformed JSON")])
async def test_internal_api_errors(tmp_path, fakes, session, mode, expected):
    fakes["internal"].behaviour.mode = mode
    settings = make_settings(tmp_path, fakes, internal_api_base_url=fakes["internal"].url)
    with pytest.raises(RetrieverFailed, match=expected):
        await search_with(registry_of(settings)["internal_biblio"], OPTIONS, settings)


def test_internal_api_field_fallbacks():
    payload = {
        "items": [
            {
                "url": "https://a.example/x",
                "abstract": "Abstract text.",
                "metadata": {
                    "structured_data": {
                        "doi": "doi:10.5555/ABC",
                        "title": "T",
                        "year": 2020,
                        "authors": [{"name": "A"}, {"name": "B"}],
                    }
                },
            },
            {"source": "src-7", "snippet": "Snippet text.", "metadata": {"title": "Meta title"}},
            {"metadata": {"file_id": 42, "content": "Page text.", "page": 3}},
            "not an object",
        ]
    }
    hits = parse_response(payload, "internal_file", "file")
    first, second, third = hits.results
    assert first.href == "https://doi.org/10.5555/abc" and first.title == "T"
    assert first.metadata["authors"] == ["A", "B"] and first.metadata["year"] == 2020
    assert second.href == "src-7" and second.body == "Snippet text." and second.title == "Meta title"
    assert third.href == "42" and third.metadata["page"] == 3  # an id stays an id
    assert hits.warnings == ["skipped a str item: not an object"]
    with pytest.raises(RetrieverFailed, match="results/data/items"):
        parse_response({"hits": []}, "internal_biblio", "biblio")


class FakeKeys:
    @staticmethod
    def none_in(text: str) -> bool:
        return not any(key in text for key in ("tvly-test-key", "AIza-test-key", "internal-test-key"))
