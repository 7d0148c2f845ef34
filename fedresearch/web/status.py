"""What the server is and how it fares: `/healthz`, `/metrics`, `GET /api/retrievers`, and what a
report can be (`GET /api/report_forms`: its types and file formats, read from their registries)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from aiohttp import web

from fedresearch.federation.contract import Adapter
from fedresearch.federation.planning import ALIASES
from fedresearch.report.exports import EXPORT_FORMATS
from fedresearch.report.types import offered_forms
from fedresearch.web.auth import principal_of
from fedresearch.web.keys import METRICS, RUNTIME


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


async def retrievers(request: web.Request) -> web.Response:
    principal_of(request)
    return web.json_response(retriever_list(request.app[RUNTIME].registry))


async def report_forms(request: web.Request) -> web.Response:
    """The report types a question alone can ask for (name, label, description) and the formats
    every report is saved in: public, like the page that builds its menu and buttons from them."""
    types = [{"name": form.name, "label": form.label, "description": form.description} for form in offered_forms()]
    return web.json_response({"report_types": types, "formats": list(EXPORT_FORMATS)})
