"""A report planned as sections, for the model to write one at a time: the extractive writer's own
layout of the report's type (report/writer.py), each of its sections with its heading, its role in
the form, what its evidence is ranked against, where that evidence comes from, the passages the
extractive writer quoted in it, and the extractive writer's text of it, which stands in for the
section when the model cannot write it.

The plan is the extractive writer's so that both writers give a type the same form: research's
answer, themed sections, disagreements and open questions and conclusion; a detailed report's
introduction, a section per sub-question (deep research's follow-ups as subsections) and conclusion;
an outline's numbered sections of points; headings in the report's language either way.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from fedresearch.core.models import FusedResult
from fedresearch.report.citations import Reference
from fedresearch.report.evidence import Evidence
from fedresearch.report.language import Labels
from fedresearch.report.writer import Block, Brief, Role, draft_report, render_blocks, without_children

# the roles that sum the others up: the model writes them after the others, from their drafts
SUMMARIES: frozenset[Role] = frozenset({"answer", "introduction", "conclusion"})
_FINDINGS: frozenset[Role] = frozenset({"findings", "points"})


@dataclass(frozen=True)
class PlannedSection:
    """One section: `heading` as the report shows it (Markdown), `title` as the model is told it."""

    heading: str
    title: str
    level: int
    role: Role
    focus: str
    sources: Sequence[FusedResult]
    quoted: Sequence[Evidence]
    extractive: str  # the extractive writer's section, heading included, cited as the plan's `references`

    @property
    def rewritten(self) -> bool:
        """Whether the model writes it (an annotated bibliography's entries are code's)."""
        return self.role != "entries"


@dataclass(frozen=True)
class ReportPlan:
    title: str  # the report's title, as its first line says it (outline and resources say what they are)
    lead: list[str]  # what the report says before its sections (thin evidence, deep research's levels)
    sections: list[PlannedSection]
    references: list[Reference]  # how the extractive sections number their citations
    labels: Labels
    notes: list[str] = field(default_factory=list)  # the extractive writer's remarks on its own writing

    @property
    def rewritten(self) -> list[PlannedSection]:
        return [section for section in self.sections if section.rewritten]

    def sums_up(self, section: PlannedSection) -> bool:
        """Whether the model writes `section` from the other sections' drafts rather than from
        passages: a conclusion always; an answer or introduction where there are findings to sum up
        (a research report on thin evidence may have none: its answer is written from passages)."""
        if section.role not in SUMMARIES:
            return False
        return section.role == "conclusion" or any(s.role in _FINDINGS for s in self.sections)


def plan_report(brief: Brief) -> ReportPlan:
    """The report's sections as the extractive writer lays out its type, subsections after their
    section (each written on its own)."""
    draft, context = draft_report(brief)
    sections = [section for block in context["blocks"] for section in _flattened(block)]
    notes = list(context["writer_notes"]) + ([draft.labels.foreign] if draft.foreign else [])
    return ReportPlan(
        context["title"], list(context["lead"]), sections, draft.citations.references, draft.labels, notes
    )


def _flattened(block: Block) -> list[PlannedSection]:
    basis = block.basis
    own = without_children(block) if basis is not None else block  # entries keep their entries
    section = PlannedSection(
        heading=block.heading,
        title=plain(block.heading),
        level=block.level,
        role=basis.role if basis is not None else "entries",
        focus=basis.focus if basis is not None else "",
        sources=basis.sources if basis is not None else (),
        quoted=basis.quoted if basis is not None else (),
        extractive=render_blocks([own]),
    )
    children = [s for child in block.children for s in _flattened(child)] if basis is not None else []
    return [section, *children]


def plain(markdown: str) -> str:
    """A heading as text: the escapes of outside text undone."""
    return re.sub(r"\\(.)", r"\1", markdown)
