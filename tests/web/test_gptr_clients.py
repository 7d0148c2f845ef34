"""Every GPT-Researcher client served: its whole request vocabulary, paragraph-bounded report frames,
clickable citations, the library alias by default, Chinese questions, and chat."""

from __future__ import annotations

import re

import aiohttp
import pytest
import websockets

from fedresearch.core.models import ReportSource, ReportType
from fedresearch.library.facade import Library
from fedresearch.library.ingest import ingest
from fedresearch.report.compose import report_chunks
from tests.conftest import EXAMPLES, logs, make_settings, report_of, run_task
from tests.report.test_report import check_invariants


@pytest.fixture
async def server(tmp_path, fakes, start_server):
    settings = make_settings(tmp_path, fakes, default_user="alice", embeddings=False)
    ingest(Library(settings.library_dir), "alice", [EXAMPLES])
    return await start_server(settings)


@pytest.mark.parametrize("report_type", [t.value for t in ReportType])
async def test_every_report_type_and_source_ends_with_a_report_and_path(server, report_type):
    """What GPT-Researcher's page and apps send: no headers, every type, every source."""
    async with websockets.connect(server.ws_url) as ws:
        for source in [s.value for s in ReportSource]:
            task = {"task": "How does rank fusion combine lexical and dense retrieval?", "report_type": report_type}
            task.update(report_source=source, tone="Objective", agent="Auto Agent", language="", query_domains=[])
            task.update(source_urls=[], document_urls=[], max_search_results=5)
            frames = await run_task(ws, task)
            assert frames[-1]["type"] == "path", (report_type, source, frames[-3:])
            report = report_of(frames)
            assert report.startswith("#") and "could not run" in report if source == "static" else True
            if source != "static":
                check_invariants(report)


async def test_static_with_source_urls_reads_only_those_pages(server):
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(ws, {"task": "q", "report_source": "static", "source_urls": ["http://127.0.0.1:9/x"]})
    assert not logs(frames, "retriever_started") and frames[-1]["type"] == "path"
    # nor does a chat about its report search anything, asked later by its id (the defaults, the
    # library, would be searched)
    chat = {"research_id": frames[0]["metadata"]["research_id"], "messages": [{"role": "user", "content": "zebra"}]}
    async with aiohttp.ClientSession() as session, session.post(f"{server.url}/api/chat", json=chat) as response:
        assert (await response.json())["response"]["metadata"]["searched"] is False


async def test_azure_and_langchain_sources_search_the_library_and_say_so(server):
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(ws, {"task": "reciprocal rank fusion", "report_source": "azure"})
    names = {f["metadata"]["name"] for f in logs(frames, "retriever_done")}
    assert names == {"internal_biblio", "internal_highlight", "internal_file"}
    assert any("your fedresearch library" in f["output"] for f in logs(frames, "warning"))


async def test_defaults_search_the_whole_library_and_a_chinese_question_finds_chinese_notes(server):
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(ws, {"task": "中文分词为什么会导致检索不到结果？"})
    report = report_of(frames)
    assert "二元字符切分" in report or "分词器" in report
    assert "## 回答" in report and "## Answer" not in report  # headings follow the question's language
    check_invariants(report)
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(ws, {"task": "中文分词", "language": "english"})
    assert "## Answer" in report_of(frames)


async def test_a_research_report_is_organized_cited_and_clickable(server):
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(
            ws, {"task": "How should lexical BM25 and dense retrieval be combined with rank fusion?"}
        )
    report = report_of(frames)
    references = check_invariants(report)
    assert len(references) >= 5 and report.count("\n## ") >= 4  # summary, themes, sources searched, references
    assert re.search(r"\[\[\d+\]\]\(https://doi\.org/", report)  # citations open their source
    assert any("](https://doi.org/" in line for line in references.values())
    for frame in (f for f in frames if f["type"] == "report"):
        assert frame["output"].endswith("\n")  # frames end on paragraph (line) boundaries


def test_report_frames_end_on_paragraph_boundaries():
    paragraphs = [
        f"Paragraph {i} says something about [[{i}]](https://doi.org/10.1/x{i}) rank fusion. " * 9 for i in range(40)
    ]
    markdown = "# Title\n\n" + "\n\n".join(paragraphs) + "\n"
    chunks = report_chunks(markdown, size=500)
    assert "".join(chunks) == markdown and len(chunks) > 10
    for chunk in chunks[:-1]:
        assert chunk.endswith("\n\n")
    huge = "word " * 2000
    assert report_chunks(f"# T\n\n{huge}\n\nend\n", size=500)[1] == f"{huge}\n\n"


async def test_detailed_report_decomposes_into_sub_questions_searched_in_parallel(server, fakes):
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(
            ws,
            {
                "task": "rank fusion and dense retrieval",
                "report_type": "detailed_report",
                "headers": {"retrievers": "library,tavily"},
            },
        )
    (planning,) = logs(frames, "planning")
    assert len(planning["metadata"]["sub_questions"]) >= 2
    asked = {request["body"]["query"] for request in fakes["tavily"].requests}
    assert set(planning["metadata"]["sub_questions"]) <= asked  # every sub-question went to every retriever
    check_invariants(report_of(frames))


async def test_chat_answers_from_the_report_and_searches_again_when_it_must(server, fakes):
    async with websockets.connect(server.ws_url) as ws:
        await ws.send('chat {"message": "hello"}')
        first = await _next_chat(ws)
        assert "Ask a research question first" in first["content"]
        frames = await run_task(ws, {"task": "reciprocal rank fusion", "headers": {"retrievers": "library,tavily"}})
        numbers = check_invariants(report_of(frames))
        await ws.send('chat {"message": "What constant k does reciprocal rank fusion use?"}')
        answer = await _next_chat(ws)
        assert answer["role"] == "assistant" and re.search(r"\[\d+\]", answer["content"])
        assert answer["metadata"]["searched"] is False
        for ref in answer["metadata"]["references"]:  # the report's numbers stay the same in chat
            assert ref["number"] > len(numbers) or ref["entry"] == numbers[ref["number"]]
        before = len(fakes["tavily"].requests)
        await ws.send('chat {"message": "zebra migration patterns in the serengeti"}')
        answer = await _next_chat(ws)
        assert answer["metadata"]["searched"] is True and len(fakes["tavily"].requests) > before


async def _next_chat(ws) -> dict:
    import json

    while True:
        frame = json.loads(await ws.recv())
        if frame.get("type") == "chat":
            return frame
