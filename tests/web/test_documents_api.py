"""The document API over real HTTP: multipart uploads streamed to disk, paging, per-user isolation."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import aiohttp
import pytest

from fedresearch.core.lineage import UPLOAD_FOLDERS
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
