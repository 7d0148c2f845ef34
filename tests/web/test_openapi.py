"""GET /openapi.json describes every route the app serves, and the typed bodies match the handlers."""

from __future__ import annotations

import aiohttp

from fedresearch.web.status import RetrieversAnswer
from tests.conftest import make_settings


async def test_every_route_is_described(tmp_path, start_server):
    server = await start_server(make_settings(tmp_path))
    async with aiohttp.ClientSession() as session, session.get(server.url + "/openapi.json") as response:
        assert response.status == 200
        document = await response.json()
    assert document["openapi"].startswith("3.")
    described = {(method, path) for path, operations in document["paths"].items() for method in operations}
    served = set()
    for route in server.app.router.routes():
        info = route.resource.get_info()
        if route.method not in ("HEAD", "OPTIONS"):  # OPTIONS: CORS preflights, answered for every route
            served.add((route.method.lower(), info.get("path") or info.get("formatter")))
    assert described == served
    assert {("post", "/retrieval"), ("post", "/api/documents"), ("delete", "/api/documents/{id}")} <= described
    assert ("post", "/mcp") in described and ("get", "/openapi.json") in described
    retrieval = document["paths"]["/retrieval"]["post"]
    schema = retrieval["requestBody"]["content"]["application/json"]["schema"]
    assert {"knowledge_id", "query"} <= set(schema["required"])
    assert "503" in retrieval["responses"]
    one = document["paths"]["/api/documents/{id}"]["get"]
    assert {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}} in one["parameters"]
    ids = [op["operationId"] for ops in document["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids))


async def test_the_jobs_routes_carry_their_bodies(tmp_path, start_server):
    server = await start_server(make_settings(tmp_path))
    async with aiohttp.ClientSession() as session, session.get(server.url + "/openapi.json") as response:
        paths = (await response.json())["paths"]
    report = paths["/report/"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"task", "report_type", "report_source", "tone", "headers", "generate_in_background"} <= set(
        report["properties"]
    )
    assert "404" in paths["/api/jobs/{research_id}"]["get"]["responses"]
    chat = paths["/api/chat"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"report", "messages"} <= set(chat["properties"])


async def test_api_retrievers_says_whom_a_key_s_tasks_run_as_and_within_what(tmp_path, start_server):
    """What the page reads to say what is missing before it sends a task: the user a key acts as (or
    that none is known), whether it may name another, the question's limit, the default retrievers."""
    keys = "alice-key:alice,admin-key:*"
    secured = await start_server(make_settings(tmp_path / "keys", api_keys=keys, max_task_chars=1234))
    single = await start_server(make_settings(tmp_path / "single", default_user="me"))
    plain = await start_server(make_settings(tmp_path / "plain"))  # as it starts by default
    seen = {}
    async with aiohttp.ClientSession() as session:
        for name, url, key in (
            ("alice", secured.url, "alice-key"),
            ("admin", secured.url, "admin-key"),
            ("single", single.url, None),
            ("plain", plain.url, None),
        ):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            async with session.get(url + "/api/retrievers", headers=headers) as response:
                assert response.status == 200
                seen[name] = await response.json()
                assert key is None or key not in await response.text()  # keys are never said
        async with session.get(plain.url + "/openapi.json") as response:
            documented = (await response.json())["paths"]["/api/retrievers"]["get"]["responses"]["200"]
    schema = documented["content"]["application/json"]["schema"]
    who = {name: (a["user_id"], a["user_id_required"], a["may_name_user"]) for name, a in seen.items()}
    assert who == {
        "alice": ("alice", False, False),  # a user's key acts as its user only
        "admin": (None, True, True),
        "single": ("me", False, True),  # FEDRESEARCH_DEFAULT_USER
        "plain": (None, True, True),  # no one: the page asks for a user id beside the question
    }
    assert seen["alice"]["max_task_chars"] == 1234 and seen["plain"]["max_task_chars"] == 2000
    for answer in seen.values():
        assert set(answer) == set(schema["properties"])
        RetrieversAnswer.model_validate(answer)
        kinds = {entry["name"]: entry["kind"] for entry in answer["retrievers"]}
        library = [name for name, kind in kinds.items() if kind == "library"]
        defaults = answer["default_retrievers"]
        assert defaults["local"] == library and defaults["hybrid"][: len(library)] == library
        assert {kinds[name] for name in defaults["web"]} == {"web"} and defaults["static"] == []
        assert all("reason" in entry for entry in answer["retrievers"] if not entry["configured"])
        assert not any("reason" in entry for entry in answer["retrievers"] if entry["configured"])
