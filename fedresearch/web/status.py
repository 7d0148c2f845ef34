"""What the server is and how it fares: `/healthz`, `/metrics`, `GET /api/retrievers`, and what a
report can be (`GET /api/report_forms`: its types and file formats, read from their registries)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from aiohttp import web
from pydantic import BaseModel, Field

from fedresearch.core.errors import RequestError
from fedresearch.core.models import ReportSource, ResearchRequest
from fedresearch.core.settings import Settings
from fedresearch.federation.contract import Adapter
from fedresearch.federation.planning import ALIASES, choose_retrievers
from fedresearch.report.exports import EXPORT_FORMATS
from fedresearch.report.types import offered_forms
from fedresearch.web.auth import principal_of
from fedresearch.web.keys import METRICS, RUNTIME, SETTINGS


async def metrics(request: web.Request) -> web.Response:
    body = await asyncio.to_thread(request.app[METRICS].exposition)  # under workers: a file per process
    return web.Response(body=body, content_type="text/plain", charset="utf-8")


async def healthz(request: web.Request) -> web.Response:
    """The process serves (always 200: a restart would not bring a database back), and what it
    depends on, as last seen, without asking it: the library's store and the shared state."""
    runtime = request.app[RUNTIME]
    registry, library, redis = runtime.registry, runtime.library, runtime.redis
    body = {
        "status": "ok",
        "retrievers": sorted(registry),
        "library": "not open" if library is None else library.unavailable() or "ok",
        "shared_state": "in this process" if redis is None else redis.trouble or "Redis",
        "pid": os.getpid(),  # which worker answered, under `serve --workers N`
    }
    return web.json_response(body)


def retriever_list(registry: dict[str, Adapter]) -> dict[str, Any]:
    """Each retriever this server offers, what it is, and whether it can run without a per-request key."""
    listed: list[dict[str, Any]] = []
    for name, adapter in registry.items():
        missing = adapter.missing_setup()
        about = adapter.about
        entry: dict[str, Any] = {"name": name, "kind": about.kind, "configured": missing is None}
        if missing is not None:
            entry["reason"] = missing
        entry.update(
            website=about.website,
            needs_key=about.needs_key,
            needs_user=about.needs_user,
            credentials=list(about.credentials),
        )
        listed.append(entry)
    return {"retrievers": listed, "aliases": {alias: kind for alias, kind in ALIASES.items()}}


class RetrieverInfo(BaseModel):
    """One retriever: what it is, and whether it runs without a per-request key (why not, if not)."""

    name: str
    kind: str = Field(description="library, scholarly or web")
    configured: bool
    reason: str | None = Field(None, description="what it lacks; present only when not configured")
    website: str
    needs_key: bool
    needs_user: bool = Field(description="it searches a user's library: a task running it needs a user")
    credentials: list[str] = Field(description="the per-request headers it reads (its keys)")


class RetrieversAnswer(BaseModel):
    """`GET /api/retrievers`: the retrievers, and the user and limits this caller's tasks run with, so
    a client (the page) can say what is missing before it sends a task. It names no key, ever."""

    retrievers: list[RetrieverInfo]
    aliases: dict[str, str] = Field(description="names that stand for every retriever of a kind")
    user_id: str | None = Field(
        description="the user this request acts as when it names none: its API key's user, else "
        "FEDRESEARCH_DEFAULT_USER; null when there is neither"
    )
    user_id_required: bool = Field(
        description="no user is known: a task running a retriever that needs_user, and the documents "
        "routes, must name one (headers.user_id, ?user_id=)"
    )
    may_name_user: bool = Field(
        description="this request may act as another user by naming one (no keys on the server, or an "
        "admin key); a user's key acts as its user only"
    )
    max_task_chars: int = Field(description="the longest question a task may ask, in characters")
    default_retrievers: dict[str, list[str]] = Field(
        description="the retrievers a task that names none runs, by report_source"
    )


def _default_retrievers(settings: Settings, registry: dict[str, Adapter]) -> dict[str, list[str]]:
    chosen: dict[str, list[str]] = {}
    for source in ReportSource:
        try:
            chosen[source.value] = choose_retrievers(
                ResearchRequest(task="-", report_source=source), settings, registry
            )
        except RequestError:  # `static`: the given pages only, and none was given
            chosen[source.value] = []
    return chosen


async def retrievers(request: web.Request) -> web.Response:
    """The retrievers this server offers, and the user and limits this caller's tasks run with."""
    principal = principal_of(request)
    settings = request.app[SETTINGS]
    registry = request.app[RUNTIME].registry
    user = principal.user_id or settings.default_user
    answer = {
        **retriever_list(registry),
        "user_id": user,
        "user_id_required": user is None,
        "may_name_user": principal.admin,
        "max_task_chars": settings.max_task_chars,
        "default_retrievers": _default_retrievers(settings, registry),
    }
    # typed, and the shape it documents in OpenAPI: a field left out (a configured retriever's reason) stays out
    return web.json_response(RetrieversAnswer.model_validate(answer).model_dump(exclude_unset=True))


async def report_forms(request: web.Request) -> web.Response:
    """The report types a question alone can ask for (name, label, description) and the formats
    every report is saved in: public, like the page that builds its menu and buttons from them."""
    types = [{"name": form.name, "label": form.label, "description": form.description} for form in offered_forms()]
    return web.json_response({"report_types": types, "formats": list(EXPORT_FORMATS)})
