"""Saved reports over HTTP, under /reports/: each readable by its owner and by admins only
(jobs/reports.py decides, and fetches a report another host wrote); exports are rendered on first
request."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from fedresearch.jobs.reports import sweeping_leftovers
from fedresearch.report.exports import EXPORT_FORMATS
from fedresearch.report.render import ExportFailed
from fedresearch.report.store import REPORT_NAME, content_disposition
from fedresearch.web.auth import principal_of
from fedresearch.web.keys import RUNTIME

# the HTML export is self-contained: its own inline style, nothing else, in a sandbox of its own
_HTML_EXPORT_POLICY = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; sandbox"


def failed_export(failed: ExportFailed) -> web.HTTPException:
    """A file that could not be made, as an answer in words: the report itself is too large for it
    (422), or making it overran this server's limits (503)."""
    if failed.too_large:
        return web.HTTPUnprocessableEntity(text=failed.reason)
    return web.HTTPServiceUnavailable(text=failed.reason)


async def leftover_sweeps(app: web.Application) -> AsyncIterator[None]:
    async with sweeping_leftovers(app[RUNTIME].reports()):
        yield


async def report_file(request: web.Request) -> web.FileResponse:
    principal = principal_of(request)
    match = REPORT_NAME.match(request.match_info["name"])
    reports = request.app[RUNTIME].reports()
    # another user's report is "not found", like a missing one: ids must not be probed
    if match is None or not await reports.readable(principal, match.group(1)):
        raise web.HTTPNotFound(text="no such report")
    report_id, kind = match.groups()
    try:
        path = await reports.export(report_id, kind, principal.user_id or principal.key_id)
    except ExportFailed as failed:
        raise failed_export(failed) from None
    if path is None:
        raise web.HTTPNotFound(text="no such report")
    served = EXPORT_FORMATS[kind]
    # named after its question for whoever saves it (a browser, the page's download buttons); the
    # formats a browser shows (Markdown, HTML, JSON) are shown, and saved under that name too
    question = await reports.question(report_id) or ""
    headers = {
        "Content-Type": served.media_type,
        "X-Content-Type-Options": "nosniff",
        "Content-Disposition": content_disposition(question, kind, attachment=served.attachment),
    }
    if kind == "html":  # opened from this server's origin: it may run nothing and load nothing
        headers["Content-Security-Policy"] = _HTML_EXPORT_POLICY
    return web.FileResponse(path, headers=headers)
