"""What one server process runs its work with, opened at its start and closed at its end: the
library, the HTTP session, the retrievers, the state every task shares (in this process, or in
Redis with FEDRESEARCH_REDIS_URL so that every worker and host sees the same breakers, answer cache,
rate limits, per-key task counts and jobs), the job store, the page reader and the model's clients.

The web floor holds one `Runtime` per app and maps requests onto it; nothing here knows HTTP.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver

from fedresearch.core.lineage import UPLOAD_FOLDERS, remove_abandoned
from fedresearch.core.metrics import Metrics
from fedresearch.core.redis import Leases, SharedDown, SharedRedis, connect
from fedresearch.core.settings import Settings, secret
from fedresearch.core.work import WorkPool, work_threads
from fedresearch.federation.answer_cache import RedisAnswerCache
from fedresearch.federation.breaker import RedisBreaker
from fedresearch.federation.contract import Adapter
from fedresearch.federation.ratelimit import LocalRateLimiter, RateLimiter, RedisRateLimiter
from fedresearch.federation.registry import Upstream, build_registry
from fedresearch.federation.resilience import Guard
from fedresearch.federation.runner import Deps
from fedresearch.jobs import webhooks
from fedresearch.jobs.local_store import LocalJobStore
from fedresearch.jobs.redis_store import RedisJobStore
from fedresearch.jobs.reports import ExportGate, SavedReports
from fedresearch.jobs.retention import RetentionPace, enforce_retention
from fedresearch.jobs.slots import LocalTaskSlots, RedisTaskSlots, TaskSlots
from fedresearch.jobs.stopping import Stopping
from fedresearch.jobs.store import Job, JobStore
from fedresearch.knowledge.bases import KnowledgeBase, load_knowledge_bases
from fedresearch.library import crosslingual
from fedresearch.library.facade import Library
from fedresearch.library.open import open_library
from fedresearch.report.chat import ChatSession
from fedresearch.report.llm import LlmClients, llm_config
from fedresearch.report.pages import PageReader
from fedresearch.report.render import ExportLimits
from fedresearch.report.task import ResearchTools

log = logging.getLogger("fedresearch")


@dataclass
class LiveJob:
    """A job running in this process: its task (to cancel it), whether it outlives its socket, and
    once written, the chat session about its report."""

    task: asyncio.Task[None]
    detached: bool
    chat: ChatSession | None = None


@dataclass
class Runtime:
    """One server process's services, shared by every request it serves."""

    settings: Settings
    metrics: Metrics
    tools: ResearchTools  # the retrievers, the runner's deps, the page reader, the model's clients
    knowledge_bases: dict[str, KnowledgeBase]
    jobs: JobStore
    slots: TaskSlots  # MAX_TASKS_PER_KEY
    stopping: Stopping  # begun on SIGTERM: no new tasks, running ones finish
    redis: SharedRedis | None  # None: the shared state is this process's own
    running: collections.Counter[str]  # this process's tasks per API key
    background: set[asyncio.Task[object]] = field(default_factory=set)  # webhooks, retention: awaited at stop
    live: dict[str, LiveJob] = field(default_factory=dict)  # by research_id
    retention: RetentionPace = field(default_factory=lambda: RetentionPace(0))
    exports: ExportGate = field(default_factory=ExportGate)  # PDF and DOCX made at once

    @property
    def registry(self) -> dict[str, Adapter]:
        return self.tools.registry

    @property
    def deps(self) -> Deps:
        return self.tools.deps

    @property
    def library(self) -> Library | None:
        return self.tools.deps.library

    def reports(self) -> SavedReports:
        """The saved reports of this process's jobs, read through its reports directory."""
        return SavedReports(self.settings.reports_dir, self.jobs, self.settings.report_page_size, self.exports)

    def in_background(self, work: Coroutine[Any, Any, object]) -> None:
        """Run `work` beside the request that asked for it; awaited (briefly) when the process stops."""
        start_background(self.background, work)


def start_background(pending: set[asyncio.Task[object]], work: Coroutine[Any, Any, object]) -> None:
    task: asyncio.Task[object] = asyncio.create_task(work)
    pending.add(task)
    task.add_done_callback(pending.discard)


def configured(registry: dict[str, Adapter]) -> str:
    """The retrievers that can run as configured, and the others with what they lack (one line)."""
    ready = [name for name, adapter in registry.items() if adapter.missing_setup() is None]
    lacking = [f"{name} ({missing})" for name, adapter in registry.items() if (missing := adapter.missing_setup())]
    said = f"retrievers ready: {', '.join(ready) or 'none'}"
    return said + (f"; not configured: {', '.join(lacking)}" if lacking else "")


@dataclass(frozen=True)
class SharedState:
    """The state every task of the process shares, in this process or in Redis."""

    guard: Guard
    limiter: RateLimiter
    task_slots: TaskSlots
    redis: SharedRedis | None = None


@contextlib.asynccontextmanager
async def open_state(settings: Settings, running: collections.Counter[str]) -> AsyncIterator[SharedState]:
    """The shared state for the process's lifetime; `running` is its own count of tasks per key."""
    url = secret(settings.redis_url)
    if url is None:
        yield SharedState(Guard(settings), LocalRateLimiter(), LocalTaskSlots(running))
        return
    shared = SharedRedis(connect(url, settings.redis_cluster), url)
    leases = Leases(shared.client)
    # unreachable now: attempt() says so in the log, and this process uses its own state until it answers
    with contextlib.suppress(SharedDown):
        await shared.attempt("connecting", shared.client.ping)
        log.info("shared state (breakers, answer cache, rate limits, task limits) in Redis at %s", shared.where)
    guard = Guard(settings, RedisBreaker(shared, settings), RedisAnswerCache(shared, settings.upstream_cache_ttl_s))
    try:
        yield SharedState(guard, RedisRateLimiter(shared, leases), RedisTaskSlots(shared, leases, running), shared)
    finally:
        await leases.close()
        await shared.close()


@dataclass(frozen=True)
class Given:
    """What the caller of `open_runtime` provides rather than the settings: the upstreams (the
    registry tuple), the process's metrics and its stop, and for tests, a resolver for the
    pages' hosts and a job store."""

    adapters: tuple[Upstream, ...]
    metrics: Metrics
    stopping: Stopping
    resolver: AbstractResolver | None = None
    job_store: JobStore | None = None


@contextlib.asynccontextmanager
async def open_runtime(settings: Settings, given: Given) -> AsyncIterator[Runtime]:
    """The process's runtime, from its settings; everything it opened is closed when it ends."""
    registry = build_registry(settings, given.adapters)
    log.info("%s", configured(registry))
    bases = load_knowledge_bases(settings.knowledge_bases, set(registry))
    library = await asyncio.to_thread(open_library, settings)
    # CC-CEDICT both ways (about 70 MB, a second of a core), read beside the start, not in the first
    # question's search: every question, English too, is looked up in it (library/crosslingual.py)
    threading.Thread(target=crosslingual.reverse, name="cc-cedict", daemon=True).start()
    if library.encoder is not None:  # the writer's graph (report/task.py), once per host, not in a first task
        await asyncio.to_thread(library.encoder.prepare_int8)
    if abandoned := await asyncio.to_thread(remove_abandoned, UPLOAD_FOLDERS):
        log.info("removed %d upload folders left by server processes that were killed", abandoned)
    work = WorkPool(work_threads(settings.work_threads, library.encoder is not None))
    pages = PageReader(settings, resolver=given.resolver, work=work)
    llm = LlmClients()
    config, _ = llm_config(settings, None, llm)
    if config is not None:  # the SDK's import and the client's SSL context: 0.7 s, not on the loop at a first task
        await asyncio.to_thread(llm.client, config)
    running: collections.Counter[str] = collections.Counter()
    try:
        async with _session(settings) as session, open_state(settings, running) as state:
            deps = Deps(session, settings, state.limiter, library, state.guard, given.metrics, work)
            background: set[asyncio.Task[object]] = set()
            jobs, made = await _open_jobs(settings, given.job_store, state.redis, work, deps, background)
            try:
                yield Runtime(
                    settings,
                    given.metrics,
                    ResearchTools(registry, deps, pages, llm),
                    bases,
                    jobs,
                    state.task_slots,
                    given.stopping,
                    state.redis,
                    running,
                    background,
                    retention=RetentionPace(settings.report_max_per_user),
                    exports=ExportGate(
                        settings.export_processes, ExportLimits(settings.export_timeout_s, settings.export_memory_mb)
                    ),
                )
            finally:
                if made is not None:  # before the shared client closes
                    await made.close()
    finally:
        await pages.close()
        await llm.close()
        work.close()
        await asyncio.to_thread(library.close)  # on PostgreSQL, closing the pool waits for its threads


@contextlib.asynccontextmanager
async def _session(settings: Settings) -> AsyncIterator[aiohttp.ClientSession]:
    """The one HTTP session every upstream call of the process goes through."""
    connector = aiohttp.TCPConnector(limit=200, limit_per_host=50)
    timeout = aiohttp.ClientTimeout(total=settings.retriever_timeout_s, connect=min(5.0, settings.retriever_timeout_s))
    # no cookie jar: one session serves every user's upstream calls, and cookies are not our APIs' auth
    jar = aiohttp.DummyCookieJar()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False, cookie_jar=jar) as session:
        yield session


async def _open_jobs(
    settings: Settings,
    given: JobStore | None,
    redis: SharedRedis | None,
    work: WorkPool,
    deps: Deps,
    background: set[asyncio.Task[object]],
) -> tuple[JobStore, RedisJobStore | None]:
    """The jobs earlier runs saved (a store given, such as a shared one, is kept; with
    FEDRESEARCH_REDIS_URL, the store every worker shares), with the retention limits applied at once.
    Returns the store, and the shared store it made, which the runtime closes."""

    def announce_stranded(job: Job) -> None:
        """A job whose worker died, ended here, failed: announced as a failed job is (WEBHOOK_URL)."""
        if settings.webhook_url:
            start_background(background, webhooks.notify(deps.session, settings, webhooks.payload(job, None)))

    made = None
    store: JobStore
    if given is not None:
        store = given
    elif redis is not None:
        store = made = RedisJobStore(
            redis,
            reports_dir=settings.reports_dir,
            runner_lease_s=settings.worker_lease_s,
            on_stranded=announce_stranded,
            longest_job_s=settings.task_timeout_s,
        )
    else:
        local = LocalJobStore(settings.jobs_dir, work)
        await local.load()
        store = local
    days, most = settings.report_retention_days, settings.report_max_per_user
    if days > 0 or most > 0:
        await enforce_retention(store, settings.reports_dir, days, most)
    return store, made
