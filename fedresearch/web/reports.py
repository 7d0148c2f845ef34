"""Saved reports, fetched over HTTP under /reports/ (exports rendered on first request)."""

from __future__ import annotations

import asyncio

from aiohttp import web

from fedresearch.report.exports import EXPORTS
from fedresearch.report.store import REPORT_NAME, export
from fedresearch.web.auth import principal_of
from fedresearch.web.keys import SETTINGS

_TYPES = {"md": "text/markdown; charset=utf-8", "json": "application/json; charset=utf-8", **EXPORTS}


async def report_file(request: web.Request) -> web.FileResponse:
    principal_of(request)
    name = request.match_info["name"]
    match = REPORT_NAME.match(name)
    if match is None:
        raise web.HTTPNotFound(text="no such report")
    report_id, kind = match.groups()
    path = await asyncio.to_thread(export, request.app[SETTINGS].reports_dir, report_id, kind)
    if path is None:
        raise web.HTTPNotFound(text="no such report")
    headers = {"Content-Type": _TYPES[kind]}
    if kind in ("pdf", "docx"):
        headers["Content-Disposition"] = f'attachment; filename="report-{report_id[:8]}.{kind}"'
    return web.FileResponse(path, headers=headers)
