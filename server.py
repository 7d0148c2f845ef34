"""The aiohttp app: WebSocket research (/ws), the literature API, saved reports, health.

Only transport lives here: frames in, `ResearchRequest` to the pipeline, events out as frames.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web
from pydantic import ValidationError

from core.auth import ApiKeys, Principal, bearer_token, check_bind
from core.errors import RequestError
from core.events import ProgressEvent
from core.metrics import Metrics
from core.models import LiteratureQuery, ResearchRequest
from core.settings import Settings
from knowledge.api import RetrievalRequest
from knowledge.bases import knowledge_base_keys, load_knowledge_bases, may_read
from knowledge.retrieval import retrieve as retrieve_from_knowledge_base
from library.open import open_library
from report.store import REPORT_NAME
from research import run_research
from retrievers.base import Deps, Retriever
from retrievers.registry import build_registry, close_registry
from retrievers.resilience import Guard
from retrievers.selection import plan_request

log = logging.getLogger("fedresearch")

SETTINGS = web.AppKey("settings", Settings)
KEYS = web.AppKey("keys", ApiKeys)
REGISTRY = web.AppKey("registry", dict)
DEPS = web.AppKey("deps", Deps)
KNOWLEDGE_BASES = web.AppKey("knowledge_bases", dict)
SOCKETS = web.AppKey("sockets", set)
RUNNING = web.AppKey("running_per_key", collections.Counter)
METRICS = web.AppKey("metrics", Metrics)

_REPORT_CHUNK = 2000


# -- helpers -----------------------------------------------------------------------------------


def _json_error(kind: type[web.HTTPException], message: str, **headers: str) -> web.HTTPException:
    return kind(text=json.dumps({"error": message}), content_type="application/json", headers=headers or None)


def _principal(request: web.Request) -> Principal:
    """Who the caller is; with keys configured, a missing or wrong key is refused here."""
    keys = request.app[KEYS]
    if not keys.enabled:
        return Principal(None, admin=True)
    token = bearer_token(request.headers.get("Authorization"), request.query.get("token"))
    principal = keys.authenticate(token)
    if principal is not None and principal.knowledge_bases is not None:
        raise _json_error(web.HTTPForbidden, "this API key is for POST /retrieval on its knowledge base only")
    if principal is None:
        reason = "a valid API key is required" if token else "an API key is required"
        message = f"{reason}: send Authorization: Bearer KEY or ?token=KEY"
        raise _json_error(web.HTTPUnauthorized, message, **{"WWW-Authenticate": "Bearer"})
    return principal


def _validation_message(error: ValidationError) -> str:
    parts = []
    for issue in error.errors():
        where = ".".join(str(part) for part in issue["loc"]) or "request"
        parts.append(f"{where}: {'missing' if issue['type'] == 'missing' else issue['msg']}")
    return "invalid request: " + "; ".join(parts)


# -- WebSocket ---------------------------------------------------------------------------------


class ResearchSocket:
    """One client connection: at most one task at a time, cancelled when the socket closes."""

    def __init__(self, ws: web.WebSocketResponse, app: web.Application, principal: Principal) -> None:
        self.ws = ws
        self.app = app
        self.principal = principal
        self.task: asyncio.Task[None] | None = None

    async def send(self, frame: dict[str, Any]) -> None:
        if self.ws.closed:
            return
        with contextlib.suppress(ConnectionError, aiohttp.ClientConnectionResetError):
            await self.ws.send_str(json.dumps(frame, ensure_ascii=False))

    async def log_event(self, event: ProgressEvent) -> None:
        await self.send({"type": "logs", "content": event.step, "output": event.output, "metadata": event.metadata})

    async def error(self, message: str) -> None:
        # GPT-Researcher's page shows only logs frames, so every error is said both ways.
        await self.send({"type": "error", "content": "error", "output": message})
        await self.send({"type": "logs", "content": "error", "output": message, "metadata": None})

    async def on_text(self, data: str) -> None:
        limit = self.app[SETTINGS].max_frame_bytes
        if len(data) > limit and len(data.encode()) > limit:
            await self.error(f"frame of {len(data.encode())} bytes exceeds MAX_FRAME_BYTES ({limit})")
            return
        text = data.strip()
        if text == "ping":
            if not self.ws.closed:
                await self.ws.send_str("pong")
            return
        if text.startswith("start"):
            payload = text[len("start") :].strip()
        elif text.startswith("{"):
            payload = text
        elif text.startswith("chat"):
            await self.error("chat is not supported by this server: send start {json} with a task")
            return
        else:
            await self.error("Unknown command received by server: send ping, or start {json} with a task")
            return
        await self.start(payload)

    async def start(self, payload: str) -> None:
        try:
            body = json.loads(payload)
        except json.JSONDecodeError as error:
            await self.error(f"invalid JSON after start: {error.msg} at position {error.pos}")
            return
        if not isinstance(body, dict):
            await self.error(f"start expects a JSON object, got {type(body).__name__}")
            return
        try:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            # "\ud800" is valid JSON but no text: it would fail later, in storage or in a reply
            await self.error("invalid JSON after start: a \\u escape encodes a lone surrogate, which is not text")
            return
        try:
            request = ResearchRequest.model_validate(body)
        except ValidationError as error:
            await self.error(_validation_message(error))
            return
        if self.task is not None and not self.task.done():
            await self.send(
                {"type": "logs", "content": "warning", "output": "Task already running. Please wait.", "metadata": None}
            )
            return
        settings = self.app[SETTINGS]
        if len(request.task) > settings.max_task_chars:
            await self.error(f"task is {len(request.task)} characters; MAX_TASK_CHARS is {settings.max_task_chars}")
            return
        running = self.app[RUNNING]
        if running[self.principal.key_id] >= settings.max_tasks_per_key:
            await self.error(
                f"{running[self.principal.key_id]} tasks are already running for this API key "
                f"(MAX_TASKS_PER_KEY={settings.max_tasks_per_key}); wait for one to finish"
            )
            return
        bound = None if self.principal.admin else self.principal.user_id
        try:
            plan = plan_request(request, self.app[SETTINGS], self.app[REGISTRY], bound_user=bound)
        except RequestError as error:
            await self.error(str(error))
            return
        running[self.principal.key_id] += 1  # counted now, so two sockets cannot both slip under the limit
        self.task = asyncio.create_task(self.run(request, plan))

    async def run(self, request: ResearchRequest, plan: Any) -> None:
        self.app[METRICS].tasks.inc()
        try:
            await self._run(request, plan)
        finally:
            self.app[METRICS].tasks.dec()
            self.app[RUNNING][self.principal.key_id] -= 1

    async def _run(self, request: ResearchRequest, plan: Any) -> None:
        settings = self.app[SETTINGS]
        try:
            async with asyncio.timeout(settings.task_timeout_s):
                outcome = await run_research(request, plan, self.app[REGISTRY], self.app[DEPS], self.log_event)
        except TimeoutError:
            await self.error(f"the task did not finish within {settings.task_timeout_s:g} s (TASK_TIMEOUT_S)")
            return
        except Exception:
            log.exception("research task failed")
            await self.error("internal error while running the task; the server log has the details")
            return
        markdown = outcome.markdown
        for start in range(0, len(markdown), _REPORT_CHUNK):
            await self.send({"type": "report", "output": markdown[start : start + _REPORT_CHUNK]})
        files = {kind: f"reports/{name}" for kind, name in outcome.files.items()}
        await self.log_event(
            ProgressEvent(
                "report_written", f"📄 Report saved with {len(outcome.references)} references", {"files": files}
            )
        )
        await self.send({"type": "path", "output": files})

    async def shut_down(self) -> None:
        """The server is stopping: say so, stop the task, close with 1001 (going away)."""
        if self.task is not None and not self.task.done():
            await self.error("the server is shutting down; the running task was stopped, please retry later")
        await self.close()
        await self.ws.close(code=aiohttp.WSCloseCode.GOING_AWAY, message=b"server shutting down")

    async def close(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


async def websocket(request: web.Request) -> web.WebSocketResponse:
    principal = _principal(request)
    # aiohttp's own cap closes the socket (1009); below it, MAX_FRAME_BYTES answers with an error frame
    # no permessage-deflate: frames are small JSON, and compressing each cost ~12% of the server's CPU
    ws = web.WebSocketResponse(heartbeat=30, max_msg_size=request.app[SETTINGS].max_frame_bytes * 16, compress=False)
    await ws.prepare(request)
    socket = ResearchSocket(ws, request.app, principal)
    request.app[METRICS].sockets.inc()
    request.app[SOCKETS].add(socket)
    try:
        async for message in ws:
            if message.type == aiohttp.WSMsgType.TEXT:
                await socket.on_text(message.data)
            elif message.type == aiohttp.WSMsgType.BINARY:
                await socket.error("binary frames are not supported: send text frames")
    finally:
        request.app[SOCKETS].discard(socket)
        await socket.close()
        request.app[METRICS].sockets.dec()
    return ws


# -- HTTP --------------------------------------------------------------------------------------


async def literature_api(request: web.Request) -> web.Response:
    """The internal literature API, answered by the embedded library (DESIGN.md)."""
    principal = _principal(request)
    try:
        body = LiteratureQuery.model_validate_json(await request.read())
    except ValidationError as error:
        raise _json_error(web.HTTPBadRequest, _validation_message(error)) from None
    if not principal.admin and principal.user_id != body.user_id:
        raise _json_error(web.HTTPForbidden, f"this API key acts as user {principal.user_id!r} only")
    library = request.app[DEPS].library
    assert library is not None
    items = await asyncio.to_thread(library.search_items, body.user_id, body.type, body.query, body.top_k)
    return web.json_response(items)


def _dify_error(kind: type[web.HTTPException], code: int, message: str) -> web.HTTPException:
    return kind(text=json.dumps({"error_code": code, "error_msg": message}), content_type="application/json")


def _dify_principal(request: web.Request) -> Principal | None:
    """The caller of /retrieval, or None when no key was sent (403s use Dify's error codes)."""
    header = request.headers.get("Authorization")
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    if scheme != "Bearer" or not token.strip():
        raise _dify_error(
            web.HTTPForbidden, 1001, "Invalid Authorization header format. Expected 'Bearer <api-key>' format."
        )
    keys = request.app[KEYS]
    if not keys.enabled:
        return Principal(None, admin=True)  # a loopback-only server without keys accepts any
    principal = keys.authenticate(token.strip())
    if principal is None:
        raise _dify_error(web.HTTPForbidden, 1002, "Authorization failed")
    return principal


async def dify_retrieval(request: web.Request) -> web.Response:
    """Dify's External Knowledge API (DESIGN.md): records from one knowledge base's federation."""
    principal = _dify_principal(request)
    raw = await request.read()
    try:
        body = RetrievalRequest.model_validate_json(raw) if raw.strip() else None
    except ValidationError as error:
        raise _dify_error(web.HTTPBadRequest, 400, _validation_message(error)) from None
    if body is None or body.is_probe:
        return web.json_response({"records": []})
    if principal is None:
        if request.app[KEYS].enabled:
            raise _dify_error(
                web.HTTPForbidden, 1001, "Invalid Authorization header format. Expected 'Bearer <api-key>' format."
            )
        principal = Principal(None, admin=True)
    base = request.app[KNOWLEDGE_BASES].get(body.knowledge_id)
    if base is None:
        raise _dify_error(web.HTTPNotFound, 2001, "The knowledge does not exist")
    if not may_read(principal, base):
        raise _dify_error(web.HTTPForbidden, 1002, "Authorization failed")
    records = await retrieve_from_knowledge_base(base, body, request.app[REGISTRY], request.app[DEPS])
    return web.json_response({"records": [record.as_json() for record in records]})


async def report_file(request: web.Request) -> web.FileResponse:
    _principal(request)
    name = request.match_info["name"]
    path = request.app[SETTINGS].reports_dir / name
    if not REPORT_NAME.match(name) or not path.is_file():
        raise web.HTTPNotFound(text="no such report")
    content_type = "text/markdown" if name.endswith(".md") else "application/json"
    return web.FileResponse(path, headers={"Content-Type": f"{content_type}; charset=utf-8"})


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[METRICS].exposition(), content_type="text/plain", charset="utf-8")


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "retrievers": sorted(request.app[REGISTRY])})


async def index(request: web.Request) -> web.Response:
    names = ", ".join(sorted(request.app[REGISTRY]))
    return web.Response(
        text=(
            "fedresearch: federated research over your library and the web.\n"
            "WebSocket research: /ws (GPT-Researcher protocol)\n"
            "Literature API: POST /internal/biblios/vector_search/\n"
            "Dify External Knowledge API: POST /retrieval\n"
            f"Retrievers: {names}\n"
        )
    )


# -- app ---------------------------------------------------------------------------------------


async def _resources(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    registry: dict[str, Retriever] = build_registry(settings)
    bases = load_knowledge_bases(settings.knowledge_bases, set(registry))
    app[KNOWLEDGE_BASES] = bases
    app[KEYS] = app[KEYS].with_keys(knowledge_base_keys(bases))
    library = await asyncio.to_thread(open_library, settings)
    connector = aiohttp.TCPConnector(limit=200, limit_per_host=50)
    timeout = aiohttp.ClientTimeout(total=settings.retriever_timeout_s, connect=min(5.0, settings.retriever_timeout_s))
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False) as session:
        app[REGISTRY] = registry
        app[DEPS] = Deps(
            session=session, settings=settings, library=library, guard=Guard(settings), metrics=app[METRICS]
        )
        try:
            yield
        finally:
            await close_registry(registry)


async def _close_sockets(app: web.Application) -> None:
    await asyncio.gather(*(socket.shut_down() for socket in list(app[SOCKETS])), return_exceptions=True)


def create_app(settings: Settings | None = None) -> web.Application:
    settings = settings or Settings()
    app = web.Application(client_max_size=1 << 20)
    app[SETTINGS] = settings
    app[KEYS] = ApiKeys.from_settings(settings)
    app[METRICS] = Metrics()
    app[SOCKETS] = set()
    app[RUNNING] = collections.Counter()
    app.cleanup_ctx.append(_resources)
    app.on_shutdown.append(_close_sockets)
    app.router.add_get("/", index)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/ws", websocket)
    app.router.add_post("/internal/biblios/vector_search/", literature_api)
    app.router.add_get("/reports/{name}", report_file)
    # Dify appends /retrieval to the endpoint a user typed, so a trailing slash there gives //retrieval
    app.router.add_post("/retrieval", dify_retrieval)
    app.router.add_post("//retrieval", dify_retrieval)
    return app


def serve(settings: Settings | None = None, host: str | None = None, port: int | None = None) -> None:
    settings = settings or Settings()
    host = host or settings.host
    port = port or settings.port
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    keys = ApiKeys.from_settings(settings)
    refusal = check_bind(host, keys)
    if refusal:
        raise SystemExit(refusal)
    if not keys.enabled:
        log.warning("no API keys configured (FEDRESEARCH_API_KEYS): listening on %s only", host)
    # SIGTERM/SIGINT: stop accepting, tell clients (on_shutdown), then give handlers 10 s at most
    web.run_app(
        create_app(settings), host=host, port=port, shutdown_timeout=10, print=lambda text: log.info(text.strip())
    )


if __name__ == "__main__":
    serve()
