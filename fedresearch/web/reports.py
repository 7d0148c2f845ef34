"""Saved reports, fetched over HTTP under /reports/: each readable by its owner and by admins only."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from aiohttp import web

from fedresearch.core.auth import Principal
from fedresearch.report.store import REPORT_NAME
from fedresearch.web.auth import principal_of
from fedresearch.web.keys import SETTINGS


async def report_file(request: web.Request) -> web.FileResponse:
    principal = principal_of(request)
    name = request.match_info["name"]
    directory = request.app[SETTINGS].reports_dir
    path = directory / name
    # another user's report is "not found", like a missing one: ids must not be probed
    if not REPORT_NAME.match(name) or not path.is_file() or not await asyncio.to_thread(_may_read, principal, path):
        raise web.HTTPNotFound(text="no such report")
    content_type = "text/markdown" if name.endswith(".md") else "application/json"
    return web.FileResponse(path, headers={"Content-Type": f"{content_type}; charset=utf-8"})


def _may_read(principal: Principal, path: Path) -> bool:
    """Admins read every report; a key bound to a user reads the reports that user's tasks saved."""
    if principal.admin:
        return True
    try:
        owner = json.loads(path.with_suffix(".json").read_text(encoding="utf-8")).get("owner")
    except (OSError, ValueError, AttributeError):
        return False  # no readable record says whose it is: only an admin may read it
    return owner is not None and owner == principal.user_id
