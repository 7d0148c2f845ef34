"""The report types: what each is and how it is written, in one registry every other part reads (the
planner and the writers here; the WebSocket's validation, the CLI's choices, the page's menu, the
MCP tool's schema and OpenAPI above).

The names are GPT-Researcher's (`ReportType`, core/models.py: the words its clients send); a type
is added with a member there and its form here, and every type must have one (checked at import).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fedresearch.core.models import ReportType

# how the extractive writer lays a type out (report/writer.py LAYOUTS)
Layout = Literal["research", "detailed", "deep", "outline", "resources", "custom", "subtopic"]


@dataclass(frozen=True)
class ReportForm:
    """One report type: how menus name it and what it gives, whether its question is split into
    sub-questions (each searched and written up on its own), how the extractive writer lays it out
    (`layout`, report/writer.py LAYOUTS; the model writes the same layout section by section,
    report/sections.py), whether the model writes it (an annotated bibliography's entries are
    code's), and the request fields it needs besides the question (a type that needs some is not
    offered where only a question is asked)."""

    type: ReportType
    label: str
    description: str
    layout: Layout = "research"
    decomposes: bool = False
    written_by_model: bool = True
    needs: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.type.value

    @property
    def offered(self) -> bool:
        """Whether it can be asked with a question alone (the page's menu, the CLI's choices)."""
        return not self.needs


REPORT_FORMS: dict[ReportType, ReportForm] = {
    form.type: form
    for form in (
        ReportForm(
            ReportType.research_report,
            "Research report",
            "a direct answer, sections by theme, disagreements and open questions, a conclusion; every claim cited",
        ),
        ReportForm(
            ReportType.detailed_report,
            "Detailed report",
            "an introduction, the question split into sub-questions, each searched on its own and given its "
            "section, a conclusion",
            layout="detailed",
            decomposes=True,
        ),
        ReportForm(
            ReportType.deep,
            "Deep research",
            "recursive research: follow-up questions about what each sub-question found (DEEP_RESEARCH_BREADTH "
            "x DEEP_RESEARCH_DEPTH), each given its section; longer than the detailed report",
            layout="deep",
            decomposes=True,
        ),
        ReportForm(
            ReportType.resource_report,
            "Resources",
            "an annotated bibliography of the sources that bear on the question, grouped by theme",
            layout="resources",
            written_by_model=False,
        ),
        ReportForm(
            ReportType.outline_report,
            "Outline",
            "section headings, each with the points it would make, cited",
            layout="outline",
        ),
        ReportForm(
            ReportType.custom_report,
            "Custom report",
            "a report written as the request's custom_prompt asks (form, length, focus), saying what it could not do",
            layout="custom",
            needs=("custom_prompt",),
        ),
        ReportForm(
            ReportType.subtopic_report,
            "Subtopic report",
            "a report on one subtopic within the request's parent_query, leaving out its existing_headers",
            layout="subtopic",
            needs=("parent_query",),
        ),
    )
}

if set(REPORT_FORMS) != set(ReportType):  # a type added to the protocol without its form
    raise RuntimeError(f"report types without a form: {sorted(set(ReportType) - set(REPORT_FORMS))}")


def form_of(report_type: ReportType) -> ReportForm:
    return REPORT_FORMS[report_type]


def offered_forms() -> list[ReportForm]:
    """The types asked with a question alone, in the registry's order."""
    return [form for form in REPORT_FORMS.values() if form.offered]
