"""Writing the report: the LLM writer streamed paragraph by paragraph and verified as it goes, or the
extractive writer; either way every cited sentence is checked, and the report always gets written.

When the model fails (timeout, 429/5xx after the SDK's retries, a stalled stream, a malformed chunk,
an empty or unsupported answer) the extractive writer takes over where the stream stopped: paragraphs
already sent stay, the extractive report follows with its citations renumbered into the same
References, and a `writer_fallback` log frame says why.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fedresearch.core.events import Emit, ProgressEvent, ProgressStep
from fedresearch.core.models import ReportType
from fedresearch.core.work import run_on
from fedresearch.report.citations import Citations, Reference
from fedresearch.report.evidence import Evidence, diversify, gather, rank
from fedresearch.report.language import REFERENCES_HEADING, labels_for
from fedresearch.report.llm import (
    LlmConfig,
    WriterFailure,
    failure_reason,
    messages_for,
    seen_text,
    stream_paragraphs,
)
from fedresearch.report.markup import inline_text
from fedresearch.report.types import form_of
from fedresearch.report.verify import (
    MARKERS,
    Checked,
    Thresholds,
    Verification,
    Verifier,
    mark_of,
    strip_markers,
    verify_paragraph,
    verify_rendered,
)
from fedresearch.report.writer import TEMPLATES, Brief, Writing, citation_marks, coverage_lines, write_report

log = logging.getLogger("fedresearch")

SendReport = Callable[[str], Awaitable[None]]


@dataclass(frozen=True)
class SavedReport:
    """A written report as saved: its files' names (as `path` frames list them) and its JSON record."""

    files: dict[str, str]
    record: bytes


# saves a written report; runs on a writer thread
SaveReport = Callable[["Composed"], SavedReport]
_PASSAGES = 12
_REPORT_CHUNK = 2000
FALLBACK_NOTE = "The model stopped here; the rest of this report quotes the sources directly."


@dataclass
class Composed:
    markdown: str
    references: list[Reference]
    verification: Verification
    writer: str  # "llm", "extractive", or "llm+extractive" (the model failed part-way)
    model: str | None = None
    fallback: str | None = None
    sentences: list[dict[str, Any]] = field(default_factory=list)
    saved: SavedReport | None = None  # what `save` returned, when compose was given one


def model_shape(brief: Brief) -> str:
    """What the model is asked to write: its type's shape (report/types.py), with what the request
    asks of that form (a custom prompt; a subtopic's main question and the sections written already)."""
    shape = form_of(brief.report_type).model_shape or ""
    asked = brief.asked
    if brief.report_type is ReportType.custom_report and asked.custom_prompt:
        shape += f", as the user asks within those rules: {' '.join(asked.custom_prompt.split())[:2000]}"
    if brief.report_type is ReportType.subtopic_report:
        if asked.parent_query:
            shape += f", on this question as one subtopic of: {' '.join(asked.parent_query.split())[:500]}"
        if asked.existing_headers:
            written = "; ".join(" ".join(h.split())[:120] for h in asked.existing_headers[:30])
            shape += f"; leave out what these sections already written cover: {written}"
    return shape


def report_chunks(markdown: str, size: int = _REPORT_CHUNK) -> list[str]:
    """The report in frames that end on paragraph boundaries (GPT-Researcher's page renders each frame
    as its own block, so a frame must never end inside a word, a link or a table row); a paragraph
    longer than `size` travels whole. The concatenation is the report."""
    chunks: list[str] = []
    current = ""
    for paragraph in re.split(r"(?<=\n\n)", markdown):
        if current and len(current) + len(paragraph) > size:
            chunks.append(current)
            current = ""
        current += paragraph
    if current:
        chunks.append(current)
    return chunks


async def _send_all(markdown: str, send: SendReport | None) -> None:
    for chunk in report_chunks(markdown) if send is not None else []:
        await send(chunk)  # type: ignore[misc]


def _evidence_texts(references: Sequence[Reference], writing: Writing) -> dict[int, str]:
    """What each reference's source says: its result text and the pages read behind it."""
    texts = {}
    for reference in references:
        passages = gather([reference.source], writing.pages, writing.passages)
        texts[reference.number] = "\n".join(p.text for p in passages)
    return texts


def _records(sentences: Sequence[Checked]) -> list[dict[str, Any]]:
    return [
        {"text": s.text, "citations": s.numbers, "support": s.support, "verdict": s.verdict}
        for s in sentences
        if s.verdict != "prose"
    ]


def write_extractive(brief: Brief) -> tuple[str, list[Reference], Verification]:
    """Written and verified in one go, so in one trip to a thread (each trip wakes both sides)."""
    markdown, references = write_report(brief)
    writing = brief.writing
    texts = _evidence_texts(references, writing)
    # its sentences are quotations, matched word for word: encoding whole pages would buy nothing
    thresholds = Thresholds(support=writing.support_threshold, drop=writing.support_threshold / 2)
    markdown, verification = verify_rendered(markdown, texts, None, thresholds)
    for checked in verification.sentences:
        checked.numbers = list(checked.cited)
    return markdown, references, verification


def _write_and_save(brief: Brief, save: SaveReport | None) -> Composed:
    """The extractive report written, verified and saved in one trip to a thread: each trip wakes the
    worker and then the loop, 90-300 µs of CPU on a 2-core VM."""
    markdown, references, verification = write_extractive(brief)
    composed = Composed(markdown, references, verification, "extractive", sentences=_records(verification.sentences))
    if save is not None:
        composed.saved = save(composed)
    return composed


async def compose(
    brief: Brief,
    config: LlmConfig | None,
    emit: Emit,
    send: SendReport | None = None,
    save: SaveReport | None = None,
) -> Composed:
    """The report, sent through `send` (paragraph-bounded frames) as it is written, and verified;
    with `save`, saved before it is sent whole (the extractive writer) or once the stream ends (the
    model), its `saved` set from what `save` returned."""
    if config is None or form_of(brief.report_type).model_shape is None:
        composed = await run_on(brief.writing.work, _write_and_save, brief, save)
        await _verified(composed.verification, emit)
        await _send_all(composed.markdown, send)
        return composed
    composed = await LlmReport(brief, config, emit, send).write()
    if save is not None:
        composed.saved = await run_on(brief.writing.work, save, composed)
    return composed


async def _verified(verification: Verification, emit: Emit) -> None:
    await emit(ProgressEvent(ProgressStep.verification, verification.summary(), verification.counts()))


class LlmReport:
    """One LLM-written report in progress: what has been sent, the citations numbered so far."""

    def __init__(self, brief: Brief, config: LlmConfig, emit: Emit, send: SendReport | None) -> None:
        self.brief, self.config, self.emit, self.send = brief, config, emit, send
        self.writing: Writing = brief.writing
        self.citations = Citations()
        self.verification = Verification()
        self.written: list[str] = []
        self.cited_sentences = 0

    async def put(self, text: str) -> None:
        self.written.append(text)
        if self.send is not None:
            await self.send(text)

    async def write(self) -> Composed:
        passages = await run_on(self.writing.work, self._passages)
        await self.put(f"# {inline_text(self.brief.question)}\n\n")
        failure = None
        try:
            if not passages:
                raise WriterFailure("no evidence passages to write from")
            await self._stream(passages)
            if not self.cited_sentences:
                raise WriterFailure("no sentence of the model's answer was supported by a passage")
        except WriterFailure as error:  # the model's; an error of our own code is no model failure
            failure = failure_reason(error, self.config)
        if failure is not None:
            return await self._fall_back(failure)
        await _verified(self.verification, self.emit)
        await self.put(self._tail())
        return self._composed("llm")

    def _passages(self) -> list[Evidence]:
        everything = self.brief.every_source
        question = self.brief.question
        passages = gather(everything, self.writing.pages, self.writing.passages)
        ranked = rank(question, passages, self.writing.embed, self.writing.term_counts)
        return [r.evidence for r in diversify(ranked, k=_PASSAGES, per_source=3)]

    async def _stream(self, passages: list[Evidence]) -> None:
        numbered = {n: seen_text(p) for n, p in enumerate(passages, start=1)}
        limit = self.writing.support_threshold
        verifier = await run_on(self.writing.work, Verifier, numbered, self.writing.embed, Thresholds(limit, limit / 2))
        language = labels_for(self.brief.question, self.writing.language).code
        messages = messages_for(self.brief.question, passages, language, model_shape(self.brief))
        await self.emit(
            ProgressEvent(
                ProgressStep.writing_report, f"🤖 {self.config.model} is writing from {len(passages)} passages"
            )
        )
        async for paragraph in stream_paragraphs(self.config, messages, self.writing.deadline):
            if paragraph.startswith("#"):
                heading = inline_text(strip_markers(paragraph.lstrip("# ")))
                if heading:
                    await self.put(f"## {heading}\n\n")
                continue
            kept = await run_on(self.writing.work, verify_paragraph, paragraph, verifier, self.verification)
            rendered = " ".join(self._render(checked, passages) for checked in kept)
            if rendered:
                await self.put(rendered + "\n\n")

    def _render(self, checked: Checked, passages: list[Evidence]) -> str:
        marks, checked.numbers = citation_marks([passages[n - 1].source for n in checked.cited], self.citations)
        if checked.numbers:
            self.cited_sentences += 1
        return " ".join(part for part in (inline_text(checked.text), marks) if part) + mark_of(checked)

    async def _fall_back(self, reason: str) -> Composed:
        log.warning("LLM writer failed, extractive writer takes over: %s", reason)
        await self.emit(
            ProgressEvent(
                ProgressStep.writer_fallback,
                f"⚠️ The model could not write the report ({reason}); writing it extractively",
                {"reason": reason, "model": self.config.model},
            )
        )
        markdown, references, verification = await run_on(self.writing.work, write_extractive, self.brief)
        self.verification.sentences.extend(verification.sentences)
        body = _renumbered(
            markdown,
            references,
            self.citations,
            self.verification.sentences[-len(verification.sentences) :] if verification.sentences else [],
        )
        await _verified(self.verification, self.emit)
        if self.cited_sentences:
            await self.put(f"*{FALLBACK_NOTE}*\n\n")
        for chunk in report_chunks(body):
            await self.put(chunk)
        await self.put(self._tail(coverage=False))
        composed = self._composed("llm+extractive" if self.cited_sentences else "extractive")
        composed.fallback = reason
        return composed

    def _tail(self, coverage: bool = True) -> str:
        labels = labels_for(self.brief.question, self.writing.language)
        context = {"coverage": coverage_lines(self.brief.outcomes, labels) if coverage else [], "labels": labels}
        context["citation_style"] = self.writing.citation_style
        context["references"] = self.citations.references
        return TEMPLATES.get_template("_tail.md.j2").render(**context)

    def _composed(self, writer: str) -> Composed:
        markdown = "".join(self.written)
        return Composed(
            markdown,
            self.citations.references,
            self.verification,
            writer,
            self.config.model,
            sentences=_records(self.verification.sentences),
        )


def _renumbered(markdown: str, references: list[Reference], citations: Citations, checked: Sequence[Checked]) -> str:
    """The extractive report's body (no title, no References) with its citations numbered into `citations`."""
    body = REFERENCES_HEADING.split(markdown, maxsplit=1)[0]
    body = re.sub(r"\A# [^\n]*\n+", "", body)
    by_number = {reference.number: reference.source for reference in references}
    remap: dict[int, int] = {}

    def renumber(match: re.Match[str]) -> str:
        olds = [int(n) for n in re.findall(r"\d+", match.group(1) or match.group(2))]
        marks, numbers = citation_marks([by_number[old] for old in olds if old in by_number], citations)
        remap.update(zip(olds, numbers, strict=False))
        return marks

    body = MARKERS.sub(renumber, body)
    for sentence in checked:
        sentence.numbers = [remap.get(n, n) for n in sentence.numbers]
    return body.rstrip("\n") + "\n\n"
