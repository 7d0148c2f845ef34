"""One research task: a planned request in, progress events and a saved, cited report out."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from fedresearch.core.events import Emit, ProgressEvent, ProgressStep
from fedresearch.core.models import FusedResult, ReportType, ResearchRequest, RetrieverOutcome
from fedresearch.core.settings import Settings
from fedresearch.federation.contract import Adapter
from fedresearch.federation.fusion import fuse
from fedresearch.federation.planning import Plan
from fedresearch.federation.runner import Deps, federate
from fedresearch.library.formats import Section
from fedresearch.report.citations import Reference
from fedresearch.report.compose import Composed, SavedReport, SendReport, compose
from fedresearch.report.custom import read_custom_prompt
from fedresearch.report.evidence import RememberedEmbed
from fedresearch.report.language import Labels, labels_for
from fedresearch.report.llm import LlmClients, LlmConfig, WriterFailure, failure_reason, llm_config
from fedresearch.report.pages import PageReader
from fedresearch.report.planner import SubQuestion, model_follow_ups, model_sub_questions, says, sub_questions
from fedresearch.report.reading import read_pages, url_sources
from fedresearch.report.store import record_bytes, report_files
from fedresearch.report.types import form_of
from fedresearch.report.writer import Asked, Brief, Part, Writing

log = logging.getLogger("fedresearch")

# the word pieces of a text the writer's vectors see: the model was fine-tuned on 128 (its limit is
# 256), and a passage of 120 words runs to 140-190; cut there, MED's and CISI's passages rank as well
# (bench.evidence: nDCG@10 0.746 against 0.744, 0.365 against 0.371, noise) for 38% less CPU on MED
RANKING_TOKENS = 128
# retrievers must leave part of the task's time for reading pages, writing and saving the report
_RETRIEVAL_SHARE = 0.8
_READING_SHARE = 0.9
_WRITING_SHARE = 0.9  # of the task's time, by which a model must have written its report
_EXTRACTIVE_S = 3.0  # at least this long is left for the extractive writer to finish a report


@dataclass(frozen=True)
class ResearchTools:
    """What every research task of a process shares, made once at its start: the retrievers, what
    the runner uses (HTTP session, library, breaker, limits), the page reader and the model's clients."""

    registry: dict[str, Adapter]
    deps: Deps
    pages: PageReader | None = None  # None: the pages behind results are not read
    llm: LlmClients | None = None  # None: a client of the model endpoint per call


@dataclass(frozen=True)
class ResearchTask:
    """One task to run: the request as the client sent it, its plan, the user whose key asked (the
    only one, with admins, who may read the saved report) and the id it is saved under."""

    request: ResearchRequest
    plan: Plan
    owner: str | None = None
    report_id: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass(frozen=True)
class ResearchOutcome:
    report_id: str
    markdown: str
    files: dict[str, str]
    sources: list[FusedResult]
    references: list[Reference]
    outcomes: list[RetrieverOutcome]
    retrieval_ms: float
    writing: Writing = field(default_factory=Writing)
    streamed: bool = False  # the report went out through `send` as it was written
    record: bytes = b""  # the saved JSON record, which a shared job store keeps for other hosts


def writing_for(
    request: ResearchRequest, deps: Deps, pages: dict[str, list[Section]] | None = None, user_id: str | None = None
) -> Writing:
    """The writer's options for `request`: the pages read, the encoder's vectors, its language, and
    how `user_id`'s library uses English words (a Chinese question is read in its senses)."""
    library = deps.library
    encoder = library.encoder if library is not None else None
    # int8: the writer's vectors are compared only with each other (passages, its question, its
    # sentences), and its ranking is nearly all of a task's CPU with the model (bench.evidence). In
    # passes of 4: the int8 graph's intermediates (int32 products, their float casts) are 3x the float
    # graph's, and 2 passes of 16 took a process to 546 MB at its peak against 327 for the float
    # graph; passes of 4, 253 MB, and a quarter less CPU than passes of 16 (their tensors stay in cache)
    embed = None
    if encoder is not None:  # remembered: the report's parts and its chat rank the same passages again
        embed = RememberedEmbed(lambda texts: encoder.encode(texts, batch_size=4, int8=True, max_tokens=RANKING_TOKENS))
    threshold = deps.settings.report_support_threshold
    counts = functools.partial(library.store.term_counts, user_id) if library is not None and user_id else None
    return Writing(
        pages=pages or {},
        embed=embed,
        term_counts=counts,
        language=request.language,
        citation_style=request.citation_style or deps.settings.citation_style,
        support_threshold=threshold,
        work=deps.work,
    )


async def gather_sources(
    query: str, plan: Plan, tools: ResearchTools, emit: Emit
) -> tuple[list[FusedResult], list[RetrieverOutcome]]:
    """Every chosen retriever on `query`, fused; the request's own URLs first."""
    registry, deps = tools.registry, tools.deps
    settings = deps.settings
    started = time.perf_counter()
    cap = (round(settings.task_timeout_s * _RETRIEVAL_SHARE, 3), "TASK_TIMEOUT_S")
    options = replace(plan.options, query=query)
    federated = await federate(plan.names, registry, options, deps, emit, cap) if plan.names else None
    results = federated.results if federated else []
    merging = f"🧩 Merging {len(results)} results from {len(plan.names)} retrievers"
    retrieval_ms = round((time.perf_counter() - started) * 1000, 1)
    await emit(ProgressEvent(ProgressStep.merging, merging, {"results": len(results), "retrieval_ms": retrieval_ms}))
    own = url_sources(plan.urls)
    fused = [s for s in fuse(results, settings.retriever_weights) if s.key not in {o.key for o in own}]
    return own + fused, federated.outcomes if federated else []


async def _parts(
    task: ResearchTask, sources: list[FusedResult], tools: ResearchTools, emit: Emit, config: LlmConfig | None
) -> list[Part]:
    """Detailed reports: each sub-question sent to every chosen retriever, all at once; deep research
    then asks follow-up questions about what each found, level by level (`_deeper`)."""
    plan, request = task.plan, task.request
    if not plan.names:
        return []
    labels = labels_for(request.task, request.language)
    deep = request.report_type is ReportType.deep
    settings = tools.deps.settings
    breadth = settings.deep_research_breadth if deep else 3
    questions, planner = await _plan(request.task, sources, config, emit, labels, breadth)
    if not questions:
        return []
    listed = "; ".join(q.heading for q in questions)
    about: dict[str, Any] = {"sub_questions": [q.query for q in questions], "planner": planner}
    if deep:
        total = settings.deep_research_depth
        about |= {"depth": 1, "total_depth": total, "breadth": breadth, "completed_queries": 0}
        about["total_queries"] = len(questions)
    await emit(ProgressEvent(ProgressStep.planning, f"🗂️ Sub-questions: {listed}", about))
    found = await asyncio.gather(*(gather_sources(q.query, plan, tools, _quiet) for q in questions))
    parts = [
        Part(q.heading, part_sources, focus=q.query, phrase=q.phrase)
        for q, (part_sources, _) in zip(questions, found, strict=True)
    ]
    if deep:
        deeper = Deeper(task, tools, emit, labels, config, [part.title for part in parts])
        await deeper.levels(parts, breadth, settings.deep_research_depth)
    return parts


# follow-up planning the model failed on this many times is not asked of it again in that task
_PLANNER_FAILURES = 2


class Deeper:
    """Deep research's levels below the first, as GPT-Researcher's `deep_research` goes: each question
    of a level gets max(2, breadth // 2) follow-up questions about what its own search found and no
    question before it asked (the learnings carried forward), all searched at once; each level's
    progress is a `planning` frame. The follow-ups are the model's, given what the question's search
    found, where one is configured and answers usably; else the extractive planner's."""

    def __init__(
        self,
        task: ResearchTask,
        tools: ResearchTools,
        emit: Emit,
        labels: Labels,
        config: LlmConfig | None,
        asked: list[str],
    ) -> None:
        self.task, self.tools, self.emit, self.labels, self.config = task, tools, emit, labels, config
        self.asked = asked  # every question asked so far, as headed
        self.phrases: set[str] = set()  # the phrases the extractive planner asked about
        self.failures = 0

    async def levels(self, parts: list[Part], breadth: int, depth: int) -> None:
        level, completed = parts, len(parts)
        self.phrases = {part.phrase for part in parts if part.phrase}
        for current in range(2, depth + 1):
            breadth = max(2, breadth // 2)
            follow_ups: list[tuple[Part, SubQuestion]] = []
            planners = set()
            for parent in level:
                found, planner = await self._follow_ups(parent, breadth)
                planners.add(planner)
                for question in found:
                    self.phrases.add(question.phrase)
                    self.asked.append(question.heading)
                    follow_ups.append((parent, question))
            if not follow_ups:
                break
            level = await self._searched(
                follow_ups, current, depth, breadth, completed, "+".join(sorted(planners, reverse=True))
            )
            completed += len(follow_ups)

    async def _follow_ups(self, parent: Part, count: int) -> tuple[list[SubQuestion], str]:
        config = self.config
        if config is not None and self.failures < _PLANNER_FAILURES:
            question = self.task.request.task
            try:
                return await model_follow_ups(config, question, parent.title, parent.sources, self.asked, count), "llm"
            except WriterFailure as error:  # the model's; an error of our own code is no model failure
                self.failures += 1
                reason = failure_reason(error, config)
                log.warning("LLM planner failed on follow-ups, extractive planner takes over: %s", reason)
                message = (
                    f"⚠️ The model could not plan follow-up questions to “{parent.title}” ({reason}); "
                    "planning them from its sources"
                )
                about = {"reason": reason, "model": config.model, "parent": parent.title}
                await self.emit(ProgressEvent(ProgressStep.planner_fallback, message, about))
        form = self.labels.follow_up.replace("{parent}", parent.phrase or parent.title)
        focus, asked = parent.focus or parent.title, tuple(self.phrases)
        # what the sources that say the parent's term say besides: a follow-up digs into its parent
        saying = [s for s in parent.sources if not parent.phrase or says(s.body, parent.phrase)]
        found = await asyncio.to_thread(sub_questions, focus, saying, count, (form,), asked) if saying else []
        if not found and len(saying) < len(parent.sources):  # else what its search found, not asked as the parent's
            plain = (self.labels.sub_questions[1],)
            found = await asyncio.to_thread(sub_questions, focus, parent.sources, count, plain, asked)
        return found, "extractive"

    async def _searched(
        self,
        follow_ups: list[tuple[Part, SubQuestion]],
        current: int,
        depth: int,
        breadth: int,
        completed: int,
        planner: str,
    ) -> list[Part]:
        """A level's follow-ups, announced, searched at once, and each made its parent's subsection."""
        about = {
            "depth": current,
            "total_depth": depth,
            "breadth": breadth,
            "completed_queries": completed,
            "total_queries": completed + len(follow_ups),
            "sub_questions": [q.query for _, q in follow_ups],
            "planner": planner,
        }
        listed = "; ".join(q.heading for _, q in follow_ups)
        await self.emit(ProgressEvent(ProgressStep.planning, f"🔭 Level {current} of {depth}: {listed}", about))
        found_sources = await asyncio.gather(
            *(gather_sources(q.query, self.task.plan, self.tools, _quiet) for _, q in follow_ups)
        )
        level = []
        for (parent, question), (sources, _) in zip(follow_ups, found_sources, strict=True):
            child = Part(question.heading, sources, focus=question.query, phrase=question.phrase)
            parent.children.append(child)
            level.append(child)
        return level


async def _plan(
    question: str,
    sources: list[FusedResult],
    config: LlmConfig | None,
    emit: Emit,
    labels: Labels,
    count: int = 3,
) -> tuple[list[SubQuestion], str]:
    """The model's sub-questions when one is configured and answers usably, else the extractive planner's."""
    if config is not None:
        await emit(
            ProgressEvent(ProgressStep.planning, f"🗂️ {config.model} is planning sub-questions", {"model": config.model})
        )
        try:
            return await model_sub_questions(config, question, sources, count), "llm"
        except WriterFailure as error:  # the model's; an error of our own code is no model failure
            reason = failure_reason(error, config)
            log.warning("LLM planner failed, extractive planner takes over: %s", reason)
            message = f"⚠️ The model could not plan sub-questions ({reason}); planning them from the sources"
            await emit(ProgressEvent(ProgressStep.planner_fallback, message, {"reason": reason, "model": config.model}))
    return await asyncio.to_thread(sub_questions, question, sources, count, labels.sub_questions), "extractive"


def asked_of(request: ResearchRequest) -> Asked:
    """What the request asks of its report's form besides the question."""
    return Asked(
        custom_prompt=request.custom_prompt,
        parent_query=request.parent_query,
        existing_headers=tuple(request.existing_headers) + tuple(request.draft_section_titles),
    )


async def _quiet(_: ProgressEvent) -> None:
    return None


async def run_research(
    task: ResearchTask, tools: ResearchTools, emit: Emit, send: SendReport | None = None
) -> ResearchOutcome:
    """The task, start to report; with `send`, the report goes out paragraph by paragraph as written.
    The saved report is the outcome's `record` (its JSON, made in the writer's thread trip), which
    the job store keeps and a host writes to its reports directory only when one asks for the
    report there."""
    request, plan, deps = task.request, task.plan, tools.deps
    settings: Settings = deps.settings
    started = time.perf_counter()
    await _announce(request, plan, emit)
    sources, outcomes = await gather_sources(request.task, plan, tools, emit)
    retrieval_ms = round((time.perf_counter() - started) * 1000, 1)
    config, refused = llm_config(settings, request.header("llm_model"), tools.llm)
    if refused:
        await emit(ProgressEvent(ProgressStep.warning, f"⚠️ {refused}"))
    decomposes = form_of(request.report_type).decomposes
    parts = await _parts(task, sources, tools, emit, config) if decomposes else []
    everything = sources + [s for part in parts for s in part.every_source]
    pages = await _read(everything, plan, tools, emit, started)
    writing = writing_for(request, deps, pages, plan.options.user_id)
    # a model still writing then hands over to the extractive writer, which needs a moment of its own
    writing.deadline = (
        time.monotonic()
        + settings.task_timeout_s
        - (time.perf_counter() - started)
        - max(_EXTRACTIVE_S, settings.task_timeout_s * (1 - _WRITING_SHARE))
    )
    await emit(
        ProgressEvent(
            ProgressStep.writing_report, f"✍️ Writing the {request.report_type.value} from {len(sources)} sources"
        )
    )

    def save(composed: Composed) -> SavedReport:
        record = {"owner": task.owner} | _record(task.report_id, request, composed, outcomes, retrieval_ms)
        return SavedReport(report_files(task.report_id), record_bytes(composed.markdown, record))

    if request.report_type is ReportType.custom_report:
        unmet = read_custom_prompt(request.custom_prompt).unmet
        if unmet:
            could_not = labels_for(request.task, request.language).could_not_follow.format(items="; ".join(unmet))
            await emit(ProgressEvent(ProgressStep.warning, f"⚠️ {could_not}", {"custom_prompt_unmet": unmet}))
    brief = Brief(request.task, request.report_type, sources, outcomes, writing, parts, asked=asked_of(request))
    composed = await compose(brief, config, emit, send, save)
    saved = composed.saved or SavedReport({}, b"")
    return ResearchOutcome(
        task.report_id,
        composed.markdown,
        saved.files,
        sources,
        composed.references,
        outcomes,
        retrieval_ms,
        writing,
        streamed=send is not None,
        record=saved.record,
    )


async def _announce(request: ResearchRequest, plan: Plan, emit: Emit) -> None:
    names = ", ".join(plan.names) or "the given pages"
    about = {"retrievers": plan.names, "user_id": plan.options.user_id}
    await emit(ProgressEvent(ProgressStep.starting_research, f"🔍 Researching “{request.task}” with {names}", about))
    for note in ([request.report_type_note] if request.report_type_note else []) + list(plan.notes):
        await emit(ProgressEvent(ProgressStep.warning, f"⚠️ {note}"))


async def _read(
    sources: list[FusedResult], plan: Plan, tools: ResearchTools, emit: Emit, started: float
) -> dict[str, list[Section]]:
    """The pages behind the sources, in what the task has left for reading."""
    settings = tools.deps.settings
    if not settings.fetch_pages or tools.pages is None:
        return {}
    left = settings.task_timeout_s * _READING_SHARE - (time.perf_counter() - started)
    budget = min(settings.fetch_timeout_s + 1, left)
    return await read_pages(tools.pages, sources, settings.fetch_max_pages + len(plan.urls), budget, emit)


def _record(
    report_id: str,
    request: ResearchRequest,
    composed: Composed,
    outcomes: list[RetrieverOutcome],
    retrieval_ms: float,
) -> dict[str, Any]:
    """The saved JSON: the report and everything needed to check it (sources, per-retriever outcomes,
    which writer wrote it, and per sentence its citations and support score)."""
    return {
        "id": report_id,
        "question": request.task,
        "report_type": request.report_type.value,
        "created_at": datetime.now(UTC).isoformat(),
        "retrieval_ms": retrieval_ms,
        "retrievers": [outcome.model_dump() for outcome in outcomes],
        "sources": [
            {
                "number": reference.number,
                "title": reference.title,
                "href": reference.link,
                "retrievers": reference.retrievers,
                "fused_score": round(reference.source.score, 6),
                "metadata": reference.source.metadata,
            }
            for reference in composed.references
        ],
        "writer": {"kind": composed.writer, "model": composed.model, "fallback": composed.fallback},
        "verification": {**composed.verification.counts(), "sentences": composed.sentences},
        "report": composed.markdown,
    }
