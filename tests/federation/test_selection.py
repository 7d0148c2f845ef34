"""Which retrievers run, for whom: the header rules (docs/protocol.md, "Headers")."""

from __future__ import annotations

import pytest

from fedresearch.core.errors import RequestError
from fedresearch.core.models import ResearchRequest
from fedresearch.core.settings import Settings
from fedresearch.federation.planning import follow_up_request, plan_request, scope_of
from fedresearch.federation.registry import build_registry
from fedresearch.retrievers import ADAPTERS
from tests.conftest import make_settings, registry_of

REGISTRY = build_registry(Settings(_env_file=None), ADAPTERS)


def plan(tmp_path, headers, report_source=None, **overrides):
    body = {"task": "q", "headers": headers}
    if report_source:
        body["report_source"] = report_source
    settings = make_settings(tmp_path, **overrides)  # the adapters too: which are configured depends on it
    return plan_request(ResearchRequest.model_validate(body), settings, registry_of(settings))


def test_names_are_trimmed_case_insensitive_and_deduplicated(tmp_path):
    assert plan(tmp_path, {"retrievers": " Tavily , google,TAVILY"}).names == ["tavily", "google"]
    assert plan(tmp_path, {"retriever": "google"}).names == ["google"]


def test_report_source_never_removes_a_named_retriever(tmp_path):
    chosen = plan(tmp_path, {"retrievers": "internal_biblio,tavily", "user_id": "u"}, report_source="web")
    assert chosen.names == ["internal_biblio", "tavily"]


LIBRARY = ["internal_biblio", "internal_highlight", "internal_file"]


def test_report_source_picks_defaults_only_when_none_named(tmp_path):
    assert plan(tmp_path, {"user_id": "u"}, report_source="local").names == LIBRARY
    # none configured: all, to say why
    assert plan(tmp_path, {}, report_source="web").names == ["tavily", "google", "searxng", "brave"]
    assert plan(tmp_path, {}, report_source="web", tavily_api_key="k").names == ["tavily"]
    assert plan(tmp_path, {}, report_source="web", brave_api_key="k", searxng_url="http://s.example").names == [
        "searxng",
        "brave",
    ]
    assert plan(tmp_path, {"user_id": "u"}, report_source="hybrid", tavily_api_key="k").names == [*LIBRARY, "tavily"]
    assert plan(tmp_path, {"user_id": "u"}).names == LIBRARY  # DEFAULT_RETRIEVERS is `library`
    assert plan(tmp_path, {"user_id": "u"}, default_retrievers=["tavily", "internal_file"]).names == [
        "tavily",
        "internal_file",
    ]


def test_header_errors_are_precise(tmp_path):
    with pytest.raises(RequestError, match="internal_api_type 'notes'"):
        plan(tmp_path, {"user_id": "u", "internal_api_type": "notes"})
    assert plan(tmp_path, {"user_id": "u", "internal_api_type": "File"}).options.internal_api_type == "file"
    with pytest.raises(RequestError, match="INTERNAL_API_ALLOWED_HOSTS"):
        plan(tmp_path, {"user_id": "u", "internal_api_base_url": "http://169.254.169.254/"})
    allowed = plan(
        tmp_path,
        {"user_id": "u", "internal_api_base_url": "https://lit.example.org"},
        internal_api_allowed_hosts=["lit.example.org"],
    )
    assert allowed.options.internal_api_base_url == "https://lit.example.org"


def test_per_request_keys_are_kept_out_of_the_repr(tmp_path):
    chosen = plan(tmp_path, {"retrievers": "tavily", "tavily_api_key": "tvly-secret"})
    assert chosen.options.credential("tavily_api_key") == "tvly-secret"
    assert "tvly-secret" not in repr(chosen.options)


def test_aliases_expand_inside_named_lists_and_unknown_names_list_them(tmp_path):
    assert plan(tmp_path, {"retrievers": "library, tavily", "user_id": "u"}).names == [*LIBRARY, "tavily"]
    assert plan(tmp_path, {"retrievers": "internal_file,library", "user_id": "u"}).names == [
        "internal_file",
        "internal_biblio",
        "internal_highlight",
    ]
    with pytest.raises(RequestError, match=r"unknown retriever 'bing'.*aliases: library, scholar, web"):
        plan(tmp_path, {"retrievers": "bing"})


def test_an_adapter_sees_only_the_keys_it_declares(tmp_path):
    chosen = plan(tmp_path, {"retrievers": "tavily,google", "tavily_api_key": "t", "google_api_key": "g"})
    tavily, google = REGISTRY["tavily"].about, REGISTRY["google"].about
    assert dict(chosen.options.for_adapter(tavily).credentials) == {"tavily_api_key": "t"}
    assert dict(chosen.options.for_adapter(google).credentials) == {"google_api_key": "g"}


def test_a_jobs_scope_replans_its_follow_up_searches_without_its_keys(tmp_path):
    """What a job keeps for chat about its report (in a file or Redis, read by any worker) plans the
    same retrievers, library and options again, and holds none of the keys the task was sent."""
    settings = make_settings(tmp_path, internal_api_allowed_hosts=["lit.example"])
    headers = {
        "retrievers": "library,tavily",
        "user_id": "u",
        "internal_api_type": "highlight",
        "internal_api_base_url": "https://lit.example/api",
        "tavily_api_key": "tvly-secret",
    }
    body = {"task": "q", "headers": headers, "query_domains": ["arxiv.org"], "max_search_results": 7}
    task = plan_request(ResearchRequest.model_validate(body), settings, REGISTRY)
    scope = scope_of(task, REGISTRY)
    assert "tvly-secret" not in repr(scope) and task.options.credentials == {"tavily_api_key": "tvly-secret"}
    again = plan_request(follow_up_request("a follow-up", scope, "u"), settings, REGISTRY)
    assert again.names == task.names == [*LIBRARY, "tavily"]
    assert again.options.query == "a follow-up" and again.options.credentials == {}
    for name in ("user_id", "internal_api_type", "internal_api_base_url", "query_domains", "max_results"):
        assert getattr(again.options, name) == getattr(task.options, name), name
    # a base URL carrying a password is not kept, nor the library retrievers it served
    headers["internal_api_base_url"] = "https://me:pw@lit.example/api"
    task = plan_request(ResearchRequest.model_validate(body), settings, REGISTRY)
    scope = scope_of(task, REGISTRY)
    assert scope["retrievers"] == ["tavily"] and "pw" not in repr(scope)
