"""Chat about a report: answers grounded in the report's evidence and cited with its numbers; when
that evidence does not cover the question, the same retrievers are asked again."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from fedresearch.core.events import ProgressEvent
from fedresearch.core.identifiers import canonical_key, is_url
from fedresearch.core.models import FusedResult, ResearchRequest
from fedresearch.core.text import split_sentences
from fedresearch.core.work import run_on
from fedresearch.federation.planning import Plan
from fedresearch.federation.runner import Deps
from fedresearch.report.citations import Citations
from fedresearch.report.evidence import Claim, diversify, gather, rank, select_claims, terms
from fedresearch.report.markup import inline_text, read_link, read_text
from fedresearch.report.task import ResearchOutcome, ResearchTools, gather_sources, writing_for
from fedresearch.report.writer import Writing, cite

_CLAIMS = 4


@dataclass(frozen=True)
class ChatAnswer:
    content: str
    metadata: dict[str, Any]


def _claims(message: str, sources: list[FusedResult], writing: Writing) -> list[Claim]:
    ranked = rank(message, gather(sources, writing.pages, writing.passages), writing.embed)
    return select_claims(message, diversify(ranked, k=8, per_source=2), max_claims=_CLAIMS)


def covers(message: str, claims: list[Claim]) -> bool:
    """Whether the claims speak to the message at all: most of its terms appear in them."""
    wanted = set(terms(message))
    said = {term for claim in claims for term in terms(claim.text)}
    return bool(wanted) and len(wanted & said) >= max(1, len(wanted) // 2)


@dataclass
class ChatSession:
    request: ResearchRequest
    plan: Plan
    outcome: ResearchOutcome

    async def answer(self, message: str, tools: ResearchTools) -> ChatAnswer:
        sources, searched = self.outcome.sources, False
        claims = await run_on(self.outcome.writing.work, _claims, message, sources, self.outcome.writing)
        if not covers(message, claims) and self.plan.names:
            fresh, _ = await gather_sources(message, replace(self.plan, urls=()), tools, _quiet)
            claims = await run_on(self.outcome.writing.work, _claims, message, fresh, self.outcome.writing)
            searched = True
        return self._render(claims, searched)

    def _render(self, claims: list[Claim], searched: bool) -> ChatAnswer:
        citations = Citations()
        for reference in self.outcome.references:  # the report's numbers stay the same in chat
            citations.cite(reference.source)
        if not claims:
            content = "Neither this report's sources nor a new search say anything about that."
            return ChatAnswer(content, {"references": [], "searched": searched})
        text = " ".join(cite(claim, citations) for claim in claims)
        cited = sorted({citations.cite(source) for claim in claims for source in claim.sources})
        lines = []
        for reference in citations.references:
            if reference.number in cited:
                title = inline_text(reference.title)
                link = (
                    f"[{title}]({reference.target})"
                    if is_url(reference.link)
                    else f"{title} — {inline_text(reference.link)}"
                )
                lines.append(f"[{reference.number}] {link}")
        listed = [
            {"number": r.number, "title": r.title, "href": r.link} for r in citations.references if r.number in cited
        ]
        return ChatAnswer(f"{text}\n\n" + "\n".join(lines), {"references": listed, "searched": searched})


async def _quiet(_: ProgressEvent) -> None:
    return None


_CITATION = re.compile(r"\s*(?:\[\[\d+\]\]\([^)\s]*\)|\[\d+\])")  # [3], or [[3]](link) as the writers link it
_LEADING_CITATIONS = re.compile(rf"(?:{_CITATION.pattern})+\s*")
_REFERENCE_LINE = re.compile(r"^\[(\d+)\]\s+(?:\[(?P<title>.+)\]\((?P<link>\S+)\)|(?P<plain>.+?) — (?P<id>\S+))\s*$")


def report_sources(markdown: str) -> list[FusedResult]:
    """A saved report's references as sources, numbered as the report numbers them, each carrying
    the report's sentences that cite it: the evidence a chat about a report with no live task has."""
    body, _, listed = markdown.partition("\n## References")
    sentences: list[str] = []
    prose = " ".join(line for line in body.splitlines() if not line.lstrip().startswith("#"))  # headings claim nothing
    for sentence in split_sentences(" ".join(prose.split())):
        # the writers cite after the full stop ("… well. [[1]](link) Next …"): the markers that
        # open a sentence are the last one's
        leading = _LEADING_CITATIONS.match(sentence)
        if sentences and leading:
            sentences[-1] += " " + leading.group().strip()
            sentence = sentence[leading.end() :]
        if sentence:
            sentences.append(sentence)
    sources = []
    for line in listed.splitlines():
        match = _REFERENCE_LINE.match(line.strip())
        if match is None:
            continue
        number = int(match.group(1))
        link = read_link(match.group("link")) if match.group("link") else read_text(match.group("id") or "")
        title = read_text(match.group("title") or match.group("plain") or link)
        citing = " ".join(s for s in sentences if f"[{number}]" in s)
        text = read_text(_CITATION.sub("", citing).strip())
        sources.append(
            FusedResult(
                key=canonical_key(link), href=link, title=title, body=text, score=1 / number, retrievers=[], ranks={}
            )
        )
    return sources


def session_from_report(markdown: str, request: ResearchRequest, plan: Plan, deps: Deps) -> ChatSession:
    """A chat session about a report known only by its text (a finished job, or GPT-Researcher's
    `POST /api/chat` with `report`): the report's cited sentences are the evidence, and `plan`'s
    retrievers are asked again when they do not cover a question."""
    sources = report_sources(markdown)
    citations = Citations()
    for source in sources:
        citations.cite(source)
    outcome = ResearchOutcome(
        report_id="",
        markdown=markdown,
        files={},
        sources=sources,
        references=citations.references,
        outcomes=[],
        retrieval_ms=0.0,
        writing=writing_for(request, deps),
    )
    return ChatSession(request, plan, outcome)
