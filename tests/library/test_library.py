"""The embedded library v0: ingest formats, idempotency, strict per-user isolation."""

from __future__ import annotations

import pytest
import websockets

from fedresearch.library.facade import Library
from fedresearch.library.ingest import ingest
from fedresearch.retrievers.internal_api import parse_response, passage_result
from fedresearch.web.literature import item_of
from tests.conftest import EXAMPLES, report_of, run_task, settings_at
from tests.pdfs import write_pdf


def test_example_library_ingests_every_format(library_location):
    library = Library(library_location)
    report = ingest(library, "alice", [EXAMPLES])
    assert report.skipped == []
    kinds = {doc.kind for doc in library.list_documents("alice")}
    assert kinds == {"biblio", "highlight"}
    titles = {doc.title for doc in library.list_documents("alice")}
    assert "BEIR: A Heterogeneous Benchmark for Zero-shot Evaluation of Information Retrieval Models" in titles
    items = library.search("alice", "zero-shot benchmark heterogeneous", "biblio", 3)
    assert items[0].doi == "10.48550/arxiv.2104.08663"
    assert items[0].authors[2] == "Rücklé, Andreas"
    again = ingest(library, "alice", [EXAMPLES])
    assert again.added == 0 and again.unchanged == report.added


def test_changed_file_replaces_its_chunks(tmp_path, library_location):
    note = tmp_path / "note.md"
    note.write_text("# Note\n\nThe quokka is a small marsupial.\n")
    library = Library(library_location)
    ingest(library, "alice", [note])
    note.write_text("# Note\n\nThe wombat digs burrows.\n")
    report = ingest(library, "alice", [note])
    assert report.replaced == 1
    assert library.search("alice", "quokka", "highlight") == []
    assert library.search("alice", "wombat", "highlight")[0].text == "The wombat digs burrows."


def test_users_never_see_each_other(tmp_path, library_location):
    library = Library(library_location)
    secret = tmp_path / "secret.md"
    secret.write_text("# Alice only\n\nThe zebrafish experiment results are confidential.\n")
    ingest(library, "alice", [secret])
    ingest(library, "bob", [EXAMPLES])
    for kind in ("biblio", "highlight", "file"):
        found = library.search("bob", "zebrafish experiment confidential", kind, 50)
        assert not any("zebrafish" in item.text for item in found)
    assert library.search("alice", "zebrafish", "highlight")[0].text.startswith("The zebrafish")
    assert library.search("alice", "reciprocal rank fusion", "biblio") == []
    assert not library.delete_document("bob", library.list_documents("alice")[0].id)
    assert library.list_documents("alice")


def test_chinese_query_finds_the_chinese_note(library_location):
    library = Library(library_location)
    ingest(library, "alice", [EXAMPLES])
    items = library.search("alice", "中文分词问题", "highlight", 3)
    assert items and "中文检索笔记" in items[0].display_title


def test_broken_files_are_skipped_with_a_reason(tmp_path, library_location):
    (tmp_path / "bad.jsonl").write_text('{"title": "ok"}\n{not json\n')
    (tmp_path / "empty.md").write_text("")
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00bad")
    library = Library(library_location)
    report = ingest(library, "alice", [tmp_path / "bad.jsonl", tmp_path / "empty.md", tmp_path / "binary.txt"])
    assert len(report.skipped) == 3
    assert "not JSON" in report.skipped[0] and "no text" in report.skipped[1] and "UTF-8" in report.skipped[2]
    assert library.list_documents("alice") == []  # the good first line of bad.jsonl is not half-stored


async def test_endpoint_and_websocket_use_the_library(tmp_path, start_server, library_location):
    settings = settings_at(tmp_path, library_location)
    library = Library(settings.library_location)
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


@pytest.mark.parametrize("kind", ["biblio", "highlight", "file"])
def test_in_process_results_equal_those_read_back_from_the_api_json(tmp_path, kind, library_location):
    """The embedded library answers the internal adapter in process with typed passages; the same
    passages served as literature-API JSON and parsed back give the same results (the cosine aside,
    which JSON does not carry)."""
    library = Library(library_location)
    ingest(library, "alice", [EXAMPLES], kind="highlight")
    ingest(library, "alice", [write_pdf(tmp_path / "fusion.pdf", ["Rank fusion on page one.", "Dense retrieval."])])
    passages = library.search("alice", "rank fusion dense retrieval", kind, 10)
    assert passages
    direct = [passage_result(p, "internal_x", rank) for rank, p in enumerate(passages, start=1)]
    read_back = parse_response([item_of(p) for p in passages], "internal_x", kind).results
    assert [r.model_dump(exclude={"cosine", "kind"}) for r in direct] == [
        r.model_dump(exclude={"cosine", "kind"}) for r in read_back
    ]
