"""The LLM writer against a fake OpenAI-compatible server: what it writes, what the verifier does with
it, and the extractive writer taking over on every kind of failure. Each test scripts the first
section the model is asked for; the other requests get a faithful model (tests/fakes/openai_chat.py
`faithful`). No network."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fedresearch.core.events import ProgressEvent
from fedresearch.core.models import ReportType, SearchResult
from fedresearch.federation.fusion import fuse
from fedresearch.report.compose import Composed, compose
from fedresearch.report.llm import LlmConfig, Paragraphs, ThinkFilter
from fedresearch.report.verify import UNCITED, UNSUPPORTED, Verifier
from fedresearch.report.writer import Brief, Writing
from tests.fakes.openai_chat import Answer, FakeOpenAI, Heard, Script, faithful, is_summing, number_of
from tests.report.test_report import check_invariants

QUESTION = "How do hybrid retrieval systems combine lexical and dense rankings?"
BODIES = {
    "https://rrf.example": "Reciprocal rank fusion combines the rankings of several retrieval systems by summing "
    "reciprocal ranks.",
    "https://dense.example": "Dense retrieval encodes queries and passages as vectors and finds passages that "
    "share meaning but not words.",
    "https://bm25.example": "BM25 scores documents by term frequency and inverse document frequency with length "
    "normalisation. It is the lexical ranking most hybrid retrieval systems combine with a dense one.",
    "https://cross.example": "Cross-encoders rerank candidate passages by reading the query and the passage "
    "together, at a higher cost. Hybrid retrieval systems rerank the rankings they combine this way.",
    "https://hybrid.example": "Hybrid search systems run lexical and dense retrieval in parallel and merge their "
    "results.",
}
RRF = "Reciprocal rank fusion combines the rankings of several retrieval systems by summing reciprocal ranks"
BM25 = "BM25 scores documents by term frequency and inverse document frequency"
HYBRID = "Hybrid search systems run lexical and dense retrieval in parallel and merge their results"
DENSE = "Dense retrieval encodes queries and passages as vectors"


def sources() -> list[Any]:
    results = [
        SearchResult(href=href, title=href.split("//")[1].split(".")[0].upper(), retriever="tavily", rank=i + 1, body=b)
        for i, (href, b) in enumerate(BODIES.items())
    ]
    return fuse(results)


@pytest.fixture
async def llm() -> AsyncIterator[FakeOpenAI]:
    fake = await FakeOpenAI().start()
    yield fake
    await fake.stop()


async def write(
    fake: FakeOpenAI, report_type: ReportType = ReportType.research_report
) -> tuple[Composed, list[str], list[ProgressEvent]]:
    config = LlmConfig(fake.url, "sk-test-secret", "fake-model", timeout_s=1.0, max_retries=1)
    heard = Heard()
    frames, events = heard.frames, heard.events
    composed = await compose(Brief(QUESTION, report_type, sources()), config, heard.emit, heard.send)
    assert "".join(frames) == composed.markdown  # what streamed is the report
    assert all(frame.endswith("\n") for frame in frames)  # frames end on paragraph boundaries
    check_invariants(composed.markdown)
    linked = set(re.findall(r"\[\[\d+\]\]\(([^)]+)\)", composed.markdown))
    assert linked <= set(BODIES)  # no citation points anywhere but a source
    assert "<think>" not in composed.markdown and "sk-test-secret" not in composed.markdown
    assert any(e.step == "verification" for e in events)
    assert not any("sk-test-secret" in e.output or "sk-test-secret" in str(e.metadata) for e in events)
    return composed, frames, events


def first_section(script: Script) -> Script:
    """`script` for the first section the model is asked to write from passages; a faithful model
    for every other request."""
    asked: list[int] = []

    def answer(body: dict[str, Any]) -> Answer:
        if is_summing(body) or asked:
            return faithful(body)
        asked.append(1)
        return script(body)

    return answer


def said(*sentences: str) -> Script:
    return first_section(lambda body: Answer(pieces=[s.format(**numbers(body)) for s in sentences]))


def cited_after(markdown: str, sentence: str) -> list[str]:
    """The links of the citations right after `sentence` in the report."""
    found = re.search(re.escape(sentence) + r"((?: ?\[\[\d+\]\]\([^)]+\))+)", markdown)
    return re.findall(r"\]\(([^)]+)\)", found.group(1)) if found else []


def numbers(body: dict[str, Any]) -> dict[str, int]:
    return {
        "rrf": number_of(body, "Reciprocal"),
        "bm25": number_of(body, "BM25"),
        "hybrid": number_of(body, "Hybrid search"),
        "dense": number_of(body, "Dense retrieval"),
        "cross": number_of(body, "Cross-encoders"),
    }


def verdicts(composed: Composed) -> dict[str, set[str]]:
    """Each sentence's verdicts (a sentence the answer repeats from a section is checked twice)."""
    found: dict[str, set[str]] = {}
    for sentence in composed.sentences:
        found.setdefault(sentence["text"], set()).add(sentence["verdict"])
    return found


async def test_supported_sentences_are_kept_cited_and_streamed(llm: FakeOpenAI) -> None:
    llm.script = [said(f"{RRF} [{{rrf}}]. {HYBRID} [{{hybrid}}].\n\n", "## Scoring\n\n", f"{BM25} [{{bm25}}].")]
    composed, frames, _ = await write(llm)
    assert composed.writer == "llm" and composed.fallback is None
    assert set().union(*verdicts(composed).values()) == {"supported"}
    assert "### Scoring" in composed.markdown and len(frames) >= 4  # title, sections, tail
    assert cited_after(composed.markdown, RRF + ".") == ["https://rrf.example"]
    assert cited_after(composed.markdown, HYBRID + ".") == ["https://hybrid.example"]
    assert cited_after(composed.markdown, BM25 + ".") == ["https://bm25.example"]
    assert set(llm.authorization) == {"Bearer sk-test-secret"}
    passages = llm.requests[0]["messages"][1]["content"]
    assert "[1] " in passages and "[5] " in passages and "http" not in passages  # only numbered passages


async def test_a_sentence_citing_the_wrong_passage_is_recited_or_marked(llm: FakeOpenAI) -> None:
    invented = "Cross-encoders were first built in 1887 by a lighthouse keeper in Norway"
    llm.script = [said(f"{BM25} [{{rrf}}]. {invented} [{{cross}}].")]
    composed, _, events = await write(llm)
    assert "recited" in verdicts(composed)[BM25 + "."]
    assert cited_after(composed.markdown, BM25 + ".") == ["https://bm25.example"]  # not the passage it named
    (verdict,) = verdicts(composed)[invented + "."]
    assert verdict in ("unsupported", "dropped")
    if verdict == "unsupported":
        assert cited_after(composed.markdown, invented + ".") == ["https://cross.example"]
        assert re.search(
            re.escape(invented) + r"\. \[\[\d\]\]\(https://cross\.example\) " + UNSUPPORTED, composed.markdown
        )
    else:
        assert invented not in composed.markdown
    counts = next(e for e in events if e.step == "verification").metadata or {}
    assert counts["recited"] == 1


async def test_a_citation_naming_no_passage_never_survives(llm: FakeOpenAI) -> None:
    llm.script = [said(f"{DENSE} [9]. {RRF} [{{rrf}}][9]. The moon is made of green cheese, surveys say [9].")]
    composed, _, events = await write(llm)
    body = composed.markdown.partition("## References")[0]
    assert "[9]" not in body and "[[9]]" not in body and len(composed.references) <= 5
    assert "green cheese" not in composed.markdown  # only a fabricated citation stood behind it
    assert "cited" in verdicts(composed)[DENSE + "."]  # re-cited to the passage that states it
    assert "https://dense.example" in composed.markdown
    counts = next(e for e in events if e.step == "verification").metadata or {}
    assert counts["invalid_citations"] == 3 and counts["dropped"] == 1


async def test_uncited_sentences_are_cited_when_supported_else_flagged(llm: FakeOpenAI) -> None:
    opinion = "Most engineers consider quantum annealing the future of enterprise spreadsheet software"
    llm.script = [said(f"{HYBRID}. {opinion}. In short, it depends.")]
    composed, _, _ = await write(llm)
    assert "cited" in verdicts(composed)[HYBRID + "."]
    assert f"{opinion}. {UNCITED}" in composed.markdown
    assert "In short, it depends." in composed.markdown  # connective prose is not a finding


async def test_think_blocks_never_reach_the_report(llm: FakeOpenAI) -> None:
    llm.script = [said("<thi", "nk>The user wants [7] moon facts.\n\nLet me th", "ink.</th", f"ink>{RRF} [{{rrf}}].")]
    composed, _, _ = await write(llm)
    assert "moon" not in composed.markdown and "think" not in composed.markdown.lower()
    assert composed.writer == "llm" and RRF in composed.markdown


def test_think_filter_handles_tags_split_anywhere() -> None:
    text = "a<think>hidden</think>b<think>x</think>c"
    for size in range(1, 8):
        think = ThinkFilter()
        out = "".join(think.feed(text[i : i + size]) for i in range(0, len(text), size)) + think.close()
        assert out == "abc"


async def test_a_stalled_stream_leaves_its_section_to_the_extractive_writer(llm: FakeOpenAI) -> None:
    stalled = [f"{RRF} [{{rrf}}].\n\n", "More"]
    llm.script = [
        first_section(lambda body: Answer(pieces=[p.format(**numbers(body)) for p in stalled], stall_after=1))
    ]
    composed, _, events = await write(llm)
    assert composed.writer == "llm+extractive" and "stalled" in (composed.fallback or "")
    assert composed.markdown.count(RRF) >= 1 and composed.references
    (fallback,) = [e for e in events if e.step == "writer_fallback"]
    assert "stalled" in fallback.output and "sk-test" not in fallback.output
    section = (fallback.metadata or {})["section"]
    below = composed.markdown.split(f"## {section}\n\n", 1)[1]
    assert below.startswith("*The model could not write this section; it quotes the sources directly.*\n\n")
    assert "More" not in composed.markdown  # what the stalled stream had sent of the section went with it


async def test_429_then_success_writes_with_the_model(llm: FakeOpenAI) -> None:
    llm.script = [lambda body: Answer(status=429, retry_after="0.1"), said(f"{RRF} [{{rrf}}].")]
    composed, _, events = await write(llm)
    assert llm.requests[0] == llm.requests[1] and composed.writer == "llm"  # the SDK asked again
    assert not any(e.step == "writer_fallback" for e in events)


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (lambda body: Answer(status=500), "HTTP 500"),
        (lambda body: Answer(status=401), "HTTP 401"),
        (lambda body: Answer(status=429, retry_after="0.1"), "HTTP 429"),
        (lambda body: Answer(pieces=[f"{RRF} [1].", " more"], malformed_after=1), "JSONDecodeError"),
        (lambda body: Answer(pieces=[]), "empty"),
        (lambda body: Answer(pieces=["<think>only thinking</think>"]), "empty"),
        (
            lambda body: Answer(pieces=["The sky over the harbour was grey that winter morning, everyone agreed [2]."]),
            "supported",
        ),
    ],
)
async def test_every_failure_falls_back_to_the_extractive_writer(llm: FakeOpenAI, answer: Any, reason: str) -> None:
    llm.script = [answer]  # every request
    composed, _, events = await write(llm)
    assert composed.writer == "extractive" and reason in (composed.fallback or "")
    assert composed.references and "## References" in composed.markdown
    fallbacks = [e for e in events if e.step == "writer_fallback"]
    assert [reason in e.output for e in fallbacks[:2]] == [True, True]
    # after two sections in a row, the model is not asked again: a dead endpoint costs two timeouts, not one a section
    assert fallbacks[2:] and all("not asked" in e.output for e in fallbacks[2:])
    notice = "*The model could not write this section; it quotes the sources directly.*"
    assert composed.markdown.count(notice) == len(fallbacks)


async def test_extractive_reports_are_verified_too() -> None:
    events: list[ProgressEvent] = []

    async def emit(event: ProgressEvent) -> None:
        events.append(event)

    composed = await compose(Brief(QUESTION, ReportType.research_report, sources()), None, emit)
    check_invariants(composed.markdown)
    assert composed.writer == "extractive" and composed.sentences
    assert all(s["verdict"] == "supported" and s["support"] >= 0.5 for s in composed.sentences)
    assert all(s["citations"] for s in composed.sentences)


def test_verifier_scores_a_figure_the_passage_does_not_state_down() -> None:
    verifier = Verifier({1: "The method improved recall by 12 percent on the benchmark."})
    right = verifier.scores("The method improved recall by 12 percent on the benchmark.")[1]
    wrong = verifier.scores("The method improved recall by 45 percent on the benchmark.")[1]
    assert right > 0.9 and wrong < 0.5


async def test_over_the_websocket_the_report_streams_and_its_json_keeps_every_sentence(
    tmp_path: Any, fakes: Any, start_server: Any
) -> None:
    import websockets

    from tests.conftest import logs, make_settings, report_of, run_task, saved_record

    fake = await FakeOpenAI().start()
    try:
        fake.script = [
            lambda body: (
                faithful(body)
                if is_summing(body)
                else Answer(pieces=[f"{passage_line(body)}\n\n", "Nothing else is known here."])
            )
        ]
        settings = make_settings(
            tmp_path, fakes, llm_base_url=fake.url, llm_model="small", llm_allowed_models=["big"], llm_timeout_s=5
        )
        server = await start_server(settings)
        task = {"task": "How does rank fusion combine lexical and dense retrieval?", "report_type": "research_report"}
        async with websockets.connect(server.ws_url) as ws:
            frames = await run_task(ws, {**task, "headers": {"retrievers": "tavily", "llm_model": "big"}})
            first = len(fake.requests)
            refused = await run_task(ws, {**task, "headers": {"retrievers": "tavily", "llm_model": "other"}})
    finally:
        await fake.stop()
    assert {r["model"] for r in fake.requests[:first]} == {"big"} and {r["model"] for r in fake.requests[first:]} == {
        "small"
    }
    assert fake.requests[0]["stream"] is True and "tools" not in fake.requests[0]
    assert any("not allowed" in f["output"] for f in logs(refused, "warning"))
    report = report_of(frames)
    check_invariants(report)
    assert len([f for f in frames if f.get("type") == "report"]) >= 3  # streamed as it was written
    verification = logs(frames, "verification")[0]["metadata"]
    assert verification["checked"] >= 1
    record = await saved_record(server, frames)
    assert record["report"] == report and record["writer"]["kind"] == "llm"
    assert record["verification"]["sentences"][0]["support"] >= 0.5
    assert record["verification"]["sentences"][0]["citations"] == [1]


def passage_line(body: dict[str, Any]) -> str:
    """The first sentence of passage [1], cited: what a faithful model writes."""
    from tests.fakes.openai_chat import passages_of

    text = passages_of(body)[1].split(") ", 1)[-1]
    return text.split(". ")[0].rstrip(".") + ". [1]"


async def test_a_reference_list_the_model_writes_is_not_the_report(llm: FakeOpenAI) -> None:
    llm.script = [said(f"{RRF} [{{rrf}}].\n\n", "## References\n\n", "[1] Made-up paper, https://fake.example\n")]
    composed, _, _ = await write(llm)
    assert "fake.example" not in composed.markdown and "Made-up" not in composed.markdown
    assert composed.markdown.count("## References") == 1


async def _compose_with(fake: FakeOpenAI, writing: Writing, **config: Any) -> tuple[Composed, list[ProgressEvent]]:
    settings = LlmConfig(fake.url, "sk-test-secret", "fake-model", timeout_s=1.0, max_retries=0, **config)
    events: list[ProgressEvent] = []

    async def emit(event: ProgressEvent) -> None:
        events.append(event)

    composed = await compose(Brief(QUESTION, ReportType.research_report, sources(), writing=writing), settings, emit)
    check_invariants(composed.markdown)
    return composed, events


async def test_an_answer_past_its_size_is_cut_and_the_extractive_writer_finishes(llm: FakeOpenAI) -> None:
    endless = [f"{RRF} [{{rrf}}]. " * 20] * 500  # a model that does not stop
    llm.script = [
        lambda body: (
            Answer(pieces=[piece.replace("{rrf}", str(number_of(body, "Reciprocal"))) for piece in endless])
            if not is_summing(body)
            else faithful(body)
        )
    ]
    composed, events = await _compose_with(llm, Writing(), max_answer_chars=5_000)
    assert composed.writer.endswith("extractive") and "ran past 5,000 characters" in (composed.fallback or "")
    assert any(e.step == "writer_fallback" for e in events) and "## References" in composed.markdown


async def test_a_model_still_writing_when_the_report_is_due_hands_over(llm: FakeOpenAI) -> None:
    slow = [f"{RRF} [1].\n\n"] * 100  # a paragraph every 0.2 s: 20 s in all
    llm.script = [lambda body: Answer(pieces=slow, piece_delay_s=0.2)]
    started = time.monotonic()
    composed, _ = await _compose_with(llm, Writing(deadline=time.monotonic() + 1.0))
    assert time.monotonic() - started < 5  # it did not wait for the whole answer
    assert composed.writer.endswith("extractive") and "still writing when the report was due" in (
        composed.fallback or ""
    )


def test_paragraphs_are_cut_in_linear_time_however_the_answer_arrives() -> None:
    """The splitter scanned its whole buffer again at every piece: 43 s for a 10 MB answer."""
    paragraphs = Paragraphs()
    started = time.perf_counter()
    for _ in range(100_000):  # 1.6 MB of one paragraph, in 16-character pieces
        assert paragraphs.feed("sixteen letters ") == []
    assert time.perf_counter() - started < 3
    assert paragraphs.feed("end.\n") == []  # a blank line may come in two pieces
    assert paragraphs.feed("\nNext") == ["sixteen letters " * 100_000 + "end."]
    assert paragraphs.close() == ["Next"]


def test_the_key_is_masked_in_a_failure_reason_where_it_stands_alone():
    from fedresearch.report.llm import _masked

    assert _masked("401 for key sk-live-123: invalid", "sk-live-123") == "401 for key [LLM_API_KEY]: invalid"
    assert _masked("the prompt has 9000 tokens", "k") == "the prompt has 9000 tokens"  # not inside a word
    assert _masked("no key at all", "") == "no key at all"
