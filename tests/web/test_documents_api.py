"""The document API over real HTTP: multipart uploads streamed to disk, paging, per-user isolation."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fedresearch.core.lineage import UPLOAD_FOLDERS
from fedresearch.library.facade import Library
from fedresearch.library.ingest import ingest
from tests.conftest import EXAMPLES, make_settings

KEYS = "admin-key:*,alice-key:alice,bob-key:bob"


@pytest.fixture
async def api(tmp_path, start_server, encoder):
    settings = make_settings(tmp_path, api_keys=KEYS, ingest_max_file_mb=0.05)
    server = await start_server(settings)
    async with aiohttp.ClientSession() as session:

        async def call(method, path="/api/documents", key="alice-key", files=(), **kwargs):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            if files:
                form = aiohttp.FormData()
                for name, content in files:
                    form.add_field("file", content, filename=name)
                kwargs["data"] = form
            async with session.request(method, server.url + path, headers=headers, **kwargs) as response:
                return response.status, await response.json()

        yield call


NOTE = b"# Rank fusion\n\nReciprocal rank fusion merges rankings by summing 1/(60+rank) per list.\n"


async def test_upload_list_get_delete(api):
    bib = (EXAMPLES / "more_papers.bib").read_bytes()
    status, answer = await api("POST", files=[("fusion.md", NOTE), ("papers.bib", bib), ("x.exe", b"MZ")])
    assert status == 201, answer
    by_file = {f["file"]: f for f in answer["files"]}
    assert by_file["fusion.md"]["status"] == "added" and by_file["papers.bib"]["added"] > 1
    assert by_file["x.exe"]["status"] == "skipped" and "unsupported file type" in by_file["x.exe"]["reason"]
    assert answer["skipped"] == 1
    status, again = await api("POST", files=[("fusion.md", NOTE)])
    assert status == 200 and again["files"][0]["status"] == "unchanged"
    status, changed = await api("POST", files=[("fusion.md", NOTE + b"\nIt needs no score calibration.\n")])
    assert status == 201 and changed["files"][0]["status"] == "replaced"

    status, listing = await api("GET", params={"limit": "2"})
    assert status == 200 and len(listing["documents"]) == 2 and listing["next_offset"] == 2
    total = listing["total"]
    assert total == by_file["papers.bib"]["added"] + 1
    status, rest = await api("GET", params={"offset": "2", "limit": "200"})
    assert len(rest["documents"]) == total - 2 and rest["next_offset"] is None
    note = next(d for d in listing["documents"] + rest["documents"] if d["source"] == "upload:fusion.md")
    assert isinstance(note["id"], str)
    status, one = await api("GET", f"/api/documents/{note['id']}")
    assert status == 200 and one == note
    status, read = await api("GET", f"/api/documents/{note['id']}/passages")  # what a reference opens on the page
    assert status == 200 and read["document"] == note
    assert [p["heading"] for p in read["passages"]] == ["Rank fusion"]
    assert "It needs no score calibration." in read["passages"][0]["text"]
    status, _ = await api("DELETE", f"/api/documents/{note['id']}")
    assert status == 200
    assert (await api("GET", f"/api/documents/{note['id']}"))[0] == 404
    assert (await api("DELETE", f"/api/documents/{note['id']}"))[0] == 404


async def test_a_user_never_sees_another_users_documents(api):
    status, answer = await api("POST", files=[("secret.md", b"# Bob\n\nBob's unpublished trick.\n")], key="bob-key")
    assert status == 201
    (bobs,) = (await api("GET", key="bob-key"))[1]["documents"]
    assert (await api("GET", key="alice-key"))[1]["total"] == 0
    assert (await api("GET", f"/api/documents/{bobs['id']}", key="alice-key"))[0] == 404
    assert (await api("GET", f"/api/documents/{bobs['id']}/passages", key="alice-key"))[0] == 404
    status, read = await api("GET", f"/api/documents/{bobs['id']}/passages", key="bob-key")
    assert status == 200 and "unpublished trick" in read["passages"][0]["text"]
    assert (await api("DELETE", f"/api/documents/{bobs['id']}", key="alice-key"))[0] == 404
    status, answer = await api("GET", key="alice-key", params={"user_id": "bob"})
    assert status == 403 and "alice" in answer["error"]
    status, answer = await api("GET", key="admin-key", params={"user_id": "bob"})
    assert status == 200 and answer["total"] == 1
    assert (await api("GET", key="admin-key"))[0] == 400  # an admin names the user
    assert (await api("GET", key=None))[0] == 401
    assert (await api("GET", key="bob-key"))[1]["total"] == 1


async def test_size_limit_and_bad_uploads(api):
    big = b"# Big\n\n" + b"word " * 20_000  # 100 kB, over the test's 0.05 MB limit
    status, answer = await api("POST", files=[("big.md", big), ("small.md", NOTE)])
    assert status == 201
    by_file = {f["file"]: f for f in answer["files"]}
    assert by_file["big.md"]["status"] == "skipped" and "INGEST_MAX_FILE_MB" in by_file["big.md"]["reason"]
    assert by_file["small.md"]["status"] == "added"
    status, answer = await api("POST", json={"file": "x"})
    assert status == 400 and "multipart" in answer["error"]
    status, answer = await api("POST", files=[("../../etc/passwd.txt", b"root")])
    assert answer["files"][0]["file"] == "passwd.txt"
    status, answer = await api("POST", files=[("broken.pdf", b"%PDF-1.4 not really")])
    assert answer["files"][0]["status"] == "skipped" and "broken.pdf" in answer["files"][0]["reason"]
    assert "fedresearch-upload" not in answer["files"][0]["reason"]  # no server path leaks
    assert (await api("GET", "/api/documents/abc"))[0] == 404
    assert (await api("GET", params={"limit": "x"}))[0] == 400


async def test_an_uploads_folder_is_removed_off_the_event_loop(api, monkeypatch):
    removed: list[tuple[str, Path]] = []
    remove = shutil.rmtree

    def spied(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if Path(path).name.startswith(UPLOAD_FOLDERS):
            removed.append((threading.current_thread().name, Path(path)))
        remove(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", spied)
    status, answer = await api("POST", files=[("fusion.md", NOTE)])
    assert status == 201, answer
    status, _ = await api("POST", files=[("x.exe", b"MZ")])  # refused: the folder goes all the same
    assert status == 200
    assert len(removed) == 2
    for thread, folder in removed:  # a gigabyte of files takes a quarter second to delete
        assert thread != threading.main_thread().name
        assert not folder.exists()


class _Uploader:
    """Uploads and literature-API searches on one server, each said by its status and JSON."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url = session, url

    async def upload(self, key: str, *files: tuple[str, bytes]) -> tuple[int, dict[str, Any]]:
        form = aiohttp.FormData()
        for name, content in files:
            form.add_field("file", content, filename=name)
        headers = {"Authorization": f"Bearer {key}"}
        async with self.session.post(self.url + "/api/documents", data=form, headers=headers) as answer:
            return answer.status, await answer.json()

    async def search(self) -> float:
        """Seconds bob's search took."""
        started = time.monotonic()
        body = {"type": "highlight", "user_id": "bob", "query": "rank fusion", "top_k": 3}
        headers = {"Authorization": "Bearer bob-key"}
        url = self.url + "/internal/biblios/vector_search/"
        async with self.session.post(url, json=body, headers=headers) as answer:
            assert answer.status == 200 and await answer.json()
        return time.monotonic() - started


@pytest.fixture
def slow_reading(monkeypatch):
    """Each upload's files take 2 s to read and embed (a big file)."""
    from fedresearch.web import documents

    real = documents.ingest_uploads

    def slow(*args: Any) -> Any:
        time.sleep(2.0)
        return real(*args)

    monkeypatch.setattr(documents, "ingest_uploads", slow)


async def test_uploads_never_hold_up_another_users_searches(tmp_path, start_server, slow_reading):
    """Six uploads by one user took every library thread for minutes, and another user's searches
    waited (one hit a 120 s timeout): uploads run on ingest threads of their own."""
    settings = make_settings(tmp_path, api_keys=KEYS, max_uploads_per_key=10, embeddings=False)
    ingest(Library(settings.library_dir), "bob", [EXAMPLES / "notes"])
    server = await start_server(settings)
    async with aiohttp.ClientSession() as session:
        client = _Uploader(session, server.url)
        uploads = [asyncio.create_task(client.upload("alice-key", (f"n{n}.md", NOTE))) for n in range(8)]
        await asyncio.sleep(0.3)  # more uploads reading than the library has threads
        assert max([await client.search() for _ in range(3)]) < 1.0  # searches do not wait for them
        assert {status for status, _ in await asyncio.gather(*uploads)} == {201}


async def test_a_key_runs_so_many_uploads_at_once_each_bounded_in_all(tmp_path, start_server, slow_reading):
    settings = make_settings(tmp_path, api_keys=KEYS, max_uploads_per_key=2, ingest_max_upload_mb=0.001)
    server = await start_server(settings)
    async with aiohttp.ClientSession() as session:
        client = _Uploader(session, server.url)
        uploads = await asyncio.gather(*(client.upload("alice-key", (f"n{n}.md", NOTE)) for n in range(3)))
        refused = [answer for status, answer in uploads if status == 429]
        assert sorted(status for status, _ in uploads) == [201, 201, 429]
        assert "MAX_UPLOADS_PER_KEY=2" in refused[0]["error"]
        status, answer = await client.upload("alice-key", ("a.md", NOTE), ("b.md", b"# B\n\n" + b"word " * 300))
    assert status == 201 and [f["status"] for f in answer["files"]] == ["added", "skipped"]
    assert "INGEST_MAX_UPLOAD_MB" in answer["files"][1]["reason"]
