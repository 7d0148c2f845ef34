"""Chat answers the question asked: from the report's evidence, else a new search, else it says
that nothing answers; a question after a source names the source the library holds."""

from __future__ import annotations

import json
import re

import aiohttp
import pytest
import websockets

from fedresearch.library.facade import Library
from fedresearch.library.ingest import ingest
from fedresearch.report.chat import bears_on, report_sources, subject_terms
from tests.conftest import EXAMPLES, make_settings, report_of, run_task

RRF_PAPER = "Reciprocal Rank Fusion Outperforms Condorcet and Individual Rank Learning Methods"


@pytest.fixture
async def server(tmp_path, fakes, start_server):
    settings = make_settings(tmp_path, fakes, default_user="alice", embeddings=False)
    ingest(Library(settings.library_dir), "alice", [EXAMPLES])
    return await start_server(settings)


async def _chat(ws, message: str) -> dict:
    await ws.send("chat " + json.dumps({"message": message}))
    while True:
        frame = json.loads(await ws.recv())
        if frame.get("type") == "chat":
            return frame


async def test_a_question_nothing_answers_is_told_so_not_answered_with_the_report(server, fakes):
    async with websockets.connect(server.ws_url) as ws:
        task = {"task": "How does reciprocal rank fusion combine lexical and dense rankings?"}
        await run_task(ws, {**task, "headers": {"retrievers": "library,tavily"}})
        before = len(fakes["tavily"].requests)
        answer = await _chat(ws, "What is the capital of France?")
    assert len(fakes["tavily"].requests) > before and answer["metadata"]["searched"] is True  # it looked again
    content = answer["content"]
    assert content.startswith("Neither this report's sources nor a new search of") and "capital of France" in content
    assert answer["metadata"]["references"] == [] and not re.search(r"\[\d+\]", content)


async def test_which_paper_introduced_a_method_names_the_paper_the_library_holds(server):
    async with websockets.connect(server.ws_url) as ws:
        task = {"task": "How does reciprocal rank fusion combine lexical and dense rankings?"}
        frames = await run_task(ws, {**task, "headers": {"retrievers": "library,tavily"}})
        answer = await _chat(ws, "Which paper introduced reciprocal rank fusion?")
    lead = answer["content"].split("\n\n")[0]
    match = re.match(
        r"These sources point to Cormack, G\. V\., Clarke, C\. L\. A\., & Buettcher, S\. \(2009\)\. (.+)", lead
    )
    assert match and RRF_PAPER in match.group(1), lead
    number = int(re.search(r"\[(\d+)\]\.", lead).group(1))
    # the report's number for it, and its full entry listed under the answer
    assert f"[{number}] Cormack, G. V." in report_of(frames)
    listed = {ref["number"]: ref for ref in answer["metadata"]["references"]}
    assert RRF_PAPER in listed[number]["entry"] and listed[number]["href"] == "https://doi.org/10.1145/1571941.1572114"
    assert answer["metadata"]["searched"] is False


async def test_a_chinese_question_about_english_sources_is_answered_from_them(server):
    """A Chinese question about a report on English papers found "nothing says" (the sentences share
    no Chinese words); its English reading finds them, and "哪篇论文" names the paper."""
    async with websockets.connect(server.ws_url) as ws:
        task = {"task": "How does reciprocal rank fusion combine lexical and dense rankings?"}
        await run_task(ws, {**task, "headers": {"retrievers": "library"}})
        answer = await _chat(ws, "哪篇论文提出了倒数排名融合？")
        nothing = await _chat(ws, "法国的首都是什么？")
    assert "Cormack, G. V." in answer["content"].split("\n\n")[0], answer["content"]
    assert answer["metadata"]["references"]
    assert not nothing["metadata"]["references"], nothing["content"]


async def test_a_saved_reports_chat_reads_its_full_entries(server):
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(ws, {"task": "reciprocal rank fusion", "headers": {"retrievers": "library"}})
    research_id = frames[0]["metadata"]["research_id"]
    chat = {
        "research_id": research_id,
        "messages": [{"role": "user", "content": "Which paper introduced reciprocal rank fusion?"}],
    }
    async with aiohttp.ClientSession() as session, session.post(f"{server.url}/api/chat", json=chat) as response:
        assert response.status == 200
        said = await response.json()
    content = said["response"]["content"]
    assert "These sources point to" in content and RRF_PAPER in content


def test_a_saved_reports_references_are_read_back_from_their_entries():
    markdown = (
        "# Fusion\n\n## Summary\n\n"
        "Reciprocal rank fusion sums 1/(k + rank). [[1]](https://doi.org/10.1145/1571941.1572114) "
        "It is my default. [2]\n\n"
        "## References\n\n"
        "[1] Cormack, G. V., & Clarke, C. L. A. (2009). Reciprocal Rank Fusion \\[RRF\\]. *SIGIR*. "
        "[https://doi.org/10.1145/1571941.1572114](https://doi.org/10.1145/1571941.1572114)\n\n"
        "[2] *Notes on hybrid search*. (n.d.). — section “Fusing rankings”, note in your library, highlight:8\n\n"
        "[3] [Old style](https://a.example/old)\n"
    )
    paper, note, old = report_sources(markdown)
    assert paper.href == "https://doi.org/10.1145/1571941.1572114" and "Reciprocal Rank Fusion [RRF]" in paper.title
    assert paper.body == "Reciprocal rank fusion sums 1/(k + rank)."
    assert (
        note.href == "highlight:8"
        and note.title.startswith("Notes on hybrid search")
        and note.body == "It is my default."
    )
    assert (old.href, old.title) == ("https://a.example/old", "Old style")
    chinese = markdown.replace("## References", "## 参考文献")  # a Chinese report's heading
    assert [source.href for source in report_sources(chinese)] == [paper.href, note.href, old.href]


def test_what_a_question_asks_about_leaves_out_the_words_that_only_ask():
    assert subject_terms("Which paper introduced reciprocal rank fusion?") == subject_terms("reciprocal rank fusion")
    assert bears_on("Which paper introduced reciprocal rank fusion?", "Reciprocal rank fusion sums ranks.")
    assert not bears_on("What is the capital of France?", "Rank fusion combines lexical and dense retrieval well.")
