"""Run the chosen adapters concurrently, each under its own deadline; none can sink the others."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from core.events import Emit, ProgressEvent
from core.models import RetrieverOutcome, RetrieverStatus, SearchResult
from retrievers.base import Deps, Retriever, RetrieverFailed, RetrieverSkipped, SearchOptions
from retrievers.resilience import Guarded, failure_reason

log = logging.getLogger(__name__)


@dataclass
class Federated:
    outcomes: list[RetrieverOutcome] = field(default_factory=list)
    results: list[SearchResult] = field(default_factory=list)


async def _search(
    retriever: Retriever, options: SearchOptions, deps: Deps, deadline_s: float, others_done: asyncio.Event | None
) -> Guarded:
    if deps.guard is None:
        return Guarded(await retriever.search(options, deps), cached=False, attempts=1)

    def suspended(reason: str) -> None:
        if deps.metrics is not None:
            deps.metrics.suspensions.labels(retriever.name, reason).inc()

    return await deps.guard.call(
        retriever.name,
        cacheable=retriever.about.kind in ("web", "knowledge"),  # quota-spending upstreams only
        credentials=retriever.about.credentials,
        options=options,
        deadline_s=deadline_s,
        search=lambda: retriever.search(options, deps),
        on_suspended=suspended,
        others_done=others_done,
    )


async def _run_one(
    retriever: Retriever,
    options: SearchOptions,
    deps: Deps,
    deadline_s: float,
    emit: Emit,
    others_done: asyncio.Event | None = None,
) -> tuple[RetrieverOutcome, list[SearchResult]]:
    name = retriever.name
    metrics = deps.metrics
    await emit(ProgressEvent("retriever_started", f"🔎 {name}: searching", {"retriever": name}))
    started = time.perf_counter()

    def elapsed() -> float:
        return round((time.perf_counter() - started) * 1000, 1)

    last_failure: RetrieverFailed | None = None
    timed_out = False
    try:
        async with asyncio.timeout(deadline_s):
            guarded = await _search(retriever, options, deps, deadline_s, others_done)
    except RetrieverSkipped as reason:
        outcome = RetrieverOutcome(name=name, status=RetrieverStatus.skipped, error=str(reason))
        await emit(ProgressEvent("retriever_skipped", f"⏭️ {name} skipped: {reason}", outcome.model_dump()))
        return outcome, []
    except TimeoutError:
        timed_out = True
        error = f"no answer within {deadline_s:g} s (RETRIEVER_TIMEOUT_S)"
    except RetrieverFailed as failure:
        last_failure = failure
        error = str(failure)
    except Exception as failure:  # an adapter bug must not sink the task either
        log.exception("retriever %s crashed", name)
        error = f"internal error in the {name} adapter ({type(failure).__name__})"
    else:
        hits = guarded.hits
        results = hits.results[: options.max_results]
        outcome = RetrieverOutcome(
            name=name,
            status=RetrieverStatus.done,
            count=len(results),
            elapsed_ms=elapsed(),
            warnings=hits.warnings,
            cached=guarded.cached,
            attempts=guarded.attempts,
        )
        if metrics is not None:
            metrics.requests.labels(name).inc()
            metrics.latency.labels(name).observe(outcome.elapsed_ms / 1000)
            if guarded.cached:
                metrics.cache_hits.labels(name).inc()
        for warning in hits.warnings:
            await emit(ProgressEvent("warning", f"⚠️ {name}: {warning}", {"retriever": name}))
        how = " (cached)" if guarded.cached else f" after {guarded.attempts} tries" if guarded.attempts > 1 else ""
        await emit(
            ProgressEvent(
                "retriever_done",
                f"✅ {name}: {len(results)} results in {outcome.elapsed_ms:.0f} ms{how}",
                outcome.model_dump(exclude={"warnings"}),
            )
        )
        return outcome, results
    outcome = RetrieverOutcome(name=name, status=RetrieverStatus.failed, elapsed_ms=elapsed(), error=error)
    if metrics is not None:
        metrics.requests.labels(name).inc()
        metrics.failures.labels(name, failure_reason(last_failure, timed_out)).inc()
    await emit(ProgressEvent("retriever_failed", f"❌ {name} failed: {error}", outcome.model_dump()))
    return outcome, []


async def federate(
    names: list[str],
    registry: dict[str, Retriever],
    options: SearchOptions,
    deps: Deps,
    emit: Emit,
    deadline_s: float,
) -> Federated:
    """Outcomes and results in the order the retrievers were named."""
    # each retriever learns when all the others have answered: its retries must not make the task wait
    others_done = {name: asyncio.Event() for name in names} if len(names) > 1 else {}
    finished: set[str] = set()

    async def run(name: str) -> tuple[RetrieverOutcome, list[SearchResult]]:
        try:
            return await _run_one(registry[name], options, deps, deadline_s, emit, others_done.get(name))
        finally:
            finished.add(name)
            for other, event in others_done.items():
                if other not in finished and finished >= set(names) - {other}:
                    event.set()

    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(run(name)) for name in names]
    federated = Federated()
    for task in tasks:
        outcome, results = task.result()
        federated.outcomes.append(outcome)
        federated.results.extend(results)
    return federated
