"""The report types and export formats are each written down once: everything that offers them reads
their registry (report/types.py, report/exports.py)."""

from __future__ import annotations

import aiohttp

from fedresearch.cli import parser
from fedresearch.core.models import ReportType
from fedresearch.report.exports import EXPORT_FORMATS
from fedresearch.report.store import REPORT_NAME, report_files
from fedresearch.report.types import REPORT_FORMS, form_of, offered_forms
from fedresearch.web.mcp_server import McpTools, build_server
from tests.conftest import make_settings


def test_every_report_type_has_its_form_and_those_needing_more_than_a_question_are_not_offered():
    assert set(REPORT_FORMS) == set(ReportType)
    offered = [form.name for form in offered_forms()]
    assert offered == ["research_report", "detailed_report", "deep", "resource_report", "outline_report"]
    assert form_of(ReportType.custom_report).needs == ("custom_prompt",)
    assert [form.name for form in REPORT_FORMS.values() if form.decomposes] == ["detailed_report", "deep"]
    assert not form_of(ReportType.resource_report).written_by_model  # a listing: never the model's


def test_the_cli_offers_the_registry_s_report_types():
    commands = parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    report_type = next(action for action in commands["ask"]._actions if action.dest == "report_type")
    assert list(report_type.choices) == [form.name for form in offered_forms()]
    assert all(form.description in report_type.help for form in offered_forms())


async def test_the_mcp_research_tool_s_schema_lists_the_registry_s_report_types(tmp_path):
    from aiohttp import web

    server = build_server(web.Application())
    tools = {tool.name: tool for tool in await server.list_tools()}
    schema = tools["research"].input_schema["properties"]["report_type"]
    assert schema["enum"] == [form.name for form in offered_forms()] and schema["default"] == "research_report"
    assert set(tools) == {name for name in dir(McpTools) if not name.startswith("_")}


def test_saved_files_and_their_route_follow_the_export_formats():
    research_id = "0123456789abcdef0123456789abcdef"
    assert list(report_files(research_id)) == list(EXPORT_FORMATS)
    assert all(REPORT_NAME.match(name) for name in report_files(research_id).values())
    assert REPORT_NAME.match(f"{research_id}.exe") is None


async def test_report_forms_are_public_and_read_from_the_registries(tmp_path, start_server):
    server = await start_server(make_settings(tmp_path, api_keys="k1:alice", embeddings=False))
    async with aiohttp.ClientSession() as session, session.get(f"{server.url}/api/report_forms") as answer:
        assert answer.status == 200  # no key: the page builds its menu before one is given
        body = await answer.json()
    assert [entry["name"] for entry in body["report_types"]] == [form.name for form in offered_forms()]
    assert body["report_types"][0] == {
        "name": "research_report",
        "label": "Research report",
        "description": form_of(ReportType.research_report).description,
    }
    assert body["formats"] == list(EXPORT_FORMATS)
