"""Sub-question planning with a model (a fake OpenAI-compatible server), and the extractive planner
taking over whenever the model gives no usable plan. No network."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import websockets

from fedresearch.report.planner import numbered_list
from tests.conftest import logs, make_settings, report_of, run_task
from tests.fakes.openai_chat import Answer, FakeOpenAI
from tests.report.test_report import check_invariants

TASK = "How do hybrid retrieval systems combine lexical and dense rankings?"
PLAN = [
    "What is reciprocal rank fusion and how does it merge rankings?",
    "How do dense retrievers encode queries and passages?",
    "When does BM25 outperform dense retrieval?",
]


def test_a_numbered_list_is_read_whatever_its_markup():
    answer = (
        "<think>The user wants three.\n1. a decoy sub-question inside the thinking</think>\n"
        "Here is the plan:\n\n"
        f"1. {PLAN[0]}\n"
        f"2) **{PLAN[1]}**\n"
        f'- "{PLAN[2]}"\n'
        f"4. {PLAN[0]}\n"  # a repeat
        f"5. {TASK}\n"  # the question itself
        "6. Too short\n"
    )
    assert numbered_list(answer, TASK, 5) == PLAN


def test_an_answer_without_a_list_gives_nothing():
    assert numbered_list("I would be happy to help with hybrid retrieval!", TASK, 3) == []
    assert numbered_list("<think>1. only thinking about it, never answering", TASK, 3) == []


def planned(body: dict[str, Any]) -> Answer:
    """Plans when asked without streaming; the report itself is refused so the extractive writer writes it."""
    if body.get("stream"):
        return Answer(status=500)
    return Answer(
        pieces=[
            "<think>\n1. thinking aloud about what to ask\n</think>\n",
            *(f"{n}. {q}\n" for n, q in enumerate(PLAN, 1)),
        ]
    )


async def research(
    tmp_path: Any, fakes: Any, start_server: Any, fake: FakeOpenAI, llm_timeout_s: float = 10, task: str = TASK
) -> list[dict[str, Any]]:
    """A detailed report planned by `fake`. The model's deadline is short only where a test waits it
    out: at 1 s a loaded CI machine once let it pass before the plan's request reached the fake."""
    settings = make_settings(
        tmp_path, fakes, llm_base_url=fake.url, llm_model="small", llm_timeout_s=llm_timeout_s, llm_max_retries=0
    )
    server = await start_server(settings)
    async with websockets.connect(server.ws_url) as ws:
        return await run_task(ws, {"task": task, "report_type": "detailed_report", "headers": {"retrievers": "tavily"}})


async def test_the_models_sub_questions_each_go_to_every_retriever(tmp_path, fakes, start_server):
    fake = await FakeOpenAI().start()
    fake.script = [planned]
    try:
        frames = await research(tmp_path, fakes, start_server, fake)
    finally:
        await fake.stop()
    plan = fake.requests[0]
    assert not plan.get("stream") and "tools" not in plan and "response_format" not in plan
    (planning,) = [f for f in logs(frames, "planning") if "sub_questions" in (f["metadata"] or {})]
    assert planning["metadata"] == {"sub_questions": PLAN, "planner": "llm"}
    asked = {request["body"]["query"] for request in fakes["tavily"].requests}
    assert set(PLAN) <= asked and TASK in asked
    assert not logs(frames, "planner_fallback")
    report = report_of(frames)
    check_invariants(report)
    assert "thinking aloud" not in json.dumps(frames)


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (Answer(status=500), "HTTP 500"),
        (Answer(pieces=["1. a first"], stall_after=0), "did not answer within"),
        (Answer(pieces=["Certainly! Hybrid retrieval is a fascinating topic."]), "usable sub-question"),
        (Answer(pieces=[""]), "empty"),
        (Answer(pieces=["1. x"], malformed_after=0), ""),
    ],
)
async def test_any_planning_failure_falls_back_to_the_extractive_planner(tmp_path, fakes, start_server, answer, reason):
    fake = await FakeOpenAI().start()
    fake.script = [lambda body: Answer(status=500) if body.get("stream") else answer]
    try:
        frames = await research(tmp_path, fakes, start_server, fake, llm_timeout_s=1 if answer.stall_after == 0 else 10)
    finally:
        await fake.stop()
    (fallback,) = logs(frames, "planner_fallback")
    assert reason in fallback["metadata"]["reason"] and fallback["metadata"]["model"] == "small"
    for planning in logs(frames, "planning"):
        assert planning["metadata"].get("planner", "extractive") == "extractive"
    check_invariants(report_of(frames))
    assert "sk-" not in json.dumps(frames)


async def test_tasks_share_one_client_and_connection_to_the_model(tmp_path, fakes, start_server):
    """A client per call built an SSL context each time (52 ms of the event loop here) and opened a
    connection of its own; the app's client is made once and keeps its connection."""
    fake = await FakeOpenAI().start()
    fake.script = [planned]
    settings = make_settings(tmp_path, fakes, llm_base_url=fake.url, llm_model="small", llm_max_retries=0)
    server = await start_server(settings)
    try:
        async with websockets.connect(server.ws_url) as ws:
            for number in range(3):
                task = {
                    "task": f"{TASK} ({number})",
                    "report_type": "detailed_report",
                    "headers": {"retrievers": "tavily"},
                }
                frames = await run_task(ws, task)
                assert not logs(frames, "planner_fallback")
    finally:
        await fake.stop()
    # each task: its plan, then its sections (refused: the extractive writer)
    assert [bool(r.get("stream")) for r in fake.requests].count(False) == 3 and len(fake.requests) > 3
    assert len(set(fake.peers)) == 1


ZH_TASK = "混合检索系统如何合并关键词排序和向量排序？"
ZH_PLAN = [
    ("倒数排名融合如何合并多个排序？", "How does reciprocal rank fusion merge several rankings?"),
    ("稠密检索器如何编码查询和段落？", "How do dense retrievers encode queries and passages?"),
]


async def test_a_chinese_question_over_english_sources_is_planned_in_both_languages(tmp_path, fakes, start_server):
    def bilingual(body: dict[str, Any]) -> Answer:
        if body.get("stream"):
            return Answer(status=500)
        return Answer(pieces=[f"{n}. {zh} || {en}\n" for n, (zh, en) in enumerate(ZH_PLAN, 1)])

    fake = await FakeOpenAI().start()
    fake.script = [bilingual]
    try:
        frames = await research(tmp_path, fakes, start_server, fake, task=ZH_TASK)
    finally:
        await fake.stop()
    system = fake.requests[0]["messages"][0]["content"]
    assert "' || ', then the same search query in English" in system  # the fake Tavily's results are English
    asked = {request["body"]["query"] for request in fakes["tavily"].requests}
    for zh, en in ZH_PLAN:
        assert f"{zh} {en}" in asked  # each sub-question searched in both languages
    headings = [line for line in report_of(frames).splitlines() if line.startswith("## ")]
    assert f"## {ZH_PLAN[0][0]}" in headings  # a section headed in the question's language only
    assert not [h for h in headings for _, en in ZH_PLAN if en in h]


def test_a_question_in_the_sources_language_is_planned_in_it_alone():
    from fedresearch.report.planner import numbered_list, planning_messages, sub_question

    english = planning_messages(TASK, [], 3, ["en"])[0]["content"]
    assert "||" not in english
    assert "same search query in Chinese" in planning_messages(TASK, [], 3, ["en", "zh"])[0]["content"]
    assert numbered_list("1. 倒数排名融合 || reciprocal rank fusion basics\n2. x", ZH_TASK, 3) == [
        "倒数排名融合 || reciprocal rank fusion basics"
    ]
    assert sub_question("倒数排名融合 || reciprocal rank fusion").query == "倒数排名融合 reciprocal rank fusion"
    assert sub_question("倒数排名融合 || reciprocal rank fusion").heading == "倒数排名融合"
    assert sub_question(PLAN[0]).query == PLAN[0] == sub_question(PLAN[0]).heading


def deep_planner(follow_ups: Answer | None = None) -> Any:
    """Plans and, asked for a sub-question's follow-ups (None), two of them about it; the report itself
    is refused so that the extractive writer writes it."""

    def answer(body: dict[str, Any]) -> Answer:
        if body.get("stream"):
            return Answer(status=500)
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        if "follow-up questions" not in system:
            return planned(body)
        if follow_ups is not None:
            return follow_ups
        asking = re.search(r"^Sub-question: (.+)$", user, re.MULTILINE).group(1)  # type: ignore[union-attr]
        return Answer(pieces=[f"1. Which benchmarks measure this: {asking}\n2. What limits this: {asking}\n"])

    return answer


async def deep_research(tmp_path: Any, fakes: Any, start_server: Any, fake: FakeOpenAI) -> list[dict[str, Any]]:
    settings = make_settings(tmp_path, fakes, llm_base_url=fake.url, llm_model="small", llm_max_retries=0)
    server = await start_server(settings)
    async with websockets.connect(server.ws_url) as ws:
        return await run_task(ws, {"task": TASK, "report_type": "deep", "headers": {"retrievers": "tavily"}})


async def test_deep_researchs_follow_ups_are_the_models_given_what_each_search_found(tmp_path, fakes, start_server):
    fake = await FakeOpenAI().start()
    fake.script = [deep_planner()]
    try:
        frames = await deep_research(tmp_path, fakes, start_server, fake)
    finally:
        await fake.stop()
    asked_for = [r for r in fake.requests if "follow-up questions" in r["messages"][0]["content"]]
    assert len(asked_for) == len(PLAN)  # one request per question of the first level
    for request, question in zip(asked_for, PLAN, strict=True):
        user = request["messages"][-1]["content"]
        assert f"Sub-question: {question}" in user and f"Research question: {TASK}" in user
        assert f"Tavily result 1 on {question}" in user  # what that question's own search found
        assert all(f"- {q}" in user for q in PLAN)  # the questions asked before, not to be asked again
    (level,) = [f for f in logs(frames, "planning") if (f["metadata"] or {}).get("depth") == 2]
    follow_ups = [f"{kind}: {q}" for q in PLAN for kind in ("Which benchmarks measure this", "What limits this")]
    assert level["metadata"]["planner"] == "llm" and level["metadata"]["sub_questions"] == follow_ups
    asked = {request["body"]["query"] for request in fakes["tavily"].requests}
    assert set(follow_ups) <= asked  # each follow-up searched
    assert not logs(frames, "planner_fallback")
    report = report_of(frames)
    check_invariants(report)
    assert "Deep research: 2 levels, 6 follow-up searches." in report


async def test_follow_ups_the_model_cannot_plan_are_the_extractive_planners(tmp_path, fakes, start_server):
    fake = await FakeOpenAI().start()
    fake.script = [deep_planner(Answer(pieces=["Happy to help with hybrid retrieval!"]))]
    try:
        frames = await deep_research(tmp_path, fakes, start_server, fake)
    finally:
        await fake.stop()
    fallbacks = logs(frames, "planner_fallback")
    assert len(fallbacks) == 2  # after two failures the model is not asked for the third question's
    assert all("follow-up" in f["output"] and "numbered list" in f["metadata"]["reason"] for f in fallbacks)
    assert [f["metadata"]["parent"] for f in fallbacks] == PLAN[:2]
    asked_for = [r for r in fake.requests if "follow-up questions" in r["messages"][0]["content"]]
    assert len(asked_for) == 2
    levels = [f for f in logs(frames, "planning") if (f["metadata"] or {}).get("depth") == 2]
    assert all(level["metadata"]["planner"] == "extractive" for level in levels)
    check_invariants(report_of(frames))
