"""Chat about a report: answers grounded in the report's evidence and cited with its numbers; when
that evidence does not cover the question, the same retrievers are asked again."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any

from fedresearch.core.events import ProgressEvent
from fedresearch.core.identifiers import is_url
from fedresearch.core.models import FusedResult, ResearchRequest
from fedresearch.federation.contract import Adapter
from fedresearch.federation.planning import Plan
from fedresearch.federation.runner import Deps
from fedresearch.report.citations import Citations
from fedresearch.report.evidence import Claim, diversify, gather, rank, select_claims, terms
from fedresearch.report.task import ResearchOutcome, gather_sources
from fedresearch.report.writer import Writing, cite

_CLAIMS = 4


@dataclass(frozen=True)
class ChatAnswer:
    content: str
    metadata: dict[str, Any]


def _claims(message: str, sources: list[FusedResult], writing: Writing) -> list[Claim]:
    ranked = rank(message, gather(sources, writing.pages), writing.embed)
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

    async def answer(self, message: str, registry: dict[str, Adapter], deps: Deps) -> ChatAnswer:
        sources, searched = self.outcome.sources, False
        claims = await asyncio.to_thread(_claims, message, sources, self.outcome.writing)
        if not covers(message, claims) and self.plan.names:
            fresh, _ = await gather_sources(message, replace(self.plan, urls=()), registry, deps, _quiet)
            claims = await asyncio.to_thread(_claims, message, fresh, self.outcome.writing)
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
                link = (
                    f"[{reference.title}]({reference.target})"
                    if is_url(reference.link)
                    else f"{reference.title} — {reference.link}"
                )
                lines.append(f"[{reference.number}] {link}")
        listed = [
            {"number": r.number, "title": r.title, "href": r.link} for r in citations.references if r.number in cited
        ]
        return ChatAnswer(f"{text}\n\n" + "\n".join(lines), {"references": listed, "searched": searched})


async def _quiet(_: ProgressEvent) -> None:
    return None
