"""The extractive writer: evidence in, a report out (title, summary, sections by theme, citations).

Offline and deterministic: every sentence is a sentence of a source, cited to it; sentences that
several sources state cite them together; sections group claims by meaning and take their titles
from their own words.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from fedresearch.core.identifiers import is_url
from fedresearch.core.models import SOURCE_KINDS, FusedResult, ReportType, RetrieverOutcome, RetrieverStatus
from fedresearch.core.text import STOPWORDS, cjk_bigrams
from fedresearch.core.work import WorkPool
from fedresearch.library.chunking import Chunk
from fedresearch.library.formats import Section
from fedresearch.report.citations import Citations, Reference, display_title, reference_entries
from fedresearch.report.evidence import (
    Claim,
    Embed,
    claim_sentences,
    clean_sentence,
    diversify,
    gather,
    jaccard,
    rank,
    select_claims,
    terms,
)
from fedresearch.report.language import Labels, labels_for
from fedresearch.report.markup import inline_text, link_target
from fedresearch.report.types import form_of

TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=False,  # markdown out: text from outside goes through the `text` filter (report/markup.py)
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    auto_reload=False,  # templates ship with the package: checking their mtime on every render is waste
)
TEMPLATES.filters["text"] = inline_text
TEMPLATES.globals["reference_entries"] = reference_entries
_WORDS = re.compile(r"[A-Za-z][A-Za-z0-9\-]+")
_MAX_THEMES = 5
_SUMMARY_CLAIMS = 3


@dataclass
class Part:
    """What one section (or, for detailed reports, one sub-question) is written from."""

    title: str
    sources: list[FusedResult]


@dataclass
class Paragraph:
    text: str


@dataclass
class Theme:
    heading: str
    paragraphs: list[Paragraph] = field(default_factory=list)


def citation_marks(sources: Sequence[FusedResult], citations: Citations) -> tuple[str, list[int]]:
    """Each source's citation, a link to it when it has a URL, and the numbers cited (each once)."""
    marks, numbers = [], []
    for source in sources:
        number = citations.cite(source)
        if number not in numbers:
            numbers.append(number)
            marks.append(f"[[{number}]]({link_target(source.href)})" if is_url(source.href) else f"[{number}]")
    return "".join(marks), numbers


def cite(claim: Claim, citations: Citations) -> str:
    """The claim followed by its citations."""
    return f"{inline_text(claim.text)} {citation_marks(claim.sources, citations)[0]}"


def _similar(a: Claim, b: Claim) -> float:
    if a.vector is not None and b.vector is not None:
        return float(a.vector @ b.vector)
    return 2.5 * jaccard(set(terms(a.text)), set(terms(b.text)))  # Jaccard runs lower than cosine


def themes_of(claims: Sequence[Claim], limit: int = _MAX_THEMES, threshold: float = 0.45) -> list[list[Claim]]:
    """Claims grouped by meaning: each joins the theme whose first claim it is most like, or starts one."""
    groups: list[list[Claim]] = []
    for claim in claims:
        likeness = [_similar(claim, group[0]) for group in groups]
        best = max(range(len(groups)), key=lambda i: likeness[i], default=None)
        if best is not None and (likeness[best] >= threshold or len(groups) >= limit):
            groups[best].append(claim)
        else:
            groups.append([claim])
    return groups


def _phrases(text: str) -> set[str]:
    words = [w for w in _WORDS.findall(text) if w.lower() not in STOPWORDS and len(w) > 2]
    return {f"{a} {b}" for a, b in itertools.pairwise(words)} | set(cjk_bigrams(text))


def heading_of(group: Sequence[Claim], question: str, used: set[str]) -> str:
    """A section title from the theme's own words: a phrase several of its claims (or their sources'
    titles) share, else the title of its leading source."""
    asked = {word.lower() for word in _WORDS.findall(question)}
    shared: Counter[str] = Counter()
    for claim in group:
        shared.update(_phrases(f"{claim.text} {claim.source.title}"))
    for phrase, uses in sorted(shared.items(), key=lambda item: (-item[1], -len(item[0]))):
        novel = set(phrase.lower().split()) - asked
        if uses >= 2 and novel and phrase.lower() not in used:
            used.add(phrase.lower())
            return phrase[0].upper() + phrase[1:]
    title = display_title(group[0].source)
    words = title.split()
    heading = " ".join(words[:9]) + (" …" if len(words) > 9 else "")
    used.add(heading.lower())
    return heading


def _paragraphs(group: Sequence[Claim], citations: Citations) -> list[Paragraph]:
    """One paragraph per source within a theme, its sentences in the source's own order."""
    by_source: dict[str, list[Claim]] = {}
    for claim in group:
        by_source.setdefault(claim.source.key, []).append(claim)
    return [
        Paragraph(" ".join(cite(c, citations) for c in sorted(claims, key=lambda c: (c.evidence.position, c.position))))
        for claims in by_source.values()
    ]


def coverage_lines(outcomes: Sequence[RetrieverOutcome]) -> list[str]:
    lines = []
    for outcome in outcomes:
        if outcome.status is RetrieverStatus.done:
            lines.append(f"{outcome.name}: {outcome.count} results in {outcome.elapsed_ms:.0f} ms")
        else:
            lines.append(f"{outcome.name}: {outcome.status.value} — {outcome.error}")
    return lines


@dataclass
class Writing:
    """Everything a writer needs besides the sources: fetched pages, the encoder, the language."""

    pages: dict[str, list[Section]] = field(default_factory=dict)
    embed: Embed | None = None
    language: str | None = None
    citation_style: str | None = None  # CSL style of the References (None: CITATION_STYLE's default, APA)
    support_threshold: float = 0.5  # REPORT_SUPPORT_THRESHOLD: what the verifier counts as supported
    work: WorkPool | None = None  # the threads it is written on (None: asyncio's default pool)
    # time.monotonic() by which a model must have finished, so that the extractive writer can still
    # finish the report before the task's time is up (None: no such limit)
    deadline: float | None = None
    passages: dict[str, list[Chunk]] = field(default_factory=dict, repr=False)  # `pages` cut, by source key


@dataclass(frozen=True)
class Brief:
    """What a report is written from, whichever writer writes it: the question and its type, the
    sources (fused, best first), how each retriever fared, the pages read and the writer's options,
    and for a report split into sub-questions, each one's own sources."""

    question: str
    report_type: ReportType
    sources: list[FusedResult]
    outcomes: Sequence[RetrieverOutcome] = ()
    writing: Writing = field(default_factory=Writing)
    parts: Sequence[Part] = ()

    @property
    def every_source(self) -> list[FusedResult]:
        """The sources, then those of the parts that are not among them."""
        return self.sources + [s for part in self.parts for s in part.sources if s not in self.sources]


def _claims(question: str, sources: Sequence[FusedResult], writing: Writing, budget: int) -> list[Claim]:
    ranked = rank(question, gather(sources, writing.pages, writing.passages), writing.embed)
    return select_claims(question, diversify(ranked, k=budget, per_source=3), max_claims=budget)


def _themes(question: str, claims: list[Claim], citations: Citations, titled: str | None = None) -> list[Theme]:
    used: set[str] = set()
    themes = []
    for group in themes_of(claims) if titled is None else [claims]:
        heading = titled or heading_of(group, question, used)
        themes.append(Theme(heading, _paragraphs(group, citations)))
    return themes


def write_report(brief: Brief) -> tuple[str, list[Reference]]:
    """The report's markdown and the references it cites, in citation order.

    The brief's `parts` (detailed reports) give one section per sub-question, each from its own sources.
    """
    question, report_type, sources, writing = brief.question, brief.report_type, brief.sources, brief.writing
    labels = labels_for(question, writing.language)
    citations = Citations()
    context: dict[str, object] = {"question": question, "coverage": coverage_lines(brief.outcomes), "labels": labels}
    context["citation_style"] = writing.citation_style
    form = form_of(report_type)
    if form.layout == "resources":
        context["entries"] = _resources(sources, citations, labels)
    elif form.layout == "outline":
        claims = _claims(question, sources, writing, budget=12)
        context["themes"] = _themes(question, claims, citations)
    else:
        _research(brief, citations, context, detailed=form.decomposes)
    context["references"] = citations.references
    markdown = TEMPLATES.get_template(form.template).render(**context)
    return markdown, citations.references


def _research(brief: Brief, citations: Citations, context: dict[str, object], detailed: bool) -> None:
    """A summary of the best claims, then themes; a detailed report adds a section per part."""
    question, sources, writing = brief.question, brief.sources, brief.writing
    budget = 14 if detailed else 24
    claims = _claims(question, sources, writing, budget=budget)
    summary, rest = claims[:_SUMMARY_CLAIMS], claims[_SUMMARY_CLAIMS:]
    context["summary"] = " ".join(cite(claim, citations) for claim in summary)
    themes = _themes(question, rest, citations) if rest else []
    for part in brief.parts:
        part_claims = _claims(part.title, part.sources, writing, budget=10)
        fresh = [c for c in part_claims if c.text not in {x.text for x in claims}]
        if fresh:
            themes.extend(_themes(part.title, fresh, citations, titled=part.title))
    context["themes"] = themes
    context["source_count"] = len(sources)


def _resources(sources: Sequence[FusedResult], citations: Citations, labels: Labels) -> list[dict[str, object]]:
    """Sources grouped by the kind of upstream that found them (`About.kind`), the user's own first."""
    entries = []
    listed = sorted(sources[:20], key=lambda source: SOURCE_KINDS.index(source.kind))
    for source in listed:
        summary = inline_text(" ".join(claim_sentences(source.body)[:2]) or clean_sentence(source.body[:300]))
        number = citations.cite(source)
        link = link_target(source.href) if is_url(source.href) else None
        entry = {"number": number, "title": display_title(source), "summary": summary, "source": source, "link": link}
        entries.append({**entry, "group": labels.kinds[source.kind]})
    return entries


__all__ = ["TEMPLATES", "Brief", "Labels", "Part", "Writing", "citation_marks", "write_report"]
