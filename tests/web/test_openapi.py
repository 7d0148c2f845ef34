"""GET /openapi.json describes every route the app serves, and the typed bodies match the handlers."""

from __future__ import annotations

import aiohttp

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
