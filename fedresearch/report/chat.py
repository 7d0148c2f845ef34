"""Chat about a report: answers the question asked, grounded in the report's evidence and cited
with its numbers; when that evidence does not speak to the question, the task's retrievers are
asked again; when nothing does, the answer says so instead of quoting something unrelated.

A question after a source ("Which paper introduced …?", "Who proposed …?") is answered by naming the
source whose title and evidence best match its subject, with its full reference.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace
from typing import Any

from fedresearch.core.events import ProgressEvent
from fedresearch.core.identifiers import canonical_key
from fedresearch.core.models import FusedResult, ResearchRequest
from fedresearch.core.text import split_sentences
from fedresearch.core.work import run_on
from fedresearch.federation.planning import Plan
from fedresearch.federation.runner import Deps
from fedresearch.library.crosslingual import query_texts
from fedresearch.report.bibliography import citation_of
from fedresearch.report.citations import Citations, reference_entries
from fedresearch.report.evidence import Claim, diversify, gather, rank, select_claims, terms
from fedresearch.report.language import labels_for
from fedresearch.report.markup import inline_text, read_link, read_text
from fedresearch.report.task import ResearchOutcome, ResearchTools, gather_sources, writing_for
from fedresearch.report.writer import Writing, cite

_CLAIMS = 4
_TRANSLATED_SHARED = 2  # English terms of a Chinese message a sentence or title must hold to bear on it
# the words that ask for a source rather than say what it is about: "which paper introduced X" is about X
_ASKING = frozenset(
    terms(
        "which what who whom whose paper papers article articles study studies publication publications work "
        "works source sources introduced introduce introduces proposed propose proposes invented invent "
        "developed develop wrote write first described describe presented present originally original "
        "name named cite cited reference tell explain"
    )
)
_ASKS_FOR_A_SOURCE = re.compile(
    r"\b(?:which|what)\s+(?:\w+\s+)?(?:paper|article|study|publication|work|source)s?\b"
    r"|\bwho\s+(?:first\s+)?(?:introduced|proposed|invented|developed|wrote|described|coined)\b"
    r"|哪(?:一)?篇|哪些论文|谁(?:最早|首先)?提出",
    re.IGNORECASE,
)
_NOTHING = {
    "en": "Neither this report's sources nor a new search of {searched} say anything about “{question}”.",
    "zh": "这份报告的来源和对 {searched} 的新检索都没有谈到“{question}”。",
}
_NOTHING_UNSEARCHED = {
    "en": "This report's sources say nothing about “{question}”, and this chat has no retrievers to search again.",
    "zh": "这份报告的来源没有谈到“{question}”，这次对话也没有可以重新检索的来源。",
}
_THE_SOURCE = {
    "en": "These sources point to {entry} [{number}].",
    "zh": "这些来源指向 {entry} [{number}]。",
}


@dataclass(frozen=True)
class ChatAnswer:
    content: str
    metadata: dict[str, Any]


def subject_terms(message: str) -> set[str]:
    """What a message asks about: its terms without the words that only ask ("which paper …")."""
    wanted = set(terms(message))
    return (wanted - _ASKING) or wanted


@functools.lru_cache(maxsize=256)
def translated_terms(message: str) -> frozenset[str]:
    """A Chinese message's subject in English (library/crosslingual.py: a few senses a word, so they
    are many and loose: short ones are left out); empty for a message with no Chinese."""
    read = query_texts(message, senses=3)
    return frozenset(term for term in terms(" ".join(read.english)) if len(term) >= 4) - _ASKING


def bears_on(message: str, text: str) -> bool:
    """Whether a sentence speaks to the message: it shares half its subject's terms (at least one),
    or two of a Chinese message's English ones (a Chinese question about English sources)."""
    wanted, said = subject_terms(message), set(terms(text))
    if wanted and len(wanted & said) >= max(1, (len(wanted) + 1) // 2):
        return True
    return len(translated_terms(message) & said) >= _TRANSLATED_SHARED


def covers(message: str, claims: list[Claim]) -> bool:
    """Whether the claims speak to the message at all: one of them bears on it."""
    return any(bears_on(message, claim.text) for claim in claims)


def _claims(message: str, sources: list[FusedResult], writing: Writing) -> list[Claim]:
    """The evidence's sentences that bear on the message, best first; none when none does."""
    ranked = rank(message, gather(sources, writing.pages, writing.passages), writing.embed, writing.term_counts)
    picked = select_claims(message, diversify(ranked, k=12, per_source=2), max_claims=3 * _CLAIMS)
    return [claim for claim in picked if bears_on(message, claim.text)][:_CLAIMS]


def named_source(message: str, claims: list[Claim]) -> FusedResult | None:
    """For a question after a source, the one it asks for: of the sources of the claims, the one
    whose title says most of the question's subject (a scholarly record before a note or page)."""
    if not _ASKS_FOR_A_SOURCE.search(message) or not claims:
        return None
    wanted = subject_terms(message)
    sources = {claim.source.key: claim.source for claim in claims}

    english = translated_terms(message)

    def fit(source: FusedResult) -> tuple[float, int]:
        said = set(terms(source.title))
        scholarly = citation_of(source).kind in ("journal", "proceedings", "preprint", "paper")
        share = len(wanted & said) / len(wanted)
        if len(english & said) >= _TRANSLATED_SHARED:  # a Chinese question naming an English title's terms
            share = max(share, 0.5)
        return share, int(scholarly)

    best = max(sources.values(), key=fit)
    return best if fit(best)[0] >= 0.5 else None


@dataclass
class ChatSession:
    request: ResearchRequest
    plan: Plan
    outcome: ResearchOutcome

    async def answer(self, message: str, tools: ResearchTools) -> ChatAnswer:
        sources, searched = self.outcome.sources, False
        writing = self.outcome.writing
        claims = await run_on(writing.work, _claims, message, sources, writing)
        if not claims and self.plan.names:
            fresh, _ = await gather_sources(message, replace(self.plan, urls=()), tools, _quiet)
            claims = await run_on(writing.work, _claims, message, fresh, writing)
            searched = True
        # its references are written by the CSL processor: CPU work, off the event loop
        return await run_on(writing.work, self._render, message, claims, searched)

    def _render(self, message: str, claims: list[Claim], searched: bool) -> ChatAnswer:
        citations = Citations()
        for reference in self.outcome.references:  # the report's numbers stay the same in chat
            citations.cite(reference.source)
        language = labels_for(message, self.outcome.writing.language).code
        if not claims:
            names = ", ".join(self.plan.names)
            template = (_NOTHING if names else _NOTHING_UNSEARCHED).get(language, _NOTHING["en"])
            content = template.format(searched=names, question=inline_text(message))
            return ChatAnswer(content, {"references": [], "searched": searched})
        lead = []
        named = named_source(message, claims)
        if named is not None:
            number = citations.cite(named)
            claims = sorted(claims, key=lambda claim: claim.source.key != named.key)  # its own words first
            (entry,) = [e for r, e in self._entries(citations, {number}, language)]
            lead.append(_THE_SOURCE.get(language, _THE_SOURCE["en"]).format(entry=entry, number=number))
        text = " ".join(lead + [cite(claim, citations) for claim in claims])
        cited = {citations.cite(source) for claim in claims for source in claim.sources}
        if named is not None:
            cited.add(citations.cite(named))
        listed = self._entries(citations, cited, language)
        lines = [f"[{reference.number}] {entry}" for reference, entry in listed]
        metadata = [{"number": r.number, "title": r.title, "href": r.link, "entry": e} for r, e in listed]
        return ChatAnswer(f"{text}\n\n" + "\n\n".join(lines), {"references": metadata, "searched": searched})

    def _entries(self, citations: Citations, numbers: set[int], language: str) -> list[tuple[Any, str]]:
        chosen = [reference for reference in citations.references if reference.number in numbers]
        return reference_entries(chosen, self.outcome.writing.citation_style, language)


async def _quiet(_: ProgressEvent) -> None:
    return None


_CITATION = re.compile(r"\s*(?:\[\[\d+\]\]\([^)\s]*\)|\[\d+\])")  # [3], or [[3]](link) as the writers link it
_LEADING_CITATIONS = re.compile(rf"(?:{_CITATION.pattern})+\s*")
_REFERENCE_LINE = re.compile(r"^\[(\d+)\]\s+(?P<entry>.+?)\s*$")
_LINK = re.compile(r"(?<!\\)\[((?:\\.|[^\[\]\\])*)\]\((\S+?)\)")  # [text](target), its text escaped as inline_text does
_EMPHASIS_MARK = re.compile(r"(?<!\\)\*+")
_REFERENCES_HEADING = re.compile(r"\n## (?:References|参考文献)\s*\n")


def _reference(entry: str) -> tuple[str, str]:
    """A References line's link (its entry's DOI or address, else the id after its last dash) and
    its text as it reads (the title, for the writers' older one-link lines)."""
    link = _LINK.search(entry)
    if link is not None:
        text = _LINK.sub(lambda match: match.group(1), entry)
        whole = link.group(0) == entry.strip()  # `[title](link)`, as references were written before
        return read_link(link.group(2)), read_text(_EMPHASIS_MARK.sub("", link.group(1) if whole else text))
    text, _, where = entry.rpartition(" — ")
    identifier = where.rsplit(", ", 1)[-1].strip() if text else ""
    return read_text(identifier), read_text(_EMPHASIS_MARK.sub("", text or entry))


def report_sources(markdown: str) -> list[FusedResult]:
    """A saved report's references as sources, numbered as the report numbers them, each carrying
    the report's sentences that cite it: the evidence a chat about a report with no live task has."""
    parts = _REFERENCES_HEADING.split(markdown, maxsplit=1)
    body, listed = (parts[0], parts[1]) if len(parts) == 2 else (markdown, "")
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
        link, title = _reference(match.group("entry"))
        citing = " ".join(s for s in sentences if f"[{number}]" in s)
        text = read_text(_CITATION.sub("", citing).strip())
        sources.append(
            FusedResult(
                key=canonical_key(link or title),
                href=link or title,
                title=title,
                body=text,
                score=1 / number,
                retrievers=[],
                ranks={},
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
