"""The MCP server, driven by the official SDK's own client: streamable HTTP at /mcp behind the
server's keys, and stdio through `fedresearch mcp`."""

from __future__ import annotations

import asyncio
import os
import sys

import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from fedresearch.library.facade import Library
from fedresearch.library.ingest import ingest
from tests.conftest import EXAMPLES, make_settings

KEYS = "admin-key:*,alice-key:alice,bob-key:bob"


@pytest.fixture
async def server(tmp_path, fakes, start_server, encoder):
    settings = make_settings(tmp_path, fakes, api_keys=KEYS)
    ingest(Library(settings.library_dir, encoder=encoder), "alice", [EXAMPLES])
    return await start_server(settings)


def client_for(url: str, key: str, **options):
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {key}"})
    return Client(streamable_http_client(url + "/mcp", http_client=http), **options)


async def test_tools_over_streamable_http(server):
    async with client_for(server.url, "alice-key") as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert names == {"search", "research", "list_retrievers", "get_report"}
        found = await client.call_tool("search", {"query": "reciprocal rank fusion", "retrievers": "library,tavily"})
        assert not found.is_error, found
        sources = found.structured_content["sources"]
        assert sources and sources[0]["href"] and sources[0]["content"]
        assert {"internal_biblio", "tavily"} <= {name for s in sources for name in s["retrievers"]}
        assert all(isinstance(v, str) for s in sources for k, v in s["metadata"].items() if k.endswith("_id"))
        listed = (await client.call_tool("list_retrievers", {})).structured_content
        assert "internal_biblio" in {entry["name"] for entry in listed["retrievers"]}


async def test_research_streams_progress_and_saves_a_cited_report(server):
    progress: list[str] = []

    async def on_progress(done, total, message):
        progress.append(message)

    async with client_for(server.url, "alice-key") as client:
        result = await client.call_tool(
            "research",
            {"task": "What is reciprocal rank fusion?", "retrievers": "library"},
            progress_callback=on_progress,
        )
        assert not result.is_error, result
        report = result.structured_content
        assert "## References" in report["report"] and report["references"]
        rrf = next(r for r in report["references"] if "Reciprocal Rank Fusion" in r["title"])
        # the full entry, as the report's References give it (APA), for a client to show or import
        assert rrf["entry"].startswith("Cormack, G. V., Clarke, C. L. A., & Buettcher, S. (2009).")
        assert rrf["entry"] in report["report"]
        assert any("Merging" in (message or "") for message in progress)
        assert any("Researching" in (message or "") for message in progress)
        again = await client.call_tool("get_report", {"research_id": report["research_id"]})
        assert not again.is_error and again.structured_content["report"] == report["report"]
    async with client_for(server.url, "bob-key") as bob:
        theirs = await bob.call_tool("get_report", {"research_id": report["research_id"]})
        assert theirs.is_error  # another user's report is not there for bob


async def test_keys_are_enforced(server):
    async with httpx2.AsyncClient() as http:
        response = await http.post(server.url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert response.status_code == 401
    async with client_for(server.url, "bob-key") as bob:
        result = await bob.call_tool("search", {"query": "rank fusion", "retrievers": "library", "user_id": "alice"})
        assert result.is_error and "bob" in result.content[0].text


async def test_stdio(tmp_path, encoder):
    settings = make_settings(tmp_path)
    ingest(Library(settings.library_dir, encoder=encoder), "alice", [EXAMPLES])
    env = {**os.environ, "FEDRESEARCH_DATA_DIR": str(settings.data_dir), "FEDRESEARCH_DEFAULT_USER": "alice"}
    env.pop("FEDRESEARCH_API_KEYS", None)
    params = StdioServerParameters(command=sys.executable, args=["-m", "fedresearch", "mcp"], env=env)
    async with Client(params) as client:
        result = await client.call_tool("search", {"query": "reciprocal rank fusion", "retrievers": "library"})
        assert not result.is_error, result
        assert result.structured_content["sources"]


async def test_research_is_a_job_under_the_keys_limits(tmp_path, fakes, start_server):
    """`research` runs as a job, as over the WebSocket and REST: listed with the user's reports and
    held to MAX_TASK_CHARS and MAX_TASKS_PER_KEY (it ran outside them, unlisted and never expired)."""
    fakes["tavily"].behaviour.delay_s = 1.0
    settings = make_settings(tmp_path, fakes, api_keys=KEYS, max_task_chars=60, max_tasks_per_key=1)
    server = await start_server(settings)
    async with client_for(server.url, "alice-key") as client, client_for(server.url, "alice-key") as again:
        too_long = await client.call_tool("research", {"task": "rank fusion " * 10, "retrievers": "tavily"})
        assert too_long.is_error and "MAX_TASK_CHARS" in too_long.content[0].text
        first = asyncio.create_task(client.call_tool("research", {"task": "rank fusion", "retrievers": "tavily"}))
        await asyncio.sleep(0.5)  # the first is waiting for Tavily: the key's one place is taken
        second = await again.call_tool("research", {"task": "dense retrieval", "retrievers": "tavily"})
        assert second.is_error and "MAX_TASKS_PER_KEY=1" in second.content[0].text
        done = await first
        assert not done.is_error, done
    research_id = done.structured_content["research_id"]
    async with httpx2.AsyncClient() as http:
        listed = await http.get(server.url + "/api/jobs", headers={"Authorization": "Bearer alice-key"})
        report = await http.get(f"{server.url}/reports/{research_id}.md", headers={"Authorization": "Bearer alice-key"})
    jobs = {job["research_id"]: job for job in listed.json()["jobs"]}
    assert jobs[research_id]["origin"] == "mcp" and jobs[research_id]["status"] == "completed"
    assert report.status_code == 200 and report.text == done.structured_content["report"]


async def test_search_has_the_bounds_of_the_other_query_apis(tmp_path, fakes, start_server):
    """A 900k-character query was searched, and one key's concurrent searches had no limit."""
    settings = make_settings(tmp_path, fakes, api_keys=KEYS, max_queries_per_key=1)
    server = await start_server(settings)
    fakes["tavily"].behaviour.delay_s = 1.0
    async with client_for(server.url, "alice-key") as client:
        long = await client.call_tool("search", {"query": "x" * 3000, "retrievers": "tavily"})
        assert long.is_error and "MAX_TASK_CHARS is 2000" in str(long.content)
        both = await asyncio.gather(
            client.call_tool("search", {"query": "rank fusion", "retrievers": "tavily"}),
            client.call_tool("search", {"query": "dense retrieval", "retrievers": "tavily"}),
        )
    refused = [answer for answer in both if answer.is_error]
    assert len(refused) == 1 and "MAX_QUERIES_PER_KEY=1" in str(refused[0].content)
