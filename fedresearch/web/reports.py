"""Saved reports, fetched over HTTP under /reports/: each readable by its owner and by admins only;
exports are rendered on first request."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from aiohttp import web

from fedresearch.core.auth import Principal
from fedresearch.report.exports import EXPORTS
from fedresearch.report.store import REPORT_NAME, export
from fedresearch.web.auth import principal_of
from fedresearch.web.keys import SETTINGS

_TYPES = {"md": "text/markdown; charset=utf-8", "json": "application/json; charset=utf-8", **EXPORTS}


async def report_file(request: web.Request) -> web.FileResponse:
    principal = principal_of(request)
    match = REPORT_NAME.match(request.match_info["name"])
    directory = request.app[SETTINGS].reports_dir
    # another user's report is "not found", like a missing one: ids must not be probed
    if match is None or not await asyncio.to_thread(may_read, principal, directory / f"{match.group(1)}.json"):
        raise web.HTTPNotFound(text="no such report")
    report_id, kind = match.groups()
    path = await asyncio.to_thread(export, directory, report_id, kind)
    if path is None:
        raise web.HTTPNotFound(text="no such report")
    headers = {"Content-Type": _TYPES[kind]}
    if kind in ("pdf", "docx"):
        headers["Content-Disposition"] = f'attachment; filename="report-{report_id[:8]}.{kind}"'
    return web.FileResponse(path, headers=headers)


def may_read(principal: Principal, record: Path) -> bool:
    """Admins read every report; a key bound to a user reads the reports that user's tasks saved."""
    if not record.is_file():
        return False
    if principal.admin:
        return True
    try:
        owner = json.loads(record.read_text(encoding="utf-8")).get("owner")
    except (OSError, ValueError, AttributeError):
        return False  # no readable record says whose it is: only an admin may read it
    return owner is not None and owner == principal.user_id
