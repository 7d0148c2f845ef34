"""Saved reports, fetched over HTTP under /reports/."""

from __future__ import annotations

from aiohttp import web

from fedresearch.report.store import REPORT_NAME
from fedresearch.web.auth import principal_of
from fedresearch.web.keys import SETTINGS


async def report_file(request: web.Request) -> web.FileResponse:
    principal_of(request)
    name = request.match_info["name"]
    path = request.app[SETTINGS].reports_dir / name
    if not REPORT_NAME.match(name) or not path.is_file():
        raise web.HTTPNotFound(text="no such report")
    content_type = "text/markdown" if name.endswith(".md") else "application/json"
    return web.FileResponse(path, headers={"Content-Type": f"{content_type}; charset=utf-8"})
