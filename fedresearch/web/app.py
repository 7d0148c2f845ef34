"""The aiohttp app: its routes, the resources it opens at start (library, HTTP session, registry),
and how it stops (running tasks finish, then sockets close); the processes that serve it are
`fedresearch.serve`'s."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import AsyncIterator, Sequence

import aiohttp_cors
from aiohttp import web
from aiohttp.abc import AbstractResolver
from aiohttp.typedefs import Handler

from fedresearch.core.auth import ApiKeys
from fedresearch.core.metrics import Metrics
from fedresearch.core.settings import Settings
from fedresearch.federation.registry import Upstream
from fedresearch.jobs.runs import retention_sweeps, stop_jobs
from fedresearch.jobs.runtime import Given, open_runtime
from fedresearch.jobs.stopping import Stopping, stop_limits
from fedresearch.jobs.store import JobStore
from fedresearch.knowledge.bases import knowledge_base_keys
from fedresearch.library.store import LibraryUnavailable
from fedresearch.retrievers import ADAPTERS
from fedresearch.web import (
    dify,
    documents,
    gptr_files,
    jobs,
    literature,
    mcp_http,
    openapi,
    page,
    reports,
    research_socket,
    status,
)
from fedresearch.web.auth import json_error
from fedresearch.web.keys import (
    JOB_STORE,
    KEYS,
    METRICS,
    QUERYING,
    RESOLVER,
    RUNTIME,
    SETTINGS,
    SOCKETS,
    STOPPING,
    UPLOADING,
    UPSTREAMS,
    OpenSocket,
)

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
    """The process's runtime (library, HTTP session, registry, shared state, jobs), from start to stop."""
    given = Given(app[UPSTREAMS], app[METRICS], app[STOPPING], app.get(RESOLVER), app.get(JOB_STORE))
    async with open_runtime(app[SETTINGS], given) as runtime:
        app[RUNTIME] = runtime
        app[KEYS] = app[KEYS].with_keys(knowledge_base_keys(runtime.knowledge_bases))
        app[mcp_http.MCP_ENDPOINT] = endpoint = mcp_http.McpEndpoint(app)
        try:
            yield
        finally:
            await endpoint.close()


async def _retention_sweeps(app: web.Application) -> AsyncIterator[None]:
    async with retention_sweeps(app[RUNTIME]):
        yield


async def _stop_jobs(app: web.Application) -> None:
    if RUNTIME in app:  # the app started
        await stop_jobs(app[RUNTIME])


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
    running = [live.task for live in app[RUNTIME].live.values()] if RUNTIME in app else []
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
    adapters: Sequence[Upstream] = ADAPTERS,
    resolver: AbstractResolver | None = None,
    job_store: JobStore | None = None,
) -> web.Application:
    """The app; `adapters` is the registry tuple of upstreams (a test may pass one with an upstream of
    its own, `Upstream.of(about, factory)`), `resolver` resolves the hosts of pages to read (tests
    inject one; the SSRF check wraps it), `job_store` keeps the jobs (default: this process's, saved
    under the data dir, or Redis's)."""
    settings = settings or Settings()
    app = web.Application(client_max_size=1 << 20, middlewares=[_library_unavailable])
    if job_store is not None:
        app[JOB_STORE] = job_store
    if resolver is not None:
        app[RESOLVER] = resolver
    app[SETTINGS] = settings
    app[UPSTREAMS] = tuple(adapters)
    app[KEYS] = ApiKeys.from_settings(settings)
    app[METRICS] = Metrics()
    sockets: set[OpenSocket] = set()
    app[SOCKETS] = sockets
    app[QUERYING] = collections.Counter()
    app[UPLOADING] = collections.Counter()
    app[STOPPING] = Stopping(*stop_limits(settings))
    app.cleanup_ctx.append(_resources)
    app.cleanup_ctx.append(_retention_sweeps)  # after _resources: it reads the job store
    app.cleanup_ctx.append(reports.leftover_sweeps)
    app.on_shutdown.append(let_tasks_finish)
    app.on_shutdown.append(_close_sockets)
    app.on_shutdown.append(_stop_jobs)
    _add_routes(app)
    _allow_origins(app, settings.cors_allow_origins)
    return app


def _allow_origins(app: web.Application, origins: Sequence[str]) -> None:
    """CORS for the origins named (CORS_ALLOW_ORIGINS) on every HTTP route: preflights answered,
    answers carrying Access-Control-Allow-Origin for them alone. Not the WebSocket: a browser
    sends no preflight there, and its upgrade is checked by the key it presents."""
    if not origins:
        return
    options = aiohttp_cors.ResourceOptions(allow_credentials=True, expose_headers="*", allow_headers="*")
    cors = aiohttp_cors.setup(app, defaults={origin: options for origin in origins})
    for route in list(app.router.routes()):
        if route.resource is not None and route.resource.canonical != "/ws":
            cors.add(route)


def _add_routes(app: web.Application) -> None:
    page.register(app)
    app.router.add_get("/healthz", status.healthz)
    app.router.add_get("/metrics", status.metrics)
    app.router.add_get("/api/retrievers", status.retrievers)
    app.router.add_get("/api/report_forms", status.report_forms)
    app.router.add_get("/ws", research_socket.websocket)
    app.router.add_post("/internal/biblios/vector_search/", literature.literature_api)
    app.router.add_get("/reports/{name}", reports.report_file)
    # Dify appends /retrieval to the endpoint a user typed, so a trailing slash there gives //retrieval
    app.router.add_post("/retrieval", dify.retrieval)
    app.router.add_post("//retrieval", dify.retrieval)
    documents.register(app)
    gptr_files.register(app)
    jobs.register(app)
    for method in ("GET", "POST", "DELETE"):
        app.router.add_route(method, "/mcp", mcp_http.mcp_http)
    app.router.add_get("/openapi.json", openapi.openapi_json)
