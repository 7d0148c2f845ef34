"""The aiohttp app: its routes, the resources it opens at start (library, HTTP session, registry),
and how it stops (running tasks finish, then sockets close); the processes that serve it are
`fedresearch.serve`'s."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import AsyncIterator, Sequence

import aiohttp
from aiohttp import web
from aiohttp.abc import AbstractResolver
from aiohttp.typedefs import Handler

from fedresearch.core.auth import ApiKeys
from fedresearch.core.lineage import UPLOAD_FOLDERS, remove_abandoned
from fedresearch.core.metrics import Metrics
from fedresearch.core.redis import SharedRedis
from fedresearch.core.settings import Settings
from fedresearch.core.work import WorkPool, work_threads
from fedresearch.federation.registry import AdapterFactory, build_registry
from fedresearch.federation.runner import Deps
from fedresearch.jobs import webhooks
from fedresearch.jobs.redis_store import RedisJobStore
from fedresearch.jobs.stopping import Stopping, stop_limits
from fedresearch.jobs.store import Job, JobStore, LocalJobStore, RetentionPace, enforce_retention
from fedresearch.knowledge.bases import knowledge_base_keys, load_knowledge_bases
from fedresearch.library.open import open_library
from fedresearch.library.store import LibraryUnavailable
from fedresearch.report.llm import LlmClients
from fedresearch.report.pages import PageReader
from fedresearch.report.task import ResearchTools
from fedresearch.retrievers import ADAPTERS
from fedresearch.web import (
    dify,
    documents,
    jobs,
    literature,
    mcp_http,
    openapi,
    page,
    reports,
    research_socket,
    status,
    tasks,
)
from fedresearch.web.auth import json_error
from fedresearch.web.keys import (
    ADAPTER_FACTORIES,
    BACKGROUND,
    DEPS,
    JOBS,
    KEYS,
    KNOWLEDGE_BASES,
    LIVE_JOBS,
    LLM_CLIENTS,
    METRICS,
    QUERYING,
    REGISTRY,
    RESOLVER,
    RETENTION_PACE,
    RUNNING,
    SETTINGS,
    SHARED_REDIS,
    SOCKETS,
    STOPPING,
    TASK_SLOTS,
    TOOLS,
    OpenSocket,
)
from fedresearch.web.state import open_state

log = logging.getLogger("fedresearch")


@web.middleware
async def _library_unavailable(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Any endpoint that reads or writes the library: its database server away is a 503 that says
    why, not a 500 with a traceback in the log."""
    try:
        return await handler(request)
    except LibraryUnavailable as error:
        raise json_error(web.HTTPServiceUnavailable, str(error), **{"Retry-After": "5"}) from None


async def _resources(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    factories = app[ADAPTER_FACTORIES]
    registry = build_registry(settings, factories)
    bases = load_knowledge_bases(settings.knowledge_bases, set(registry))
    app[KNOWLEDGE_BASES] = bases
    app[KEYS] = app[KEYS].with_keys(knowledge_base_keys(bases))
    library = await asyncio.to_thread(open_library, settings)
    if library.encoder is not None:  # the writer's graph (report/task.py), once per host, not in a first task
        await asyncio.to_thread(library.encoder.prepare_int8)
    if abandoned := await asyncio.to_thread(remove_abandoned, UPLOAD_FOLDERS):
        log.info("removed %d upload folders left by server processes that were killed", abandoned)
    connector = aiohttp.TCPConnector(limit=200, limit_per_host=50)
    timeout = aiohttp.ClientTimeout(total=settings.retriever_timeout_s, connect=min(5.0, settings.retriever_timeout_s))
    work = WorkPool(work_threads(settings.work_threads, library.encoder is not None))
    pages = PageReader(settings, resolver=app.get(RESOLVER), work=work)
    app[LLM_CLIENTS] = llm = LlmClients()
    # no cookie jar: one session serves every user's upstream calls, and cookies are not our APIs' auth
    jar = aiohttp.DummyCookieJar()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False, cookie_jar=jar) as session:
        app[REGISTRY] = registry
        try:
            async with open_state(settings, app[RUNNING]) as state:
                app[TASK_SLOTS] = state.task_slots
                app[SHARED_REDIS] = state.redis
                app[DEPS] = Deps(
                    session=session,
                    settings=settings,
                    limiter=state.limiter,
                    library=library,
                    guard=state.guard,
                    metrics=app[METRICS],
                    work=work,
                )
                app[TOOLS] = ResearchTools(registry, app[DEPS], pages, llm)
                made = await _open_jobs(app, state.redis, work)  # its retention pass may announce jobs
                app[mcp_http.MCP_ENDPOINT] = endpoint = mcp_http.McpEndpoint(app)
                try:
                    yield
                finally:
                    try:
                        await endpoint.close()
                    finally:
                        if made is not None:  # before the shared client closes
                            await made.close()
        finally:
            await pages.close()
            await llm.close()
            work.close()
            await asyncio.to_thread(library.close)  # on PostgreSQL, closing the pool waits for its threads


async def _open_jobs(app: web.Application, redis: SharedRedis | None, work: WorkPool) -> RedisJobStore | None:
    """The jobs earlier runs saved (a store given to `create_app`, such as a shared one, is kept; with
    FEDRESEARCH_REDIS_URL, the store every worker shares), with the retention limits applied at once.
    Returns the shared store it made, which the app closes."""
    settings = app[SETTINGS]
    made = None
    if JOBS not in app and redis is not None:
        made = RedisJobStore(
            redis,
            reports_dir=settings.reports_dir,
            runner_lease_s=settings.worker_lease_s,
            on_stranded=lambda job: _announce_stranded(app, job),
            longest_job_s=settings.task_timeout_s,
        )
        app[JOBS] = made
    elif JOBS not in app:
        store = LocalJobStore(settings.jobs_dir, work)
        await store.load()
        app[JOBS] = store
    days, most = settings.report_retention_days, settings.report_max_per_user
    if days > 0 or most > 0:
        await enforce_retention(app[JOBS], settings.reports_dir, days, most)
    return made


def _announce_stranded(app: web.Application, job: Job) -> None:
    """A job whose worker died, ended here, failed: announced as a failed job is (WEBHOOK_URL)."""
    settings = app[SETTINGS]
    if settings.webhook_url:
        tasks.background(app, webhooks.notify(app[DEPS].session, settings, webhooks.payload(job, None)))


async def let_tasks_finish(app: web.Application) -> None:
    """SIGTERM (a deploy, a restart): take no new tasks, and let those running here (a socket's, a
    REST or MCP caller's) go on to their reports, each socket getting every frame of the job it
    follows, for SHUTDOWN_GRACE_S at most (a worker retired by a reload: until any task could end;
    `serve/signals.py`); a socket following nothing closes at once (1001), so its client reconnects
    to a server that stays, and one whose job has ended closes then. Whatever still runs after the
    grace, `_close_sockets` and `stop_jobs` stop."""
    stopping = app[STOPPING]
    if stopping.waiting:
        return  # waited for already, before aiohttp's shutdown (`serve_until_stopped`)
    grace = stopping.start_clock()
    setting = "TASK_TIMEOUT_S" if stopping.retiring else "SHUTDOWN_GRACE_S"
    running = [live.task for live in app[LIVE_JOBS].values()]
    if running:
        log.info("stopping: no new tasks; %d running may finish, for %g s at most (%s)", len(running), grace, setting)
    started = time.monotonic()
    open_sockets = app[SOCKETS]
    draining = [socket.drain(grace) for socket in list(open_sockets)]
    waiting = [asyncio.wait(running)] if running else []
    await stopping.wait(asyncio.gather(*waiting, *draining, return_exceptions=True))
    cut = sum(not task.done() for task in running)
    if cut:
        waited = time.monotonic() - started
        log.warning("stopping: %d of %d tasks still running after %.0f s: stopped", cut, len(running), waited)
    elif running:
        log.info("stopping: the %d running tasks finished, in %.1f s", len(running), time.monotonic() - started)


async def _close_sockets(app: web.Application) -> None:
    open_sockets = app[SOCKETS]
    sockets = list(open_sockets)
    await asyncio.gather(*(socket.shut_down() for socket in sockets), return_exceptions=True)


def create_app(
    settings: Settings | None = None,
    adapters: Sequence[AdapterFactory] = ADAPTERS,
    resolver: AbstractResolver | None = None,
    job_store: JobStore | None = None,
) -> web.Application:
    """The app; `adapters` is the registry tuple (a test may pass one with an adapter of its own),
    `resolver` resolves the hosts of pages to read (tests inject one; the SSRF check wraps it),
    `job_store` keeps the jobs (default: this process, saved under the data dir)."""
    settings = settings or Settings()
    app = web.Application(client_max_size=1 << 20, middlewares=[_library_unavailable])
    if job_store is not None:
        app[JOBS] = job_store
    if resolver is not None:
        app[RESOLVER] = resolver
    app[SETTINGS] = settings
    app[ADAPTER_FACTORIES] = tuple(adapters)
    app[KEYS] = ApiKeys.from_settings(settings)
    app[METRICS] = Metrics()
    sockets: set[OpenSocket] = set()
    app[SOCKETS] = sockets
    app[RUNNING] = collections.Counter()
    app[QUERYING] = collections.Counter()
    app[LIVE_JOBS] = {}
    app[RETENTION_PACE] = RetentionPace(settings.report_max_per_user)
    app[BACKGROUND] = set()
    app[STOPPING] = Stopping(*stop_limits(settings))
    app.cleanup_ctx.append(_resources)
    app.cleanup_ctx.append(tasks.retention_sweeps)  # after _resources: it reads the job store
    app.cleanup_ctx.append(reports.leftover_sweeps)
    app.on_shutdown.append(let_tasks_finish)
    app.on_shutdown.append(_close_sockets)
    app.on_shutdown.append(tasks.stop_jobs)
    _add_routes(app)
    return app


def _add_routes(app: web.Application) -> None:
    page.register(app)
    app.router.add_get("/healthz", status.healthz)
    app.router.add_get("/metrics", status.metrics)
    app.router.add_get("/api/retrievers", status.retrievers)
    app.router.add_get("/ws", research_socket.websocket)
    app.router.add_post("/internal/biblios/vector_search/", literature.literature_api)
    app.router.add_get("/reports/{name}", reports.report_file)
    # Dify appends /retrieval to the endpoint a user typed, so a trailing slash there gives //retrieval
    app.router.add_post("/retrieval", dify.retrieval)
    app.router.add_post("//retrieval", dify.retrieval)
    documents.register(app)
    jobs.register(app)
    for method in ("GET", "POST", "DELETE"):
        app.router.add_route(method, "/mcp", mcp_http.mcp_http)
    app.router.add_get("/openapi.json", openapi.openapi_json)
