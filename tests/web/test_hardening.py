"""Limits, authentication on every route, tenant isolation, and SSRF defences."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
import websockets
from websockets.exceptions import InvalidStatus

from fedresearch.core.errors import RequestError
from fedresearch.core.models import ResearchRequest
from fedresearch.core.settings import Settings
from fedresearch.federation.planning import plan_request
from fedresearch.federation.registry import build_registry
from fedresearch.library.facade import Library
from fedresearch.library.ingest import ingest
from fedresearch.retrievers import ADAPTERS
from fedresearch.web.keys import RUNTIME
from fedresearch.web.research_socket import ResearchSocket
from tests.conftest import EXAMPLES, error_of, logs, make_settings, report_of, run_task

KEYS = "admin-key:*,alice-key:alice,bob-key:bob"


async def test_limits_give_clear_errors_and_the_socket_stays_usable(tmp_path, fakes, start_server):
    server = await start_server(make_settings(tmp_path, fakes, max_frame_bytes=2048, max_task_chars=50))
    async with websockets.connect(server.ws_url) as ws:
        await ws.send("start " + json.dumps({"task": "x", "padding": "y" * 5000}))
        assert "exceeds MAX_FRAME_BYTES (2048)" in json.loads(await ws.recv())["output"]
        await ws.recv()
        frames = await run_task(ws, {"task": "why " * 20, "headers": {"retrievers": "tavily"}})
        assert "MAX_TASK_CHARS is 50" in error_of(frames)["output"]
        frames = await run_task(ws, {"task": "q", "max_search_results": 500, "headers": {"retrievers": "tavily"}})
        assert "max_search_results" in error_of(frames)["output"]
        frames = await run_task(ws, {"task": "short", "headers": {"retrievers": "tavily"}})
        assert frames[-1]["type"] == "path"
    async with websockets.connect(server.ws_url, max_size=None) as ws:  # past aiohttp's hard cap: 1009
        await ws.send("x" * (2048 * 16 + 10))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await ws.recv()
        assert closed.value.rcvd.code == 1009


async def test_concurrent_tasks_per_key(tmp_path, fakes, start_server):
    fakes["tavily"].behaviour.delay_s = 1.0
    server = await start_server(make_settings(tmp_path, fakes, api_keys=KEYS, max_tasks_per_key=2))
    url = server.ws_url + "?token=alice-key"
    task = "start " + json.dumps({"task": "slow", "headers": {"retrievers": "tavily"}})
    async with websockets.connect(url) as one, websockets.connect(url) as two, websockets.connect(url) as three:
        await one.send(task)
        await two.send(task)
        await asyncio.sleep(0.2)
        await three.send(task)
        refused = json.loads(await three.recv())
        assert refused["type"] == "error" and "MAX_TASKS_PER_KEY=2" in refused["output"]
    async with websockets.connect(server.ws_url + "?token=bob-key") as other:
        frames = await run_task(other, {"task": "slow", "headers": {"retrievers": "tavily"}})
        assert frames[-1]["type"] == "path"  # another key is not limited by alice's tasks


async def test_a_client_starting_its_next_task_on_path_is_never_refused(tmp_path, fakes, start_server, monkeypatch):
    """GPT-Researcher's clients start the next task when they read `path`: by then the last task's
    place under MAX_TASKS_PER_KEY is free, however long its job record then takes to write."""
    server = await start_server(make_settings(tmp_path, fakes, api_keys=KEYS, max_tasks_per_key=1))
    store, finish = server.app[RUNTIME].jobs, server.app[RUNTIME].jobs.finish

    async def slow_finish(*args, **kwargs):
        job = await finish(*args, **kwargs)
        await asyncio.sleep(0.5)  # the record written on a slow disk or a busy Redis, after the status is set
        return job

    monkeypatch.setattr(store, "finish", slow_finish)
    async with websockets.connect(server.ws_url + "?token=alice-key") as ws:
        for number in range(3):
            frames = await run_task(ws, {"task": f"rank fusion {number}", "headers": {"retrievers": "tavily"}})
            assert not [frame["output"] for frame in frames if frame.get("type") == "error"]
            assert frames[-1]["type"] == "path"


def test_oversized_ingest_file_is_skipped(tmp_path):
    big = tmp_path / "big.txt"
    big.write_text("word " * 100_000)
    report = ingest(Library(tmp_path / "lib"), "alice", [big], max_bytes=100_000)
    assert report.added == 0 and "INGEST_MAX_FILE_MB" in report.skipped[0]


@pytest.fixture
async def secured(tmp_path, fakes, start_server, encoder):
    settings = make_settings(tmp_path, fakes, api_keys=KEYS)
    library = Library(settings.library_dir, encoder=encoder)
    ingest(library, "alice", [EXAMPLES])
    secret = tmp_path / "bob.md"
    secret.write_text("# Bob only\n\nThe axolotl colony notes on rank fusion are bob's alone.\n")
    ingest(library, "bob", [secret])
    return await start_server(settings)


async def test_websocket_needs_a_valid_key_and_a_key_acts_only_as_its_user(secured):
    for suffix in ("", "?token=wrong"):
        with pytest.raises(InvalidStatus) as refused:
            async with websockets.connect(secured.ws_url + suffix):
                pass
        assert refused.value.response.status_code == 401
    headers = {"Authorization": "Bearer alice-key"}
    async with websockets.connect(secured.ws_url, additional_headers=headers) as ws:
        frames = await run_task(
            ws,
            {
                "task": "axolotl rank fusion",
                "headers": {"retrievers": "internal_biblio,internal_highlight", "user_id": "bob"},
            },
        )
        assert "acts as user 'alice' and cannot act as 'bob'" in error_of(frames)["output"]
        frames = await run_task(
            ws, {"task": "axolotl colony rank fusion", "headers": {"retrievers": "internal_biblio,internal_highlight"}}
        )
        assert frames[-1]["type"] == "path" and "bob's alone" not in report_of(frames)
    async with websockets.connect(secured.ws_url + "?token=bob-key") as ws:
        frames = await run_task(
            ws, {"task": "axolotl colony rank fusion", "headers": {"retrievers": "internal_highlight"}}
        )
        assert "bob's alone" in report_of(frames) and "Reciprocal" not in report_of(frames)
    async with websockets.connect(secured.ws_url + "?token=admin-key") as ws:
        frames = await run_task(
            ws, {"task": "axolotl", "headers": {"retrievers": "internal_highlight", "user_id": "bob"}}
        )
        assert "bob's alone" in report_of(frames)


async def test_http_routes_need_keys_and_respect_users(secured):
    body = {"type": "highlight", "user_id": "bob", "query": "axolotl colony"}
    route = secured.url + "/internal/biblios/vector_search/"
    async with aiohttp.ClientSession() as session:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic alice-key"}):
            async with session.post(route, json=body, headers=headers) as response:
                assert response.status == 401 and "alice-key" not in await response.text()
        async with session.post(route, json=body, headers={"Authorization": "Bearer alice-key"}) as response:
            assert response.status == 403 and "bob's alone" not in await response.text()
        async with session.post(route, json=body, headers={"Authorization": "Bearer bob-key"}) as response:
            assert response.status == 200 and "bob's alone" in await response.text()
        async with session.get(secured.url + "/reports/" + "0" * 32 + ".md") as response:
            assert response.status == 401
        async with session.get(secured.url + "/reports/" + "0" * 32 + ".md?token=alice-key") as response:
            assert response.status == 404


def plan(headers, **settings):
    return plan_request(
        ResearchRequest.model_validate({"task": "q", "headers": {"user_id": "u", **headers}}),
        make_settings_plain(**settings),
        build_registry(Settings(_env_file=None), ADAPTERS),
    )


def make_settings_plain(**values):
    return Settings(_env_file=None, **values)


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://127.0.0.1:8000/",
        "http://localhost/",
        "http://LOCALHOST./",
        "http://127.1/",
        "http://[::1]/",
        "http://0.0.0.0/",
        "http://2130706433/",
        "http://lit.example.org@169.254.169.254/",
        "http://lit.example.org.evil.test/",
        "file:///etc/passwd",
        "gopher://lit.example.org/",
    ],
)
def test_ssrf_refuses_every_host_not_allowed(url):
    with pytest.raises(RequestError) as refused:
        plan({"internal_api_base_url": url}, internal_api_allowed_hosts=["lit.example.org"])
    assert "INTERNAL_API_ALLOWED_HOSTS" in str(refused.value) or "http(s)" in str(refused.value)


def test_ssrf_allows_exactly_the_listed_hosts():
    allowed = plan(
        {"internal_api_base_url": "https://LIT.example.org./api"}, internal_api_allowed_hosts=["lit.example.org"]
    )
    assert allowed.options.internal_api_base_url == "https://LIT.example.org./api"


async def test_a_redirect_to_another_host_is_not_followed(tmp_path, fakes, start_server):
    internal = fakes["internal"]
    internal.behaviour.redirect_to = fakes["google"].url + "/customsearch/v1"
    settings = make_settings(tmp_path, fakes, internal_api_allowed_hosts=["127.0.0.1"])
    server = await start_server(settings)
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(
            ws,
            {
                "task": "q",
                "headers": {
                    "retrievers": "internal_biblio,tavily",
                    "user_id": "u",
                    "internal_api_base_url": internal.url,
                },
            },
        )
    (failed,) = logs(frames, "retriever_failed")
    assert "redirect (HTTP 307), which is not followed" in failed["metadata"]["error"]
    assert fakes["google"].requests == [] and len(internal.requests) == 1
    assert frames[-1]["type"] == "path"


async def test_a_cookie_an_upstream_sets_for_one_user_is_not_sent_for_the_next(tmp_path, fakes, start_server):
    tavily = fakes["tavily"]
    tavily.behaviour.set_cookie = "__cf_bm=alice-visit; Path=/; HttpOnly"
    # by name: aiohttp's cookie jar keeps no cookie from an IP address, so 127.0.0.1 would hide a leak
    by_name = tavily.url.replace("127.0.0.1", "localhost")
    server = await start_server(make_settings(tmp_path, fakes, tavily_api_base_url=by_name, upstream_cache_ttl_s=0))
    for user in ("alice", "bob"):
        async with websockets.connect(server.ws_url) as ws:
            task = {"task": f"rank fusion for {user}", "headers": {"retrievers": "tavily", "user_id": user}}
            assert (await run_task(ws, task))[-1]["type"] == "path"
    assert [request["headers"].get("Cookie") for request in tavily.requests] == [None, None]


async def test_a_result_whose_link_urllib_refuses_does_not_sink_the_task(tmp_path, fakes, start_server):
    """A port that is no number, one out of range, an unclosed IPv6 bracket: urllib raises on each,
    and one such link from an upstream ended the whole task with "internal error"."""
    links = ["http://a.example:xyz/p", "http://b.example:99999/p", "http://[::1/p", "https://c.example/ok"]
    fakes["tavily"].behaviour.items = [
        {"url": link, "title": f"Result {n}", "content": f"Rank fusion passage {n} on fusion.", "score": 0.5}
        for n, link in enumerate(links)
    ]
    server = await start_server(make_settings(tmp_path, fakes))
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(ws, {"task": "rank fusion", "headers": {"retrievers": "tavily"}})
    assert not [frame for frame in frames if frame["type"] == "error"], frames
    report = report_of(frames)
    linked = [link for link in links if "[" not in link]
    assert all(f"]({link})" in report for link in linked), report  # cited, as given
    assert "http://\\[::1/p" in report  # no address a reader's browser could open: shown, not linked


async def test_a_base_url_urllib_refuses_is_a_clear_error(tmp_path, fakes, start_server):
    server = await start_server(make_settings(tmp_path, fakes))
    headers = {"retrievers": "internal_biblio", "user_id": "alice", "internal_api_base_url": "http://[::1/"}
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(ws, {"task": "rank fusion", "headers": headers})
        assert error_of(frames)["output"] == "headers.internal_api_base_url must be an http(s) URL"
        assert frames[-1]["type"] == "path"
        again = await run_task(ws, {"task": "rank fusion", "headers": {"retrievers": "tavily"}})
        assert "tavily" in report_of(again)  # the socket serves on


@pytest.mark.tracebacks  # the bug it plants is logged with its traceback, as it should be
async def test_a_frame_meeting_a_bug_is_answered_and_the_socket_serves_on(tmp_path, fakes, start_server, monkeypatch):
    async def broken(self, payload: str) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(ResearchSocket, "resume", broken)
    server = await start_server(make_settings(tmp_path, fakes))
    async with websockets.connect(server.ws_url) as ws:
        await ws.send('resume {"research_id": "x"}')
        error = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert error == {"type": "error", "content": "error", "output": error["output"]}
        assert "internal error" in error["output"] and "a bug" not in error["output"]
        assert json.loads(await asyncio.wait_for(ws.recv(), 10))["content"] == "error"  # its logs twin
        await ws.send("ping")
        assert await asyncio.wait_for(ws.recv(), 10) == "pong"
