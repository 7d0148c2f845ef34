"""The processes that serve the app: one alone (`serve_one`), a supervisor's worker (`serve_worker`),
or the MCP tools over stdio; each runs until a signal (`signals.py`) and stops as its tasks allow."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
from collections.abc import AsyncIterator, Callable
from typing import Literal

from aiohttp import web

from fedresearch.core import collector
from fedresearch.core.settings import Settings
from fedresearch.serve.preflight import prepare
from fedresearch.serve.signals import handle_signals, ignore_signals
from fedresearch.web.access_log import RedactingAccessLogger
from fedresearch.web.app import create_app, let_tasks_finish
from fedresearch.web.keys import METRICS, STOPPING

log = logging.getLogger("fedresearch")


async def serve_mcp_stdio(settings: Settings | None = None) -> None:
    """`fedresearch mcp`: the MCP tools over stdin/stdout, with the server's registry and library."""
    app = create_app(settings or Settings())
    runner = web.AppRunner(app)
    await runner.setup()  # opens the library, the HTTP session and the registry; listens nowhere
    try:
        from fedresearch.web.mcp_server import build_server

        await build_server(app).run_stdio_async()
    finally:
        await runner.cleanup()


def serve_one(settings: Settings, host: str, port: int) -> None:
    """`fedresearch serve` as one process (launch.py decided so): the app, on `port` (0: a free one)."""
    app = create_app(settings)
    app.cleanup_ctx.append(_settled)

    def sites(runner: web.AppRunner) -> list[web.BaseSite]:
        if port == 0:  # bound here, so that "Running on" names the port the kernel picked, not 0
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            return [web.SockSite(runner, socket.create_server((host, 0), family=family))]
        return [web.TCPSite(runner, host, port)]

    asyncio.run(serve_until_stopped(app, sites, hangup="stop"))


def serve_worker(
    settings: Settings, host: str, port: int, supervisor: int, listen_fd: int | None, ready_fd: int | None = None
) -> None:
    """One of `serve --workers N`'s processes: the socket its supervisor bound, or its own on the port
    (SO_REUSEPORT); it stops, as on SIGTERM, when the supervisor is gone. `ready_fd` (a worker taking
    another's place) is told once it listens."""
    prepare(settings, host, with_pid=True, warn=False)
    app = create_app(settings)
    app.cleanup_ctx.append(_watching(supervisor))
    app.cleanup_ctx.append(_settled)

    def sites(runner: web.AppRunner) -> list[web.BaseSite]:
        if listen_fd is not None:
            return [web.SockSite(runner, socket.socket(fileno=listen_fd))]
        return [web.TCPSite(runner, host, port, reuse_port=True)]

    asyncio.run(serve_until_stopped(app, sites, hangup="retire", ready_fd=ready_fd))


async def serve_until_stopped(
    app: web.Application,
    sites: Callable[[web.AppRunner], list[web.BaseSite]],
    hangup: Literal["stop", "retire"],
    ready_fd: int | None = None,
) -> None:
    """Serve `app` on `sites` until a signal (`signals.py`); then close the listeners, so that
    new connections go to the workers that stay, let the running tasks finish while every open
    connection is still read (pings answered, a chat asked), and only then shut down as aiohttp
    does: it stops reading every connection first, then runs `on_shutdown` (sockets closed, what
    still runs stopped), then gives handlers 10 s at most. `ready_fd` is written to once listening."""
    handle_signals(app[STOPPING], hangup)
    # keys sent as ?token= must not reach the access log
    runner = web.AppRunner(app, handle_signals=False, access_log_class=RedactingAccessLogger, shutdown_timeout=10)
    await runner.setup()
    try:
        listening = sites(runner)
        for site in listening:
            await site.start()
        log.info("======== Running on %s ========", ", ".join(sorted(site.name for site in listening)))
        if ready_fd is not None:
            os.write(ready_fd, b"1")
            os.close(ready_fd)
        await app[STOPPING].asked.wait()
        for site in listening:
            await site.stop()
        await let_tasks_finish(app)
    finally:
        await runner.cleanup()
        ignore_signals()


async def _settled(app: web.Application) -> AsyncIterator[None]:
    # a server process only: tests build many apps in one process and must not freeze their objects
    metrics = app[METRICS]
    metrics.pauses = collector.settle()
    metrics.gc_frozen.set(gc.get_freeze_count())

    async def publishing() -> None:  # under workers, for the scrapes another worker answers
        while True:
            await asyncio.sleep(collector.PUBLISH_S)
            metrics.publish()

    publisher = asyncio.create_task(publishing())
    yield
    publisher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await publisher


def _watching(supervisor: int) -> Callable[[web.Application], AsyncIterator[None]]:
    async def watch(app: web.Application) -> AsyncIterator[None]:
        async def until_orphaned() -> None:
            while os.getppid() == supervisor:
                await asyncio.sleep(1.0)
            log.warning("the supervisor (pid %d) is gone: stopping", supervisor)
            os.kill(os.getpid(), signal.SIGTERM)

        watcher = asyncio.create_task(until_orphaned())
        yield
        watcher.cancel()

    return watch
