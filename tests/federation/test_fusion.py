from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedresearch.core.identifiers import canonical_key
from fedresearch.core.models import SearchResult
from fedresearch.federation.fusion import fuse


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("doi:10.1145/1571941.1572114", "https://doi.org/10.1145/1571941.1572114"),
        ("https://dx.doi.org/10.1145/1571941.1572114", "http://doi.org/10.1145/1571941.1572114"),
        ("HTTPS://WWW.Example.com:443/a/b/?utm_source=x&b=2&a=1#frag", "https://example.com/a/b?a=1&b=2"),
        ("http://example.com:80/?fbclid=1&gclid=2", "http://example.com"),
    ],
)
def test_canonical_keys_merge(a, b):
    assert canonical_key(a) == canonical_key(b)


def test_ids_and_ports_stay_distinct():
    assert canonical_key("https://example.com:8443/a") != canonical_key("https://example.com/a")
    assert canonical_key("42", "biblio") != canonical_key("42", "highlight")
    assert canonical_key("https://example.com/a?page=2") != canonical_key("https://example.com/a?page=3")


def result(href, retriever, rank, body="body", title=""):
    return SearchResult(href=href, body=body, title=title, retriever=retriever, rank=rank)


def test_rrf_rewards_agreement_and_merges_fields():
    fused = fuse(
        [
            result("https://solo.example/", "tavily", 1, title="Solo"),
            result("https://both.example/", "tavily", 2, body="short"),
            result("https://www.both.example", "google", 2, body="a much longer body", title="Both"),
        ]
    )
    assert fused[0].key == "https://both.example"
    assert fused[0].retrievers == ["tavily", "google"]
    assert fused[0].body == "a much longer body" and fused[0].title == "Both"
    assert fused[0].score == pytest.approx(2 / 62)
    assert fused[1].score == pytest.approx(1 / 61)


def test_weights_change_the_order():
    results = [result("https://a.example", "tavily", 1), result("https://b.example", "google", 1)]
    assert fuse(results, {"google": 2.0})[0].href == "https://b.example"
    assert fuse(results)[0].href == "https://a.example"


_LINKISH = st.text(alphabet=st.sampled_from(list("http:/[]@?#&=.%0123456789abcdefxyz-_ é\x00")), max_size=40)


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(_LINKISH, _LINKISH.map(lambda s: "http://" + s), _LINKISH.map(lambda s: "https://[" + s)),
    st.dictionaries(st.sampled_from(["doi", "arxiv_id", "pmid", "type"]), st.one_of(_LINKISH, st.integers())),
)
def test_any_link_an_upstream_sends_is_fused(href, metadata):
    """Whatever an upstream calls a link (ports that are no number, unclosed brackets, control
    characters), fusion gives it a key: one such result ended its task with "internal error"."""
    result = SearchResult(retriever="x", href=href, title="", body="", rank=1, kind="web", metadata=metadata)
    assert [source.href for source in fuse([result])] == [href]


_ARXIV_ID = st.from_regex(r"\A(0[1-9]|1[0-2]|2[0-5])(0[1-9]|1[0-2])\.\d{4,5}\Z")
_NOISE = st.sampled_from(["", "?utm_source=x", "?utm_medium=email&utm_campaign=y", "#abstract", "?v=1#top"])


@given(_ARXIV_ID, st.sampled_from(["", "v1", "v12"]), _NOISE, st.booleans(), st.booleans(), st.booleans())
@settings(max_examples=200)
def test_every_form_of_an_arxiv_link_is_the_paper(arxiv, version, noise, www, slash, pdf):
    """Tracking parameters, a fragment, `www.`, a trailing slash, a version and /pdf never make a
    second reference of one arXiv paper."""
    host = "www.arxiv.org" if www else "arxiv.org"
    path = f"pdf/{arxiv}{version}.pdf" if pdf else f"abs/{arxiv}{version}" + ("/" if slash else "")
    assert canonical_key(f"https://{host}/{path}{noise}") == canonical_key(f"arXiv:{arxiv}") == f"arxiv:{arxiv}"
