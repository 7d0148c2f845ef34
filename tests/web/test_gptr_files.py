"""GPT-Researcher's NextJS app's "My Documents": `POST /upload/`, `GET /files/` and
`DELETE /files/{filename}` in its shapes, into the caller's library with the limits and isolation
of `/api/documents`, and CORS for the origins CORS_ALLOW_ORIGINS names (the app's own by default)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.conftest import EXAMPLES, make_settings
from tests.pdfs import write_flate_bomb

KEYS = "alice-key:alice,bob-key:bob"
NOTE = b"# Rank fusion\n\nReciprocal rank fusion merges rankings by summing 1/(60+rank) per list.\n"
APP = "http://localhost:3000"  # where the NextJS app runs


class Client:
    """A caller of one server: `call` answers (status, JSON), `headers` those of the last answer."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url = session, url
        self.headers: dict[str, str] = {}

    async def __call__(self, method: str, path: str, key: str = "alice-key", files=(), **kwargs: Any):
        headers = {"Authorization": f"Bearer {key}", **kwargs.pop("headers", {})}
        if files:
            form = aiohttp.FormData()
            for name, content in files:
                form.add_field("file", content, filename=name)  # the field name the app sends
            kwargs["data"] = form
        async with self.session.request(method, self.url + path, headers=headers, **kwargs) as response:
            self.headers = dict(response.headers)
            return response.status, await response.json()


@pytest.fixture
async def server_of(tmp_path, start_server):
    async def start(**overrides: Any) -> str:
        values: dict[str, Any] = {"api_keys": KEYS, "ingest_max_file_mb": 0.05, "embeddings": False, **overrides}
        settings = make_settings(tmp_path, **values)
        return (await start_server(settings)).url

    return start


@pytest.fixture
async def call(server_of):
    url = await server_of()
    async with aiohttp.ClientSession() as session:
        yield Client(session, url)


async def test_upload_list_and_delete_in_the_apps_shapes(call) -> None:
    bib = (EXAMPLES / "more_papers.bib").read_bytes()
    status, answer = await call("POST", "/upload/", files=[("fusion.md", NOTE), ("papers.bib", bib)])
    assert status == 200, answer
    assert answer["filename"] == "fusion.md" and answer["path"] == "upload:fusion.md"
    assert {entry["file"]: entry["status"] for entry in answer["files"]} == {
        "fusion.md": "added",
        "papers.bib": "added",
    }
    status, listed = await call("GET", "/files/")
    assert status == 200 and sorted(listed["files"]) == ["fusion.md", "papers.bib"]  # a .bib's records: one file
    status, gone = await call("DELETE", "/files/papers.bib")
    assert (status, gone) == (200, {"message": "File deleted successfully"})
    assert (await call("GET", "/files/"))[1] == {"files": ["fusion.md"]}
    assert await call("DELETE", "/files/papers.bib") == (404, {"message": "File not found"})


async def test_another_users_files_are_neither_listed_nor_deleted(call) -> None:
    assert (await call("POST", "/upload/", files=[("alice.md", NOTE)]))[0] == 200
    assert await call("GET", "/files/", key="bob-key") == (200, {"files": []})
    assert (await call("DELETE", "/files/alice.md", key="bob-key"))[0] == 404
    assert (await call("GET", "/files/"))[1] == {"files": ["alice.md"]}
    status, refused = await call("GET", "/files/", key="wrong-key")
    assert status == 401 and "error" in refused


async def test_uploads_meet_the_limits_of_the_document_api(call) -> None:
    big = b"word " * 20_000  # over INGEST_MAX_FILE_MB (0.05 here)
    files = [("../../escape.md", NOTE), ("tool.exe", b"MZ"), ("big.txt", big)]
    status, answer = await call("POST", "/upload/", files=files)
    assert status == 200, answer
    by_file = {entry["file"]: entry for entry in answer["files"]}
    assert by_file["escape.md"]["status"] == "added"  # a name, never a path out of the upload folder
    assert by_file["tool.exe"]["status"] == "skipped" and "unsupported file type" in by_file["tool.exe"]["reason"]
    assert by_file["big.txt"]["status"] == "skipped" and "INGEST_MAX_FILE_MB" in by_file["big.txt"]["reason"]
    status, refused = await call("POST", "/upload/", data=b"not multipart", headers={"Content-Type": "text/plain"})
    assert status == 400 and "multipart/form-data" in refused["error"]


async def test_a_bomb_is_refused_and_the_upload_goes_on(server_of, tmp_path) -> None:
    url = await server_of(ingest_max_file_mb=1)
    bomb = write_flate_bomb(tmp_path / "bomb.pdf", 45_000_000).read_bytes()  # 0.15 MB inflating to 45 MB
    async with aiohttp.ClientSession() as session:
        status, answer = await Client(session, url)("POST", "/upload/", files=[("bomb.pdf", bomb), ("after.md", NOTE)])
    by_file = {entry["file"]: entry for entry in answer["files"]}
    assert status == 200 and by_file["after.md"]["status"] == "added"
    assert by_file["bomb.pdf"]["status"] == "skipped" and "decompression bomb" in by_file["bomb.pdf"]["reason"]


async def test_the_apps_origin_may_call_from_a_browser_and_no_other(call) -> None:
    assert (await call("GET", "/files/", headers={"Origin": APP}))[0] == 200
    assert call.headers["Access-Control-Allow-Origin"] == APP
    preflight = {"Origin": APP, "Access-Control-Request-Method": "DELETE"}  # before the app's DELETE
    async with call.session.options(f"{call.url}/files/x.md", headers=preflight) as answer:
        assert answer.status == 200 and answer.headers["Access-Control-Allow-Origin"] == APP
    stranger = {**preflight, "Origin": "http://evil.example"}
    async with call.session.options(f"{call.url}/files/x.md", headers=stranger) as answer:
        assert "Access-Control-Allow-Origin" not in answer.headers
    assert (await call("GET", "/files/", headers={"Origin": "http://evil.example"}))[0] == 200
    assert "Access-Control-Allow-Origin" not in call.headers  # the browser keeps the answer from that page


async def test_no_origin_is_allowed_when_none_is_named(server_of) -> None:
    url = await server_of(cors_allow_origins=[])
    preflight = {"Origin": APP, "Access-Control-Request-Method": "GET"}
    async with aiohttp.ClientSession() as session, session.options(f"{url}/files/", headers=preflight) as answer:
        assert "Access-Control-Allow-Origin" not in answer.headers
