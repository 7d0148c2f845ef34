"""The research page at `/`: plain HTML, CSS and JavaScript under `static/`, no build step.

It speaks only the public protocol (/ws, /api/retrievers, /api/documents, /reports/...), so it
holds no secret and needs no server-side state; the API key stays in the visitor's browser.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

STATIC = Path(__file__).parent / "static"
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
}

# the page loads only its own files; reports are Markdown sanitized by DOMPurify, and this policy
# is the second wall should something slip through: no inline script, no foreign origin
_POLICY = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self' ws: wss:",
        "frame-ancestors 'none'",
        "base-uri 'none'",
        "form-action 'none'",
    )
)
_HEADERS = {
    "Content-Security-Policy": _POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # revalidated on every load, so an upgraded server never runs yesterday's script
    "Cache-Control": "no-cache",
}


def _file(relative: str) -> Path | None:
    """The static file `relative` names, if it is one of the page's own (no way out of the folder)."""
    path = (STATIC / relative).resolve()
    if not path.is_relative_to(STATIC.resolve()) or path.suffix not in _TYPES or not path.is_file():
        return None
    return path


async def index(request: web.Request) -> web.FileResponse:
    """The research page."""
    return web.FileResponse(STATIC / "index.html", headers={**_HEADERS, "Content-Type": _TYPES[".html"]})


async def asset(request: web.Request) -> web.FileResponse:
    """The page's scripts, style sheet and the vendored libraries' licences."""
    path = _file(request.match_info["name"])
    if path is None:
        raise web.HTTPNotFound(text="no such file")
    return web.FileResponse(path, headers={**_HEADERS, "Content-Type": _TYPES[path.suffix]})


def register(app: web.Application) -> None:
    app.router.add_get("/", index)
    app.router.add_get("/static/{name:.+}", asset)
