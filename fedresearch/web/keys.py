"""What the app holds for its handlers, under typed keys (built in app.py, read everywhere in web/)."""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web
from aiohttp.abc import AbstractResolver

from fedresearch.core.auth import ApiKeys
from fedresearch.core.metrics import Metrics
from fedresearch.core.redis import SharedRedis
from fedresearch.core.settings import Settings
from fedresearch.federation.contract import Adapter
from fedresearch.federation.registry import AdapterFactory
from fedresearch.federation.runner import Deps
from fedresearch.jobs.slots import TaskSlots
from fedresearch.jobs.stopping import Stopping
from fedresearch.jobs.store import JobStore, RetentionPace
from fedresearch.knowledge.bases import KnowledgeBase
from fedresearch.report.chat import ChatSession
from fedresearch.report.llm import LlmClients
from fedresearch.report.task import ResearchTools


class OpenSocket(Protocol):
    async def drain(self, grace_s: float) -> None:
        """The server is stopping: send the rest of the job followed, and a chat's answer on its way,
        for `grace_s` at most; then, unless still following the job, close."""
        ...

    async def shut_down(self) -> None:
        """The server is stopping: tell the client, stop its work, close."""
        ...


@dataclass
class LiveJob:
    """A job running in this process: its task (to cancel it), whether it outlives its socket, and
    once written, the chat session about its report."""

    task: asyncio.Task[None]
    detached: bool
    chat: ChatSession | None = None


SETTINGS = web.AppKey("settings", Settings)
KEYS = web.AppKey("keys", ApiKeys)
METRICS = web.AppKey("metrics", Metrics)
ADAPTER_FACTORIES = web.AppKey[tuple[AdapterFactory, ...]]("adapter_factories")
REGISTRY = web.AppKey[dict[str, Adapter]]("registry")
DEPS = web.AppKey("deps", Deps)
TOOLS = web.AppKey("research_tools", ResearchTools)  # what every research task shares
LLM_CLIENTS = web.AppKey("llm_clients", LlmClients)  # the model endpoint's clients, made once
KNOWLEDGE_BASES = web.AppKey[dict[str, KnowledgeBase]]("knowledge_bases")
SOCKETS = web.AppKey[set[OpenSocket]]("sockets")
RUNNING = web.AppKey[collections.Counter[str]]("running_per_key")
QUERYING = web.AppKey[collections.Counter[str]]("querying_per_key")  # /retrieval and the literature API
RESOLVER = web.AppKey("resolver", AbstractResolver)
TASK_SLOTS = web.AppKey[TaskSlots]("task_slots")
SHARED_REDIS = web.AppKey[SharedRedis | None]("shared_redis")
JOBS = web.AppKey[JobStore]("jobs")
RETENTION_PACE = web.AppKey("retention_pace", RetentionPace)
LIVE_JOBS = web.AppKey[dict[str, LiveJob]]("live_jobs")
STOPPING = web.AppKey("stopping", Stopping)  # begun on SIGTERM: no new tasks, running ones finish
BACKGROUND = web.AppKey[set[asyncio.Task[object]]]("background")  # webhooks, retention: awaited at shutdown
