"""The LLM writer section by section, against a fake OpenAI-compatible server that holds a context as
real servers do (tests/fakes/openai_chat.py): over many long sources every request fits, each report
type keeps its form in the question's language, citations are numbered for the whole report and each
points to the source that says the sentence, a section the model fails on is quoted from the sources
under a notice, and a server that says its context is smaller is believed. No network."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest

from fedresearch.core.events import ProgressEvent
from fedresearch.core.models import FusedResult, ReportType
from fedresearch.report.compose import Composed, compose
from fedresearch.report.llm import LlmConfig
from fedresearch.report.markup import inline_text
from fedresearch.report.tokens import Budget
from fedresearch.report.writer import Asked, Brief, Part
from tests.fakes import long_sources
from tests.fakes.openai_chat import (
    Answer,
    ContextError,
    FakeOpenAI,
    Heard,
    Script,
    faithful,
    is_summing,
    passages_of,
)
from tests.report.test_report import check_invariants

NOTICE = "*The model could not write this section; it quotes the sources directly.*"
ZH_NOTICE = "*模型未能写出本节；本节直接引用来源原文。*"
CITED = re.compile(r"\[\[(\d+)\]\]\(([^)]+)\)")


@dataclass
class Written:
    composed: Composed
    frames: list[str]
    events: list[ProgressEvent]
    fake: FakeOpenAI

    @property
    def headings(self) -> list[str]:
        return [line for line in self.composed.markdown.splitlines() if line.startswith("#")]

    def section(self, heading: str) -> str:
        """A section's text, from under its heading to the next heading."""
        return self.composed.markdown.split(f"{heading}\n\n", 1)[1].split("\n#", 1)[0]

    @property
    def section_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.fake.requests if r.get("stream") and not is_summing(r)]


async def write(
    brief: Brief,
    context_tokens: int = 8192,
    server_context: int | None = None,
    context_error: ContextError = "openai",
    script: Script = faithful,
) -> Written:
    """`brief` written with a model whose server holds `server_context` tokens (by default what the
    writer is told, LLM_CONTEXT_TOKENS)."""
    fake = await FakeOpenAI(server_context or context_tokens, context_error).start()
    fake.script = [script]
    heard = Heard()
    frames, events = heard.frames, heard.events
    config = LlmConfig(fake.url, "sk-test", "small-model", timeout_s=5.0, max_retries=0, context_tokens=context_tokens)
    try:
        composed = await compose(brief, config, heard.emit, heard.send)
    finally:
        await fake.stop()
    assert "".join(frames) == composed.markdown and all(frame.endswith("\n") for frame in frames)
    check_invariants(composed.markdown)  # every [n] one reference, numbered in order of first citation
    assert any(e.step == "verification" for e in events)
    return Written(composed, frames, events, fake)


def assert_every_request_fitted(written: Written, context: int) -> None:
    fake = written.fake
    assert fake.requests and not fake.refused
    for prompt, request in zip(fake.prompts, fake.requests, strict=True):
        assert request["max_tokens"] == Budget.of(context).answer
        assert prompt + request["max_tokens"] <= context  # as the server counts them


def assert_cited_where_said(written: Written, sources: list[FusedResult]) -> None:
    """Each sentence of the report's JSON record stands in the report with its own citations, and each
    of the model's sentences (a faithful model quotes) is said by every source it cites."""
    markdown, bodies = written.composed.markdown, {s.href: " ".join(s.body.split()) for s in sources}
    cited = [s for s in written.composed.sentences if s["citations"]]
    assert cited
    for sentence in cited:
        at = markdown.find(inline_text(sentence["text"]))
        assert at >= 0, sentence
        links = CITED.findall(markdown[at + len(inline_text(sentence["text"])) :].split("\n", 1)[0])
        numbers = [int(n) for n, _ in links[: len(sentence["citations"])]]
        assert numbers == sentence["citations"], (sentence, links)
        assert sentence["verdict"] in ("supported", "recited", "cited")
        said = sentence["text"].rstrip(".。")
        for _, href in links[: len(sentence["citations"])]:
            assert said in bodies[href], (said, href)


async def test_a_research_report_over_many_long_sources_fits_every_request_in_8k() -> None:
    sources = long_sources.english_sources(24)
    written = await write(Brief(long_sources.QUESTION, ReportType.research_report, sources))
    assert_every_request_fitted(written, 8192)
    composed = written.composed
    assert composed.writer == "llm" and composed.fallback is None
    headings = written.headings
    assert headings[1] == "## Answer" and headings[-2:] == ["## Conclusion", "## References"]
    themes = headings[2 : headings.index("## Disagreements and open questions")]
    assert len(themes) >= 2  # themed sections between the answer and the open questions
    # a request per section of findings, each holding only its own passages, at most 8; the answer and the
    # conclusion from the drafts of the others, with no passage at all
    requests = written.section_requests
    assert len(requests) == len(themes) + 1
    held = [set(passages_of(r).values()) for r in requests]
    assert all(0 < len(passages) <= 8 for passages in held)
    assert len({frozenset(passages) for passages in held}) == len(held)
    summing = [r for r in written.fake.requests if is_summing(r)]
    assert len(summing) == 2 and not any(passages_of(r) for r in summing)
    assert "### " + themes[0].removeprefix("## ") in summing[0]["messages"][-1]["content"]
    assert_cited_where_said(written, sources)
    assert len(composed.references) >= 10  # more of the 24 sources than one request's dozen passages


async def test_a_detailed_report_has_an_introduction_a_section_per_sub_question_and_a_conclusion() -> None:
    sources = long_sources.english_sources(24)
    parts = long_sources.parts(sources)
    written = await write(Brief(long_sources.QUESTION, ReportType.detailed_report, sources, parts=parts))
    assert_every_request_fitted(written, 8192)
    body = [h for h in written.headings if h != "## References"]
    # the sub-questions' sections first; what bears on the question and none of them quoted after them, by theme
    assert body[1 : len(parts) + 2] == ["## Introduction", *(f"## {part.title}" for part in parts)]
    assert body[-1] == "## Conclusion"
    for request, part in zip(written.section_requests, parts, strict=False):
        assert f"This section: {part.title}" in request["messages"][-1]["content"]
        passages = " ".join(passages_of(request).values())
        topic = part.sources[0].title  # its own topic's studies, searched for it
        assert topic in passages
    assert_cited_where_said(written, sources)
    # each part's section cites its own sources: the sources its sub-question found
    for part in parts:
        links = {href for _, href in CITED.findall(written.section(f"## {part.title}"))}
        assert links and links <= {s.href for s in part.sources}


async def test_deep_research_writes_each_follow_up_as_a_subsection_in_a_small_context() -> None:
    sources = long_sources.english_sources(24)
    parts = long_sources.parts(sources, deep=True)
    written = await write(Brief(long_sources.QUESTION, ReportType.deep, sources, parts=parts), context_tokens=2048)
    assert_every_request_fitted(written, 2048)  # the smallest context LLM_CONTEXT_TOKENS takes
    expected = ["## Introduction"]
    for part in parts:
        expected += [f"## {part.title}", *(f"### {child.title}" for child in part.children)]
    found = [h for h in written.headings if h != "## References"][1:]
    assert found[: len(expected)] == expected and found[-1] == "## Conclusion"  # themes of the rest between
    assert written.composed.writer == "llm"
    assert all(len(passages_of(r)) < 8 for r in written.section_requests)  # 2,048 tokens hold fewer
    assert_cited_where_said(written, sources)


async def test_an_outline_is_numbered_sections_of_cited_points() -> None:
    sources = long_sources.english_sources(24)
    written = await write(Brief(long_sources.QUESTION, ReportType.outline_report, sources))
    assert_every_request_fitted(written, 8192)
    assert written.headings[0] == f"# Outline: {long_sources.QUESTION}"
    sections = [h for h in written.headings[1:] if h != "## References"]
    assert sections and all(re.match(r"## \d+\. ", h) for h in sections)
    for heading in sections:
        lines = [line for line in written.section(heading).splitlines() if line]
        assert lines and all(line.startswith("- ") and CITED.search(line) for line in lines)
    assert "as a list only" in written.section_requests[0]["messages"][0]["content"]


async def test_a_chinese_question_over_long_chinese_sources_fits_8k_and_is_headed_in_chinese() -> None:
    sources = long_sources.chinese_sources(20)
    written = await write(Brief(long_sources.ZH_QUESTION, ReportType.research_report, sources))
    assert_every_request_fitted(written, 8192)
    headings = written.headings
    assert headings[1] == "## 回答" and "## 分歧与未决问题" in headings and headings[-2:] == ["## 结论", "## 参考文献"]
    # a CJK character is about a token: 8 passages of 900 would not fit beside a 2,048-token answer
    held = [len(passages_of(r)) for r in written.section_requests]
    assert all(0 < n < 8 for n in held)
    assert max(written.fake.prompts) > 4000  # the budget, not the cap on passages, is what stopped them
    assert "Write in Simplified Chinese." in written.section_requests[0]["messages"][0]["content"]
    assert_cited_where_said(written, sources)


async def test_a_section_the_model_fails_on_is_quoted_under_a_notice_and_the_rest_is_the_models() -> None:
    asked: list[bool] = []

    def second_fails(body: dict[str, Any]) -> Answer:
        if not is_summing(body):
            asked.append(True)
            if len(asked) == 2:
                return Answer(status=500)
        return faithful(body)

    sources = long_sources.english_sources(24)
    brief = Brief(long_sources.QUESTION, ReportType.research_report, sources)
    written = await write(brief, script=second_fails)
    composed = written.composed
    assert composed.writer == "llm+extractive" and "HTTP 500" in (composed.fallback or "")
    (fallback,) = [e for e in written.events if e.step == "writer_fallback"]
    failed = (fallback.metadata or {})["section"]
    assert "HTTP 500" in fallback.output and failed in fallback.output
    # every section of the form is there; the failed one quotes the sources under the notice, the others do not
    assert written.headings == (await write(brief)).headings
    assert written.section(f"## {failed}").startswith(NOTICE + "\n\n")
    assert CITED.search(written.section(f"## {failed}"))
    assert composed.markdown.count(NOTICE) == 1
    kinds = {s["verdict"] for s in composed.sentences}
    assert kinds <= {"supported", "recited", "cited", "unsupported"}
    # the conclusion still sums up every section, the quoted one included
    conclusion = next(r for r in written.fake.requests if is_summing(r) and "conclusion" in r["messages"][0]["content"])
    assert f"### {failed}" in conclusion["messages"][-1]["content"]
    progress = [e.metadata for e in written.events if e.step == "writing_report" and e.metadata]
    assert [p["writer"] for p in progress if p["heading"] == failed] == ["extractive"]


async def test_a_chinese_report_says_its_notice_in_chinese() -> None:
    sources = long_sources.chinese_sources(20)
    written = await write(
        Brief(long_sources.ZH_QUESTION, ReportType.research_report, sources),
        script=lambda body: faithful(body) if is_summing(body) else Answer(status=503),
    )
    assert written.composed.markdown.count(ZH_NOTICE) >= 2 and NOTICE not in written.composed.markdown


@pytest.mark.parametrize("style", ["openai", "vllm", "llamacpp"])
async def test_a_server_with_a_smaller_context_is_believed_after_its_first_refusal(style: ContextError) -> None:
    """The writer is told 8k; the server holds 4k and says so in its own words."""
    sources = long_sources.chinese_sources(20)
    brief = Brief(long_sources.ZH_QUESTION, ReportType.research_report, sources)
    written = await write(brief, context_tokens=8192, server_context=4096, context_error=style)
    assert written.fake.refused == [0]  # the first section's request, and no other
    composed = written.composed
    assert composed.writer == "llm+extractive" and composed.markdown.count(ZH_NOTICE) == 1
    (fallback,) = [e for e in written.events if e.step == "writer_fallback"]
    assert "HTTP 400" in fallback.output and "4096" in fallback.output
    for prompt, request in list(zip(written.fake.prompts, written.fake.requests, strict=True))[1:]:
        assert request["max_tokens"] == Budget.of(4096).answer and prompt + request["max_tokens"] <= 4096


async def test_an_answer_stopped_at_max_tokens_loses_its_unfinished_sentence() -> None:
    def rambling(body: dict[str, Any]) -> Answer:
        if is_summing(body):
            return faithful(body)
        text = faithful(body).pieces[0]  # two whole cited sentences, then a third that runs out of tokens
        return Answer(pieces=[text + " " + "Hybrid retrieval systems keep combining rankings " * 200])

    written = await write(
        Brief(long_sources.QUESTION, ReportType.research_report, long_sources.english_sources(24)), script=rambling
    )
    assert "keep combining rankings" not in written.composed.markdown
    assert written.composed.writer == "llm"


async def test_parts_nothing_bears_on_get_no_section_and_no_request() -> None:
    sources = long_sources.english_sources(24)
    unrelated = Part("How is sourdough bread leavened?", sources[:2], focus="sourdough bread leavening yeast")
    parts = [*long_sources.parts(sources)[:1], unrelated]
    written = await write(Brief(long_sources.QUESTION, ReportType.detailed_report, sources, parts=parts))
    assert "## How is sourdough bread leavened?" not in written.headings
    assert not any("sourdough" in r["messages"][-1]["content"] for r in written.fake.requests)


async def test_a_custom_prompt_goes_to_every_section_and_a_bibliography_it_asks_for_stays_codes() -> None:
    sources = long_sources.english_sources(24)
    prompt = "Focus on what practitioners should configure, in plain words."
    asked = Asked(custom_prompt=prompt)
    written = await write(Brief(long_sources.QUESTION, ReportType.custom_report, sources, asked=asked))
    assert written.composed.writer == "llm" and written.fake.requests
    assert all(prompt in r["messages"][0]["content"] for r in written.fake.requests)
    # an annotated bibliography: entries built by code from the sources, nothing for the model to write
    listing = Asked(custom_prompt="An annotated bibliography of the sources.")
    written = await write(Brief(long_sources.QUESTION, ReportType.custom_report, sources, asked=listing))
    assert not written.fake.requests and written.composed.writer == "extractive"
    assert not [e for e in written.events if e.step == "writer_fallback"]
    assert any(h.startswith("### [") for h in written.headings)  # each source's entry, linked
