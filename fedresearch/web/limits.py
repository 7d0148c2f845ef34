"""Per-key limits on the query APIs (`/retrieval`, the literature API, MCP's search): one key's
burst of queries never takes the threads, memory and CPU every other caller needs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from aiohttp import web

from fedresearch.jobs.slots import LocalTaskSlots
from fedresearch.web.keys import QUERYING, SETTINGS

RETRY_AFTER_S = 1  # a query is answered within seconds: a slot frees soon

Refusal = Callable[[str, dict[str, str]], Exception]  # the message and headers -> what to raise


@contextlib.contextmanager
def query_slot(request: web.Request, key_id: str, refuse: Refusal) -> Iterator[None]:
    """Hold one of the key's MAX_QUERIES_PER_KEY slots while the query runs; `refuse` makes the 429."""
    with app_query_slot(request.app, key_id, refuse):
        yield


@contextlib.contextmanager
def app_query_slot(
    app: web.Application, key_id: str, refuse: Callable[[str, dict[str, str]], Exception]
) -> Iterator[None]:
    """`query_slot` for a caller that is not an HTTP request of its own (an MCP tool call)."""
    limit = app[SETTINGS].max_queries_per_key
    running = app[QUERYING]
    if running[key_id] >= limit:
        message = f"{running[key_id]} queries are already running for this API key (MAX_QUERIES_PER_KEY={limit})"
        raise refuse(f"{message}; retry after {RETRY_AFTER_S} s", {"Retry-After": str(RETRY_AFTER_S)})
    release = LocalTaskSlots(running).count(key_id)
    try:
        yield
    finally:
        release()


def query_too_long(query: str, request: web.Request | web.Application) -> str | None:
    """Why `query` is refused (longer than MAX_TASK_CHARS), or None."""
    app = request.app if isinstance(request, web.Request) else request
    limit = app[SETTINGS].max_task_chars
    return f"query is {len(query)} characters; MAX_TASK_CHARS is {limit}" if len(query) > limit else None
