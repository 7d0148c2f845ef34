"""A written report as either writer hands it over (`Composed`), and what both writers do with
extractive text: write it verified, renumber its citations into another report's References, send
it in frames that end on paragraph boundaries, and record its checked sentences."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fedresearch.core.events import Emit, ProgressEvent, ProgressStep
from fedresearch.report.citations import Citations, Reference
from fedresearch.report.evidence import gather
from fedresearch.report.language import REFERENCES_HEADING
from fedresearch.report.verify import MARKERS, Checked, Thresholds, Verification, verify_rendered
from fedresearch.report.writer import Brief, Writing, citation_marks, write_report

SendReport = Callable[[str], Awaitable[None]]
_REPORT_CHUNK = 2000


@dataclass(frozen=True)
class SavedReport:
    """A written report as saved: its files' names (as `path` frames list them) and its JSON record."""

    files: dict[str, str]
    record: bytes


@dataclass
class Composed:
    markdown: str
    references: list[Reference]
    verification: Verification
    writer: str  # "llm", "extractive", or "llm+extractive" (the model failed on part of it)
    model: str | None = None
    fallback: str | None = None
    sentences: list[dict[str, Any]] = field(default_factory=list)
    saved: SavedReport | None = None  # what `save` returned, when compose was given one


# saves a written report; runs on a writer thread
SaveReport = Callable[[Composed], SavedReport]


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


def evidence_texts(references: Sequence[Reference], writing: Writing) -> dict[int, str]:
    """What each reference's source says: its result text and the pages read behind it."""
    texts = {}
    for reference in references:
        passages = gather([reference.source], writing.pages, writing.passages)
        texts[reference.number] = "\n".join(p.text for p in passages)
    return texts


def records(sentences: Sequence[Checked]) -> list[dict[str, Any]]:
    return [
        {"text": s.text, "citations": s.numbers, "support": s.support, "verdict": s.verdict}
        for s in sentences
        if s.verdict != "prose"
    ]


def quotation_thresholds(writing: Writing) -> Thresholds:
    # its sentences are quotations, matched word for word: encoding whole pages would buy nothing
    return Thresholds(support=writing.support_threshold, drop=writing.support_threshold / 2)


def verified_quotations(markdown: str, texts: dict[int, str], writing: Writing) -> tuple[str, Verification]:
    """Extractive text checked in place against its references' `texts`, each sentence's `numbers`
    its citations as they stand."""
    markdown, verification = verify_rendered(markdown, texts, None, quotation_thresholds(writing))
    for checked in verification.sentences:
        checked.numbers = list(checked.cited)
    return markdown, verification


def write_extractive(brief: Brief) -> tuple[str, list[Reference], Verification]:
    """Written and verified in one go, so in one trip to a thread (each trip wakes both sides)."""
    markdown, references = write_report(brief)
    markdown, verification = verified_quotations(markdown, evidence_texts(references, brief.writing), brief.writing)
    return markdown, references, verification


def renumbered(markdown: str, references: list[Reference], citations: Citations, checked: Sequence[Checked]) -> str:
    """Extractive text (a whole report's body, no title or References, or one section of it) with its
    citations numbered into `citations`, and its `checked` sentences' numbers with them."""
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


async def send_all(markdown: str, send: SendReport | None) -> None:
    for chunk in report_chunks(markdown) if send is not None else []:
        await send(chunk)  # type: ignore[misc]


async def announce_verification(verification: Verification, emit: Emit) -> None:
    await emit(ProgressEvent(ProgressStep.verification, verification.summary(), verification.counts()))
