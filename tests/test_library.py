"""The embedded library v0: ingest formats, idempotency, strict per-user isolation."""

from __future__ import annotations

import websockets

from library.ingest import ingest
from library.store import Library
from tests.conftest import EXAMPLES, make_settings, report_of, run_task


def test_example_library_ingests_every_format(tmp_path):
    library = Library(tmp_path)
    report = ingest(library, "alice", [EXAMPLES])
    assert report.skipped == []
    kinds = {doc.kind for doc in library.list_documents("alice")}
    assert kinds == {"biblio", "highlight"}
    titles = {doc.title for doc in library.list_documents("alice")}
    assert "BEIR: A Heterogeneous Benchmark for Zero-shot Evaluation of Information Retrieval Models" in titles
    items = library.search_items("alice", "biblio", "zero-shot benchmark heterogeneous", 3)
    assert items[0]["metadata"]["structured_data"]["doi"] == "10.48550/arxiv.2104.08663"
    assert items[0]["metadata"]["structured_data"]["authors"][2] == {"name": "Rücklé, Andreas"}
    again = ingest(library, "alice", [EXAMPLES])
    assert again.added == 0 and again.unchanged == report.added


def test_changed_file_replaces_its_chunks(tmp_path):
    note = tmp_path / "note.md"
    note.write_text("# Note\n\nThe quokka is a small marsupial.\n")
    library = Library(tmp_path / "lib")
    ingest(library, "alice", [note])
    note.write_text("# Note\n\nThe wombat digs burrows.\n")
    report = ingest(library, "alice", [note])
    assert report.replaced == 1
    assert library.search_items("alice", "highlight", "quokka") == []
    assert library.search_items("alice", "highlight", "wombat")[0]["content"] == "The wombat digs burrows."


def test_users_never_see_each_other(tmp_path):
    library = Library(tmp_path)
    secret = tmp_path / "secret.md"
    secret.write_text("# Alice only\n\nThe zebrafish experiment results are confidential.\n")
    ingest(library, "alice", [secret])
    ingest(library, "bob", [EXAMPLES])
    for kind in ("biblio", "highlight", "file"):
        found = library.search_items("bob", kind, "zebrafish experiment confidential", 50)
        assert not any("zebrafish" in item["content"] for item in found)
    assert library.search_items("alice", "highlight", "zebrafish")[0]["content"].startswith("The zebrafish")
    assert library.search_items("alice", "biblio", "reciprocal rank fusion") == []
    assert not library.delete_document("bob", library.list_documents("alice")[0].id)
    assert library.list_documents("alice")


def test_chinese_query_finds_the_chinese_note(tmp_path):
    library = Library(tmp_path)
    ingest(library, "alice", [EXAMPLES])
    items = library.search_items("alice", "highlight", "中文分词问题", 3)
    assert items and "中文检索笔记" in items[0]["metadata"]["title"]


def test_broken_files_are_skipped_with_a_reason(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"title": "ok"}\n{not json\n')
    (tmp_path / "empty.md").write_text("")
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00bad")
    library = Library(tmp_path / "lib")
    report = ingest(library, "alice", [tmp_path / "bad.jsonl", tmp_path / "empty.md", tmp_path / "binary.txt"])
    assert len(report.skipped) == 3
    assert "not JSON" in report.skipped[0] and "no text" in report.skipped[1] and "UTF-8" in report.skipped[2]
    assert library.list_documents("alice") == []  # the good first line of bad.jsonl is not half-stored


async def test_endpoint_and_websocket_use_the_embedded_library(tmp_path, start_server):
    settings = make_settings(tmp_path)
    library = Library(settings.library_dir)
    ingest(library, "alice", [EXAMPLES])
    server = await start_server(settings)
    import aiohttp

    async with aiohttp.ClientSession() as session:
        body = {"type": "File", "user_id": "alice", "query": "rank fusion", "top_k": 3}
        async with session.post(f"{server.url}/internal/biblios/vector_search/", json=body) as response:
            assert response.status == 200 and await response.json() == []
        body["type"] = "biblio"
        async with session.post(f"{server.url}/internal/biblios/vector_search/", json=body) as response:
            items = await response.json()
        assert items[0]["metadata"]["biblio_id"] and items[0]["metadata"]["structured_data"]["doi"]
        assert 0 < items[0]["score"] <= 1
        body["user_id"] = "mallory"
        async with session.post(f"{server.url}/internal/biblios/vector_search/", json=body) as response:
            assert await response.json() == []
        async with session.post(f"{server.url}/internal/biblios/vector_search/", json={"query": "x"}) as response:
            assert response.status == 400 and "user_id: missing" in (await response.json())["error"]

    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(
            ws,
            {
                "task": "reciprocal rank fusion",
                "headers": {"retrievers": "internal_biblio, INTERNAL_HIGHLIGHT", "user_id": "alice"},
            },
        )
    assert "https://doi.org/10.1145/1571941.1572114" in report_of(frames)
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(
            ws, {"task": "reciprocal rank fusion", "headers": {"retrievers": "internal_biblio", "user_id": "mallory"}}
        )
    assert "## References" not in report_of(frames)
