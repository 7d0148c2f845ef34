"""The extractive report writer: fused evidence in, markdown with inline citations out."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from fedresearch.core.models import SOURCE_KINDS, FusedResult, ReportType, RetrieverOutcome, RetrieverStatus
from fedresearch.report.citations import Citations, Reference, display_title
from fedresearch.report.evidence import Claim, claim_sentences, select_claims

_TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=False,  # markdown out; evidence is cleaned sentence by sentence instead
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)

_HEADINGS = {
    "library": "From your library",
    "knowledge": "From your knowledge bases",
    "scholarly": "From the scholarly record",
    "web": "From the web",
}


@dataclass(frozen=True)
class Paragraph:
    text: str
    citations: list[int]


@dataclass(frozen=True)
class Group:
    heading: str
    paragraphs: list[Paragraph]


def _grouped(claims: list[Claim], citations: Citations) -> list[Group]:
    """One paragraph per source, sources in order of their best claim, the user's own sources first."""
    groups = []
    for kind in SOURCE_KINDS:
        by_source: dict[str, list[Claim]] = {}
        for claim in claims:
            if claim.source.kind == kind:
                by_source.setdefault(claim.source.key, []).append(claim)
        paragraphs = [
            Paragraph(
                " ".join(claim.text for claim in sorted(group, key=lambda c: c.position)),
                [citations.cite(group[0].source)],
            )
            for group in by_source.values()
        ]
        if paragraphs:
            groups.append(Group(_HEADINGS[kind], paragraphs))
    return groups


def _coverage(outcomes: list[RetrieverOutcome]) -> list[str]:
    lines = []
    for outcome in outcomes:
        if outcome.status is RetrieverStatus.done:
            lines.append(f"{outcome.name}: {outcome.count} results in {outcome.elapsed_ms:.0f} ms")
        else:
            lines.append(f"{outcome.name}: {outcome.status.value} — {outcome.error}")
    return lines


def write_report(
    question: str,
    report_type: ReportType,
    sources: list[FusedResult],
    outcomes: list[RetrieverOutcome],
) -> tuple[str, list[Reference]]:
    """The report's markdown and the references it cites, in citation order."""
    citations = Citations()
    context: dict[str, object] = {"question": question, "coverage": _coverage(outcomes)}
    if report_type is ReportType.resource_report:
        entries = []
        for source in sources[:20]:
            summary = " ".join(claim_sentences(source.body)[:2]) or source.body[:300]
            entries.append(
                {"number": citations.cite(source), "title": display_title(source), "summary": summary, "source": source}
            )
        context["entries"] = entries
    elif report_type is ReportType.outline_report:
        claims = select_claims(question, sources, max_claims=8, per_source=1)
        context["groups"] = _grouped(claims, citations)
    else:
        claims = select_claims(question, sources)
        context["groups"] = _grouped(claims, citations)
        context["source_count"] = len(sources)
    context["references"] = citations.references
    markdown = _TEMPLATES.get_template(f"{report_type.value}.md.j2").render(**context)
    return markdown, citations.references
