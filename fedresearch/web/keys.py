"""What the app holds for its handlers, under typed keys (set in app.py, read everywhere in web/)."""

from __future__ import annotations

import collections
from typing import Protocol

from aiohttp import web
from aiohttp.abc import AbstractResolver

from fedresearch.core.auth import ApiKeys
from fedresearch.core.metrics import Metrics
from fedresearch.core.settings import Settings
from fedresearch.federation.registry import Upstream
from fedresearch.jobs.runtime import Runtime
from fedresearch.jobs.stopping import Stopping
from fedresearch.jobs.store import JobStore


class OpenSocket(Protocol):
    async def drain(self, grace_s: float) -> None:
        """The server is stopping: send the rest of the job followed, and a chat's answer on its way,
        for `grace_s` at most; then, unless still following the job, close."""
        ...

    async def shut_down(self) -> None:
        """The server is stopping: tell the client, stop its work, close."""
        ...


SETTINGS = web.AppKey("settings", Settings)
KEYS = web.AppKey("keys", ApiKeys)
METRICS = web.AppKey("metrics", Metrics)
UPSTREAMS = web.AppKey[tuple[Upstream, ...]]("upstreams")
RESOLVER = web.AppKey("resolver", AbstractResolver)  # the pages' hosts (tests give one)
JOB_STORE = web.AppKey[JobStore]("job_store")  # one given to create_app (default: the runtime makes one)
STOPPING = web.AppKey("stopping", Stopping)  # begun on SIGTERM: no new tasks, running ones finish
RUNTIME = web.AppKey("runtime", Runtime)  # the process's services, from app start to its end
SOCKETS = web.AppKey[set[OpenSocket]]("sockets")
QUERYING = web.AppKey[collections.Counter[str]]("querying_per_key")  # /retrieval and the literature API
UPLOADING = web.AppKey[collections.Counter[str]]("uploading_per_key")  # /api/documents and /upload/
