"""Which retrievers run, for whom: the header rules of DESIGN.md."""

from __future__ import annotations

import pytest

from core.errors import RequestError
from core.models import ResearchRequest
from core.settings import Settings
from retrievers.registry import build_registry
from retrievers.selection import plan_request
from tests.conftest import make_settings

REGISTRY = build_registry(Settings(_env_file=None))


def plan(tmp_path, headers, report_source=None, **settings):
    body = {"task": "q", "headers": headers}
    if report_source:
        body["report_source"] = report_source
    return plan_request(ResearchRequest.model_validate(body), make_settings(tmp_path, **settings), REGISTRY)


def test_names_are_trimmed_case_insensitive_and_deduplicated(tmp_path):
    assert plan(tmp_path, {"retrievers": " Tavily , google,TAVILY"}).names == ["tavily", "google"]
    assert plan(tmp_path, {"retriever": "google"}).names == ["google"]


def test_report_source_never_removes_a_named_retriever(tmp_path):
    chosen = plan(tmp_path, {"retrievers": "internal_biblio,tavily", "user_id": "u"}, report_source="web")
    assert chosen.names == ["internal_biblio", "tavily"]


def test_report_source_picks_defaults_only_when_none_named(tmp_path):
    assert plan(tmp_path, {"user_id": "u"}, report_source="local").names == ["internal_biblio"]
    assert plan(tmp_path, {}, report_source="web").names == ["google", "tavily"]  # none configured: all, to say why
    assert plan(tmp_path, {}, report_source="web", tavily_api_key="k").names == ["tavily"]
    assert plan(tmp_path, {"user_id": "u"}, report_source="hybrid", tavily_api_key="k").names == [
        "internal_biblio",
        "tavily",
    ]
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
    assert chosen.options.key("tavily_api_key", None) == "tvly-secret"
    assert "tvly-secret" not in repr(chosen.options)
