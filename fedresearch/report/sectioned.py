"""The LLM writer: a report written section by section, each request within the model's context.

The report is planned first (report/sections.py: the extractive writer's layout of its type, over the
model's sub-questions where it planned them). Each section of findings, points or open questions is
then written by a request of its own holding only the passages chosen for it: those the extractive
writer quoted in it first, then the best of its evidence ranked against what it is about (passages
other sections quote last), as many as fit LLM_CONTEXT_TOKENS beside the answer's `max_tokens`
(report/prompts.py). Each paragraph is verified against those passages as it arrives. Then the
conclusion, and the answer or introduction where there are findings to sum up, are written from the
drafts of the others (their verified sentences, not their passages), and verified against what the
model was shown of the sources they cite.

A section's sentences cite sources, not numbers: they are numbered for the whole report as it is
rendered, in order of first citation, so References are one list however the sections were written.
The report goes out in its own order as soon as it can: the title and lead at once, a `writing_report`
frame as each section is drafted, then each section once those before it are (a report that opens
with an answer summing the sections up waits for it).

A section the model cannot write (an HTTP error, a timeout, a stalled stream, a context the server
says is exceeded, no supported sentence) is the extractive writer's text of it under a notice, with a
`writer_fallback` frame; after two such failures in a row, or once the report is due, the model is
not asked again. A server that says its context is smaller than LLM_CONTEXT_TOKENS is taken at its
word for the rest of the report.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from fedresearch.core.events import Emit, ProgressEvent, ProgressStep
from fedresearch.core.models import FusedResult
from fedresearch.core.work import run_on
from fedresearch.report.citations import Citations
from fedresearch.report.evidence import Evidence, bearing, diversify, gather, rank
from fedresearch.report.language import labels_for
from fedresearch.report.llm import (
    ContextExceeded,
    LlmConfig,
    WriterFailure,
    failure_reason,
    is_list,
    item_text,
    stream_paragraphs,
)
from fedresearch.report.markup import inline_text
from fedresearch.report.prompts import (
    SECTION_PASSAGES,
    Draft,
    asked_of_model,
    section_messages,
    seen_text,
    summary_messages,
)
from fedresearch.report.sections import PlannedSection, ReportPlan, plan_report
from fedresearch.report.verify import (
    Thresholds,
    Verification,
    Verifier,
    mark_of,
    markers_of,
    sentences_of,
    strip_markers,
    verify_paragraph,
)
from fedresearch.report.writer import TEMPLATES, Brief, citation_marks, coverage_lines
from fedresearch.report.written import (
    Composed,
    SendReport,
    announce_verification,
    evidence_texts,
    records,
    renumbered,
    report_chunks,
    verified_quotations,
    write_extractive,
)

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

    from fedresearch.report.verify import Checked

log = logging.getLogger("fedresearch")

# then the model is not asked again: an endpoint that is down fails every section, each after its timeout
_FAILURES_IN_A_ROW = 2
_LATE_S = 0.2  # a section not begun this close to the report's due time is not asked of the model
_SHRINK = 0.75  # a server refused a request counted to fit its context: the count ran low, ask for less

PassageKey = tuple[str, str, int | None, int, str]


def _passage_key(passage: Evidence) -> PassageKey:
    return (passage.source.key, passage.origin, passage.page, passage.position, passage.text[:64])


@dataclass
class Said:
    """A sentence of the model's as the verifier left it, and the sources it cites."""

    checked: Checked
    sources: list[FusedResult]


@dataclass
class Piece:
    """A paragraph of a section (prose), a point of a list (item, subitem), or a heading within it."""

    kind: Literal["prose", "item", "subitem", "heading"]
    said: list[Said] = field(default_factory=list)
    heading: str = ""  # Markdown


@dataclass
class Drafted:
    """A section as written: the model's verified pieces; else the extractive text, under a notice
    when the model failed on it (`fallback`, why)."""

    section: PlannedSection
    pieces: list[Piece] = field(default_factory=list)
    fallback: str | None = None
    verification: Verification = field(default_factory=Verification)

    @property
    def by_model(self) -> bool:
        return bool(self.pieces)


def _verified_pieces(
    paragraph: str, verifier: Verifier, verification: Verification, sources: Sequence[FusedResult]
) -> list[Piece]:
    """A paragraph of the model's, verified: its sentences as the verifier keeps them, each with the
    sources of the passages it cites; a list, point by point."""

    def said(text: str) -> list[Said]:
        kept = verify_paragraph(text, verifier, verification)
        return [Said(checked, [sources[n - 1] for n in checked.cited]) for checked in kept]

    if not is_list(paragraph):
        found = said(paragraph)
        return [Piece("prose", found)] if found else []
    pieces = []
    for line in paragraph.splitlines():
        indent = len(line) - len(line.lstrip())
        found = said(item_text(line))
        if found:
            pieces.append(Piece("subitem" if indent >= 2 else "item", found))
    return pieces


class SectionedReport:
    """One report being written by the model, section by section."""

    def __init__(self, brief: Brief, config: LlmConfig, emit: Emit, send: SendReport | None) -> None:
        self.brief, self.config, self.emit, self.send = brief, config, emit, send
        self.writing = brief.writing
        self.labels = labels_for(brief.question, self.writing.language)
        self.asked = asked_of_model(brief.report_type, brief.asked)
        limit = self.writing.support_threshold
        self.thresholds = Thresholds(limit, limit / 2)
        self.budget = config.budget
        self.citations = Citations()
        self.verification = Verification()
        self.written: list[str] = []
        self.failures_in_row = 0
        self.first_failure: str | None = None
        self.shown: dict[str, list[str]] = {}  # by source key: what the model was shown of it
        self.quoted: set[PassageKey] = set()  # the passages the plan's sections quote
        self._quotations: dict[int, str] | None = None

    async def put(self, text: str) -> None:
        self.written.append(text)
        if self.send is not None:
            await self.send(text)

    async def write(self) -> Composed:
        plan = await run_on(self.writing.work, plan_report, self.brief)
        if plan.sections and not plan.rewritten:  # a bibliography a custom prompt asks for: code's entries
            return await self._all_extractive(None)
        if not [s for s in plan.rewritten if not plan.sums_up(s)]:
            return await self._all_extractive("no evidence passages to write from")
        self.quoted = {_passage_key(p) for s in plan.sections for p in s.quoted}
        await self.put(self._head(plan))
        # the sections written from passages first, then those that sum them up; sent in the report's order
        order = sorted(range(len(plan.sections)), key=lambda i: plan.sums_up(plan.sections[i]))
        drafted: dict[int, Drafted] = {}
        total, done, sent = len(plan.rewritten), 0, 0
        for index in order:
            section = plan.sections[index]
            if not section.rewritten:
                drafted[index] = Drafted(section)
            else:
                if plan.sums_up(section):
                    drafts = [drafted[i] for i in sorted(drafted) if not plan.sums_up(plan.sections[i])]
                    drafted[index] = await self._summary(section, plan, drafts)
                else:
                    drafted[index] = await self._findings(section, plan)
                done += 1
                await self._progress(drafted[index], done, total)
            while sent in drafted:
                await self.put(await self._rendered(drafted[sent], plan))
                sent += 1
        await announce_verification(self.verification, self.emit)
        await self.put(self._tail())
        rewritten = [d for d in drafted.values() if d.section.rewritten]
        by_model = sum(1 for d in rewritten if d.by_model)
        return self._composed("llm" if by_model == len(rewritten) else "llm+extractive" if by_model else "extractive")

    # the sections

    async def _findings(self, section: PlannedSection, plan: ReportPlan) -> Drafted:
        refusal = self._refusal()
        if refusal is not None:
            return await self._fell_back(section, refusal)
        candidates = await run_on(self.writing.work, self._candidates, section)
        if not candidates:
            return await self._fell_back(section, "no passage bears on this section")
        outline = [s.title for s in plan.rewritten]
        code = self.labels.code
        messages, passages = section_messages(
            self.brief.question, section, outline, candidates, code, self.asked, self.budget
        )
        if not passages:
            reason = f"not even one passage fits a request within {self.budget.context} tokens"
            return await self._fell_back(section, reason)
        numbered = {n: seen_text(p) for n, p in enumerate(passages, start=1)}
        verifier = await run_on(self.writing.work, Verifier, numbered, self.writing.embed, self.thresholds)
        drafted = await self._asked(section, messages, verifier, [p.source for p in passages])
        if drafted.by_model:
            for passage in passages:
                self.shown.setdefault(passage.source.key, []).append(seen_text(passage))
        return drafted

    async def _summary(self, section: PlannedSection, plan: ReportPlan, drafts: Sequence[Drafted]) -> Drafted:
        """A section that sums the others up, from their drafts: each source they cite numbered in
        order of first citation, its sentences checked against what the model was shown of it."""
        refusal = self._refusal()
        if refusal is not None:
            return await self._fell_back(section, refusal)
        numbers: dict[str, int] = {}
        sources: list[FusedResult] = []
        shown: list[Draft] = []
        for drafted in drafts:
            sentences = []
            for text, cited in self._sentences(drafted, plan):
                for source in cited:
                    if source.key not in numbers:
                        numbers[source.key] = len(numbers) + 1
                        sources.append(source)
                sentences.append((text, [numbers[s.key] for s in cited]))
            shown.append(Draft(drafted.section.title, sentences))
        if not sources:
            return await self._fell_back(section, "no drafted sentence cites a source")
        code = self.labels.code
        messages, summed = summary_messages(self.brief.question, section, shown, code, self.asked, self.budget)
        if not summed:
            reason = f"not one drafted sentence fits a request within {self.budget.context} tokens"
            return await self._fell_back(section, reason)
        texts = await run_on(self.writing.work, self._source_texts, sources)
        verifier = await run_on(self.writing.work, Verifier, texts, self.writing.embed, self.thresholds)
        return await self._asked(section, messages, verifier, sources)

    async def _asked(
        self,
        section: PlannedSection,
        messages: list[ChatCompletionMessageParam],
        verifier: Verifier,
        sources: Sequence[FusedResult],
    ) -> Drafted:
        """The model's section, verified; the extractive one when the model fails on it."""
        drafted = Drafted(section)
        try:
            async for paragraph in stream_paragraphs(self.config, messages, self.writing.deadline, self.budget):
                if paragraph.startswith("#"):
                    heading = inline_text(strip_markers(paragraph.lstrip("# ")))
                    if heading and heading.casefold() != section.heading.casefold():  # not its own again
                        drafted.pieces.append(Piece("heading", heading=heading))
                    continue
                drafted.pieces += await run_on(
                    self.writing.work, _verified_pieces, paragraph, verifier, drafted.verification, sources
                )
            said = [s for piece in drafted.pieces for s in piece.said]
            if not [s for s in said if s.sources] and (section.role != "open_questions" or not said):
                raise WriterFailure("no sentence of the model's section was supported by a passage")
        except ContextExceeded as error:
            # a server that says its context is smaller is taken at its word; one that refuses what was
            # counted to fit its own says the count ran low for this text
            limit = error.limit if error.limit is not None and error.limit < self.budget.context else None
            self.budget = self.budget.within(limit or int(self.budget.context * _SHRINK))
            if limit is None:
                self.failures_in_row += 1
            return await self._fell_back(section, failure_reason(error, self.config))
        except WriterFailure as error:  # the model's; an error of our own code is no model failure
            self.failures_in_row += 1
            return await self._fell_back(section, failure_reason(error, self.config))
        self.failures_in_row = 0
        return drafted

    def _refusal(self) -> str | None:
        """Why the model is not asked for the next section, if it is not."""
        if self.failures_in_row >= _FAILURES_IN_A_ROW:
            return f"not asked: the model failed on the {self.failures_in_row} sections before"
        deadline = self.writing.deadline
        if deadline is not None and deadline - time.monotonic() < _LATE_S:
            return "not asked: the report was due"
        return None

    async def _fell_back(self, section: PlannedSection, reason: str) -> Drafted:
        log.warning("LLM writer failed on a section, the extractive writer writes it: %s", reason)
        self.first_failure = self.first_failure or reason
        message = f"⚠️ The model could not write “{section.title}” ({reason}); that section quotes the sources"
        about = {"reason": reason, "model": self.config.model, "section": section.title}
        await self.emit(ProgressEvent(ProgressStep.writer_fallback, message, about))
        return Drafted(section, fallback=reason)

    async def _progress(self, drafted: Drafted, done: int, total: int) -> None:
        title = drafted.section.title
        by = self.config.model if drafted.by_model else "quoting the sources"
        about = {
            "section": done,
            "sections": total,
            "heading": title,
            "writer": "llm" if drafted.by_model else "extractive",
        }
        await self.emit(ProgressEvent(ProgressStep.writing_report, f"✍️ {done}/{total} “{title}” ({by})", about))

    # what the sections are written from

    def _candidates(self, section: PlannedSection) -> list[Evidence]:
        """The passages a section may be written from, best first: those the extractive writer
        quoted in it, then its evidence that bears on what it is about, varied, ranked against it
        (those other sections quote last, so that each section tells its own)."""
        writing = self.writing
        ranked = rank(
            section.focus, gather(section.sources, writing.pages, writing.passages), writing.embed, writing.term_counts
        )
        keys = bearing(ranked)
        best = diversify([r for r in ranked if r.evidence.source.key in keys], k=2 * SECTION_PASSAGES, per_source=2)
        own = {_passage_key(p): p for p in section.quoted}
        fresh: list[Evidence] = []
        elsewhere: list[Evidence] = []
        for item in best:
            key = _passage_key(item.evidence)
            if key not in own:
                (elsewhere if key in self.quoted else fresh).append(item.evidence)
        return list(own.values()) + fresh + elsewhere

    def _sentences(self, drafted: Drafted, plan: ReportPlan) -> list[tuple[str, list[FusedResult]]]:
        """A drafted section's cited sentences (the model's, or the extractive writer's quotations)."""
        if drafted.by_model:
            return [(s.checked.text, s.sources) for piece in drafted.pieces for s in piece.said if s.sources]
        by_number = {reference.number: reference.source for reference in plan.references}
        found = []
        for block in drafted.section.extractive.split("\n\n"):
            if block.startswith("#"):
                continue
            for line in block.splitlines():
                for sentence in sentences_of(item_text(line)):
                    cited = [by_number[n] for n in markers_of(sentence) if n in by_number]
                    if cited:
                        found.append((strip_markers(sentence), cited))
        return found

    def _source_texts(self, sources: Sequence[FusedResult]) -> dict[int, str]:
        """What a summing section's sentences are checked against, by its numbers: what the model was
        shown of each source, else (a source only an extractive section cites) all it says."""
        texts = {}
        for number, source in enumerate(sources, start=1):
            shown = self.shown.get(source.key)
            if shown:
                texts[number] = "\n".join(dict.fromkeys(shown))
            else:
                passages = gather([source], self.writing.pages, self.writing.passages)
                texts[number] = "\n".join(p.text for p in passages)
        return texts

    # the report as it is sent

    def _head(self, plan: ReportPlan) -> str:
        return f"# {inline_text(plan.title)}\n\n" + "".join(f"{paragraph}\n\n" for paragraph in plan.lead)

    async def _rendered(self, drafted: Drafted, plan: ReportPlan) -> str:
        """A section in Markdown, its citations numbered for the whole report (in order of first
        citation, as it is rendered in the report's order) and its sentences recorded."""
        if drafted.by_model:
            self.verification.sentences.extend(drafted.verification.sentences)
            self.verification.removed_markers += drafted.verification.removed_markers
            return self._model_markdown(drafted)
        if self._quotations is None:
            self._quotations = await run_on(self.writing.work, evidence_texts, plan.references, self.writing)
        markdown, verification = await run_on(
            self.writing.work, verified_quotations, drafted.section.extractive, self._quotations, self.writing
        )
        self.verification.sentences.extend(verification.sentences)
        body = renumbered(markdown, plan.references, self.citations, verification.sentences)
        if drafted.fallback is None:
            return body
        heading, _, rest = body.partition("\n\n")
        return f"{heading}\n\n*{self.labels.section_fallback}*\n\n{rest}"

    def _model_markdown(self, drafted: Drafted) -> str:
        level = drafted.section.level
        out = [f"{'#' * level} {drafted.section.heading}\n\n"]
        points: list[str] = []
        for piece in drafted.pieces:
            if piece.kind in ("item", "subitem"):
                points.append(("  - " if piece.kind == "subitem" else "- ") + self._cited(piece))
                continue
            if points:
                out.append("\n".join(points) + "\n\n")
                points = []
            if piece.kind == "heading":
                out.append(f"{'#' * min(level + 1, 6)} {piece.heading}\n\n")
            else:
                out.append(self._cited(piece) + "\n\n")
        if points:
            out.append("\n".join(points) + "\n\n")
        return "".join(out)

    def _cited(self, piece: Piece) -> str:
        rendered = []
        for said in piece.said:
            marks, said.checked.numbers = citation_marks(said.sources, self.citations)
            text = " ".join(part for part in (inline_text(said.checked.text), marks) if part)
            rendered.append(text + mark_of(said.checked))
        return " ".join(rendered)

    def _tail(self, coverage: bool = True) -> str:
        context = {
            "coverage": coverage_lines(self.brief.outcomes, self.labels) if coverage else [],
            "labels": self.labels,
            "citation_style": self.writing.citation_style,
            "references": self.citations.references,
        }
        return TEMPLATES.get_template("_tail.md.j2").render(**context)

    def _composed(self, writer: str) -> Composed:
        return Composed(
            "".join(self.written),
            self.citations.references,
            self.verification,
            writer,
            self.config.model,
            fallback=self.first_failure,
            sentences=records(self.verification.sentences),
        )

    async def _all_extractive(self, reason: str | None) -> Composed:
        """The extractive writer's report, whole: nothing for the model to write from (`reason`), or
        nothing the model writes (None: a bibliography's entries)."""
        if reason is not None:
            log.warning("LLM writer has nothing to write from, extractive writer writes the report: %s", reason)
            await self.emit(
                ProgressEvent(
                    ProgressStep.writer_fallback,
                    f"⚠️ The model could not write the report ({reason}); writing it extractively",
                    {"reason": reason, "model": self.config.model},
                )
            )
        markdown, references, verification = await run_on(self.writing.work, write_extractive, self.brief)
        self.verification = verification
        await announce_verification(verification, self.emit)
        for chunk in report_chunks(markdown):
            await self.put(chunk)
        self.first_failure = reason
        composed = self._composed("extractive")
        composed.references = references
        return composed
