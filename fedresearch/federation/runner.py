"""Run the chosen adapters concurrently, each under its own deadline; none can sink the others.

The runner owns every adapter's I/O: it sends what `build_request` asked for (over the shared
aiohttp session, or to the embedded library in a thread), hands the answer to `parse_response`,
sends the follow-up requests an answer calls for, and wraps it all in one deadline, the breaker,
the cache and retries (resilience.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp

from fedresearch.core.events import Emit, ProgressEvent, ProgressStep
from fedresearch.core.metrics import Metrics
from fedresearch.core.models import RetrieverOutcome, RetrieverStatus, SearchResult
from fedresearch.core.secrets import is_credential_name, without_secrets
from fedresearch.core.settings import Settings
from fedresearch.core.text import cut_text
from fedresearch.core.work import WorkPool
from fedresearch.federation import http, ratelimit
from fedresearch.federation.breaker import failure_reason
from fedresearch.federation.contract import (
    Adapter,
    Answer,
    Hits,
    HttpAnswer,
    HttpRequest,
    LibraryAnswer,
    Request,
    RetrieverFailed,
    RetrieverSkipped,
    SearchOptions,
)
from fedresearch.federation.resilience import Guard, Guarded
from fedresearch.library.facade import Library
from fedresearch.library.store import LibraryUnavailable

log = logging.getLogger(__name__)

# an answer may call for more requests (pages, second steps); this bounds a misbehaving loop
_MAX_REQUESTS = 10
MAX_WARNINGS = 10  # per upstream and task; the rest are counted in one more
RESULT_MAX_CHARS = 20_000  # a result's text; longer ones (a page dumped whole) are cut at a word

Deadline = tuple[float, str]  # seconds, and the setting that says so (for the message when it passes)


@dataclass(frozen=True)
class Deps:
    """Everything the runner may use, passed in explicitly."""

    session: aiohttp.ClientSession
    settings: Settings
    # one per app, like the guard: every task's requests to an upstream share its rate limit
    limiter: ratelimit.RateLimiter = field(default_factory=ratelimit.LocalRateLimiter)
    library: Library | None = None
    guard: Guard | None = None
    metrics: Metrics | None = None
    work: WorkPool | None = None  # threads that write reports and save files (None: asyncio's)


class DeadlineExceeded(RetrieverFailed):
    def __init__(self, deadline: Deadline, waiting_for: str | None = None) -> None:
        message = f"no answer within {deadline[0]:g} s ({deadline[1]})"
        if waiting_for is not None:
            message += f" while waiting for {waiting_for}"
        super().__init__(message, transient=True)


@dataclass
class _Pacing:
    """What one search is waiting for, if it is queued behind its upstream's rate limit."""

    waiting_for: str | None = None


@contextlib.asynccontextmanager
async def _paced(adapter: Adapter, deps: Deps, pacing: _Pacing) -> AsyncIterator[None]:
    rate = adapter.about.rate
    if rate is None:
        yield
        return
    # left set if the deadline cancels the wait, so that the failure can say why it came
    pacing.waiting_for = f"the rate limit of {adapter.label} ({rate})"
    async with deps.limiter.slot(adapter.name, rate):
        pacing.waiting_for = None
        yield


@dataclass
class Federated:
    outcomes: list[RetrieverOutcome] = field(default_factory=list)
    results: list[SearchResult] = field(default_factory=list)


async def send(adapter: Adapter, request: Request, deps: Deps, pacing: _Pacing | None = None) -> Answer:
    if isinstance(request, HttpRequest):
        limit = deps.settings.upstream_max_bytes
        async with _paced(adapter, deps, pacing or _Pacing()):
            answer = await http.send(
                deps.session, request, label=adapter.label, limit=limit, results=adapter.about.results
            )
        paused = deps.limiter.observe(adapter.name, answer.status, answer.headers) if adapter.about.rate else None
        if answer.status >= 400:
            raise _http_failure(adapter, answer, paused)
        return answer
    if deps.library is None:
        raise RetrieverFailed("the embedded library is not open on this server")
    try:
        passages = await deps.library.threads.run(
            deps.library.search,
            request.user_id,
            request.query,
            request.kind,
            request.top_k,
            documents=request.documents,
        )
    except LibraryUnavailable as error:
        raise RetrieverFailed(str(error)) from None
    return LibraryAnswer(request, passages)


def _http_failure(adapter: Adapter, answer: HttpAnswer, paused: float | None) -> RetrieverFailed:
    # a 429 without Retry-After still says when to try again: when the limiter's backoff ends
    retry_after = http.retry_after_seconds(answer.headers.get("Retry-After")) or paused
    message = without_secrets(adapter.describe_error(answer), _credentials(answer.request))
    return RetrieverFailed(message, status=answer.status, retry_after=retry_after)


def _credentials(request: HttpRequest) -> list[str]:
    """The values of headers, query parameters and JSON fields named like credentials (and a Bearer
    token alone): what an upstream's error text may echo."""
    json_fields = request.json.items() if isinstance(request.json, dict) else ()
    named = [*request.headers.items(), *(request.params or {}).items(), *json_fields]
    values = [str(value) for name, value in named if is_credential_name(name)]
    return values + [value.split(" ", 1)[-1] for value in values]


async def exchange(
    adapter: Adapter, first: Request, options: SearchOptions, deps: Deps, pacing: _Pacing | None = None
) -> Hits:
    """Send `first` and every follow-up its answers call for; results ranked 1..n, at most max_results."""
    hits, pending, sent = Hits(), [first], 0
    while pending and sent < _MAX_REQUESTS and len(hits.results) < options.max_results:
        batch, pending = pending[: _MAX_REQUESTS - sent], []
        sent += len(batch)
        answers = await asyncio.gather(*(send(adapter, request, deps, pacing) for request in batch))
        for answer in answers:
            # a large answer's parse takes seconds (100k items, a 5 MB text): never on the loop
            if isinstance(answer, HttpAnswer) and answer.large:
                page = await asyncio.to_thread(adapter.parse_response, answer, options)
            else:
                page = adapter.parse_response(answer, options)
            hits.results.extend(page.results[: options.max_results])
            hits.warnings.extend(page.warnings)
            pending.extend(page.follow)
    return _bounded(hits, options.max_results, adapter)


def _bounded(hits: Hits, max_results: int, adapter: Adapter) -> Hits:
    """At most `max_results` results of at most RESULT_MAX_CHARS each, ranked 1..n, and at most
    MAX_WARNINGS warnings plus one that counts the rest: an upstream answering 100k malformed items
    made 100k warning frames and a 10 MB report."""
    warnings = hits.warnings[:MAX_WARNINGS]
    if len(hits.warnings) > MAX_WARNINGS:
        warnings.append(f"… and {len(hits.warnings) - MAX_WARNINGS:,} more like these")
    results = hits.results[:max_results]
    for rank, result in enumerate(results, start=1):
        result.rank, result.kind = rank, adapter.about.kind
        if len(result.body) > RESULT_MAX_CHARS:
            warnings.append(
                f"cut a result of {len(result.body):,} characters to RESULT_MAX_CHARS ({RESULT_MAX_CHARS:,}): "
                f"{result.href}"
            )
            result.body = cut_text(result.body, RESULT_MAX_CHARS)
    return Hits(results=results, warnings=warnings)


def deadline_of(request: Request, settings: Settings, cap: Deadline | None) -> Deadline:
    """The adapter's own deadline setting if it has one, else RETRIEVER_TIMEOUT_S; never past `cap`."""
    own = getattr(request, "deadline", None) or (settings.retriever_timeout_s, "RETRIEVER_TIMEOUT_S")
    return cap if cap is not None and cap[0] < own[0] else own


async def search_one(
    adapter: Adapter,
    options: SearchOptions,
    deps: Deps,
    cap: Deadline | None = None,
    others_done: asyncio.Event | None = None,
) -> Guarded:
    """One adapter's hits for `options`, under its deadline, the breaker, the cache and retries.

    Raises RetrieverSkipped when it cannot run, RetrieverFailed (DeadlineExceeded past the deadline).
    """
    options = options.for_adapter(adapter.about)
    first = adapter.build_request(options)
    deadline = deadline_of(first, deps.settings, cap)
    pacing = _Pacing()
    on_suspended = functools.partial(_count_suspension, deps.metrics, adapter.name)
    try:
        async with asyncio.timeout(deadline[0]):
            if deps.guard is None:
                return Guarded(await exchange(adapter, first, options, deps, pacing), cached=False, attempts=1)
            return await deps.guard.call(
                adapter.name,
                cacheable=adapter.about.kind != "library",  # remote upstreams spend quota or rate limits
                credentials=adapter.about.credentials,
                options=options,
                deadline_s=deadline[0],
                search=lambda: exchange(adapter, first, options, deps, pacing),
                on_suspended=on_suspended,
                others_done=others_done,
            )
    except TimeoutError:
        failure = DeadlineExceeded(deadline, pacing.waiting_for)
        # An upstream that never answers is as down as one that errs: without this, one that hangs
        # held every task for its whole deadline and was never suspended. Not when the time ran out
        # in our own rate limiter's queue, or the task's remaining time cut the deadline short.
        remote = isinstance(first, HttpRequest)
        if deps.guard is not None and remote and deadline is not cap and pacing.waiting_for is None:
            await deps.guard.overran(adapter.name, adapter.about.credentials, options, failure, on_suspended)
        raise failure from None


def _count_suspension(metrics: Metrics | None, name: str, reason: str) -> None:
    if metrics is not None:
        metrics.suspensions.labels(name, reason).inc()


class _Elapsed:
    def __init__(self) -> None:
        self.started = time.perf_counter()

    def __call__(self) -> float:
        return round((time.perf_counter() - self.started) * 1000, 1)


async def _run_one(
    adapter: Adapter,
    options: SearchOptions,
    deps: Deps,
    cap: Deadline | None,
    emit: Emit,
    others_done: asyncio.Event | None = None,
) -> tuple[RetrieverOutcome, list[SearchResult]]:
    name = adapter.name
    await emit(ProgressEvent(ProgressStep.retriever_started, f"🔎 {name}: searching", {"retriever": name}))
    elapsed = _Elapsed()
    try:
        guarded = await search_one(adapter, options, deps, cap, others_done)
    except RetrieverSkipped as reason:
        outcome = RetrieverOutcome(name=name, status=RetrieverStatus.skipped, error=str(reason))
        await emit(ProgressEvent(ProgressStep.retriever_skipped, f"⏭️ {name} skipped: {reason}", outcome.model_dump()))
        return outcome, []
    except RetrieverFailed as failure:
        return await _failed(name, str(failure), failure, elapsed(), deps.metrics, emit), []
    except Exception as failure:  # an adapter bug must not sink the task either
        log.exception("retriever %s crashed", name)
        message = f"internal error in the {name} adapter ({type(failure).__name__})"
        return await _failed(name, message, None, elapsed(), deps.metrics, emit), []
    return await _done(name, guarded, elapsed(), deps.metrics, emit), guarded.hits.results


async def _done(
    name: str, guarded: Guarded, elapsed_ms: float, metrics: Metrics | None, emit: Emit
) -> RetrieverOutcome:
    hits = guarded.hits
    outcome = RetrieverOutcome(
        name=name,
        status=RetrieverStatus.done,
        count=len(hits.results),
        elapsed_ms=elapsed_ms,
        warnings=hits.warnings,
        cached=guarded.cached,
        attempts=guarded.attempts,
    )
    if metrics is not None:
        metrics.requests.labels(name).inc()
        metrics.latency.labels(name).observe(elapsed_ms / 1000)
        if guarded.cached:
            metrics.cache_hits.labels(name).inc()
    for warning in hits.warnings:
        await emit(ProgressEvent(ProgressStep.warning, f"⚠️ {name}: {warning}", {"retriever": name}))
    how = " (cached)" if guarded.cached else f" after {guarded.attempts} tries" if guarded.attempts > 1 else ""
    text = f"✅ {name}: {outcome.count} results in {elapsed_ms:.0f} ms{how}"
    await emit(ProgressEvent(ProgressStep.retriever_done, text, outcome.model_dump(exclude={"warnings"})))
    return outcome


async def _failed(
    name: str, error: str, failure: RetrieverFailed | None, elapsed_ms: float, metrics: Metrics | None, emit: Emit
) -> RetrieverOutcome:
    outcome = RetrieverOutcome(name=name, status=RetrieverStatus.failed, elapsed_ms=elapsed_ms, error=error)
    if metrics is not None:
        metrics.requests.labels(name).inc()
        metrics.failures.labels(name, failure_reason(failure, isinstance(failure, DeadlineExceeded))).inc()
    await emit(ProgressEvent(ProgressStep.retriever_failed, f"❌ {name} failed: {error}", outcome.model_dump()))
    return outcome


async def federate(
    names: list[str],
    registry: dict[str, Adapter],
    options: SearchOptions,
    deps: Deps,
    emit: Emit,
    cap: Deadline | None = None,
) -> Federated:
    """Outcomes and results in the order the retrievers were named."""
    # each retriever learns when all the others have answered: its retries must not make the task wait
    others_done = {name: asyncio.Event() for name in names} if len(names) > 1 else {}
    finished: set[str] = set()

    async def run(name: str) -> tuple[RetrieverOutcome, list[SearchResult]]:
        try:
            return await _run_one(registry[name], options, deps, cap, emit, others_done.get(name))
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
