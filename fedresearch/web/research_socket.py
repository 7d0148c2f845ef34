"""GPT-Researcher's WebSocket protocol at /ws: text frames in, a task run, progress and the report out.

Only transport lives here: a frame becomes a `ResearchRequest`, the plan and task come from the
floors below, and their progress events go back out as `logs` frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from typing import Any

import aiohttp
from aiohttp import web
from pydantic import ValidationError

from fedresearch.core.auth import Principal
from fedresearch.core.errors import RequestError
from fedresearch.core.events import ProgressEvent
from fedresearch.core.models import ResearchRequest
from fedresearch.federation.planning import Plan, plan_request
from fedresearch.report.chat import ChatSession
from fedresearch.report.compose import report_chunks
from fedresearch.report.store import save_report
from fedresearch.report.task import run_research
from fedresearch.web.auth import principal_of, validation_message
from fedresearch.web.keys import DEPS, METRICS, REGISTRY, SETTINGS, SOCKETS, TASK_SLOTS
from fedresearch.web.task_slots import Release

log = logging.getLogger("fedresearch")


def parse_start(payload: str) -> ResearchRequest:
    """The task of a `start` frame, or a RequestError saying exactly what is wrong with it."""
    try:
        body = json.loads(payload)
    except json.JSONDecodeError as error:
        raise RequestError(f"invalid JSON after start: {error.msg} at position {error.pos}") from None
    except RecursionError:
        raise RequestError("invalid JSON after start: nested too deeply") from None
    if not isinstance(body, dict):
        raise RequestError(f"start expects a JSON object, got {type(body).__name__}")
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        # "\ud800" is valid JSON but no text: it would fail later, in storage or in a reply
        raise RequestError(
            "invalid JSON after start: a \\u escape encodes a lone surrogate, which is not text"
        ) from None
    try:
        return ResearchRequest.model_validate(body)
    except ValidationError as error:
        raise RequestError(validation_message(error)) from None


class ResearchSocket:
    """One client connection: at most one task at a time, cancelled when the socket closes."""

    def __init__(self, ws: web.WebSocketResponse, app: web.Application, principal: Principal) -> None:
        self.ws = ws
        self.app = app
        self.principal = principal
        self.task: asyncio.Task[None] | None = None
        self.chat_session: ChatSession | None = None

    async def send(self, frame: dict[str, Any]) -> None:
        if self.ws.closed:
            return
        with contextlib.suppress(ConnectionError, aiohttp.ClientConnectionResetError):
            await self.ws.send_str(json.dumps(frame, ensure_ascii=False))

    async def log_event(self, event: ProgressEvent) -> None:
        await self.send({"type": "logs", "content": event.step, "output": event.output, "metadata": event.metadata})

    async def error(self, message: str, metadata: dict[str, Any] | None = None) -> None:
        # GPT-Researcher's page shows only logs frames, so every error is said both ways.
        await self.send({"type": "error", "content": "error", "output": message})
        await self.send({"type": "logs", "content": "error", "output": message, "metadata": metadata})

    async def on_text(self, data: str) -> None:
        limit = self.app[SETTINGS].max_frame_bytes
        if len(data) > limit and len(data.encode()) > limit:
            await self.error(f"frame of {len(data.encode())} bytes exceeds MAX_FRAME_BYTES ({limit})")
            return
        text = data.strip()
        if text == "ping":
            if not self.ws.closed:
                await self.ws.send_str("pong")
        elif text.startswith("start") or text.startswith("{"):
            await self.start(text.removeprefix("start").strip())
        elif text.startswith("chat"):
            await self.chat(text.removeprefix("chat").strip())
        else:
            await self.error("Unknown command received by server: send ping, or start {json} with a task")

    async def start(self, payload: str) -> None:
        try:
            request = parse_start(payload)
            if self.task is not None and not self.task.done():
                busy = {"type": "logs", "content": "warning", "output": "Task already running. Please wait."}
                await self.send({**busy, "metadata": None})
                return
        except RequestError as error:
            await self.error(str(error))  # not a task at all: there is nothing to report on
            return
        try:
            plan = self._admit(request)
            release = await self._take_slot()
        except RequestError as error:
            await self.cannot_run(request, str(error))
            return
        self.task = asyncio.create_task(self.run(request, plan))
        self._hold_slot(self.task, release)

    async def _take_slot(self) -> Release:
        """One of this key's MAX_TASKS_PER_KEY places, taken at once (shared by every worker with Redis),
        so two sockets cannot both slip under the limit."""
        limit = self.app[SETTINGS].max_tasks_per_key
        taken = await self.app[TASK_SLOTS].take(self.principal.key_id, limit)
        if isinstance(taken, int):
            raise RequestError(
                f"{taken} tasks are already running for this API key "
                f"(MAX_TASKS_PER_KEY={limit}); wait for one to finish"
            )
        return taken

    def _hold_slot(self, task: asyncio.Task[None], release: Release) -> None:
        """Count `task` until it is done, however it ends: released by a done callback, which runs
        even for a task cancelled before its first step (a finally would not)."""
        self.app[METRICS].tasks.inc()

        def done(_: asyncio.Task[None]) -> None:
            self.app[METRICS].tasks.dec()
            release()

        task.add_done_callback(done)

    def _admit(self, request: ResearchRequest) -> Plan:
        """The plan for `request`, if this caller may run it now."""
        settings = self.app[SETTINGS]
        if len(request.task) > settings.max_task_chars:
            raise RequestError(f"task is {len(request.task)} characters; MAX_TASK_CHARS is {settings.max_task_chars}")
        bound = None if self.principal.admin else self.principal.user_id
        registry = self.app[REGISTRY]
        return plan_request(request, settings, registry, bound_user=bound)

    async def run(self, request: ResearchRequest, plan: Plan) -> None:
        settings = self.app[SETTINGS]
        try:
            async with asyncio.timeout(settings.task_timeout_s):
                owner = self.principal.user_id or plan.options.user_id
                registry, deps = self.app[REGISTRY], self.app[DEPS]
                outcome = await run_research(
                    request, plan, registry, deps, self.log_event, self.send_report, owner=owner
                )
        except TimeoutError:
            late = f"the task did not finish within {settings.task_timeout_s:g} s (TASK_TIMEOUT_S)"
            await self.cannot_run(request, late)
            return
        except Exception:
            log.exception("research task failed")
            await self.cannot_run(request, "internal error while running the task; the server log has the details")
            return
        self.chat_session = ChatSession(request, plan, outcome)
        saved = f"📄 Report saved with {len(outcome.references)} references"
        await self.deliver(outcome.markdown, outcome.files, saved, streamed=outcome.streamed)

    async def send_report(self, chunk: str) -> None:
        await self.send({"type": "report", "output": chunk})

    async def deliver(self, markdown: str, saved: dict[str, str], message: str, streamed: bool = False) -> None:
        for chunk in [] if streamed else report_chunks(markdown):
            await self.send_report(chunk)
        files = {kind: f"reports/{name}" for kind, name in saved.items()}
        await self.log_event(ProgressEvent("report_written", message, {"files": files}))
        await self.send({"type": "path", "output": files})

    async def cannot_run(self, request: ResearchRequest, reason: str) -> None:
        """A task that cannot run ends as a finished one does on GPT-Researcher's page: the error,
        then a short report saying why, then `path`, so no client is left waiting."""
        await self.error(reason, {"then": "report"})  # a report and `path` follow
        markdown = f"# {request.task}\n\nThis research could not run: {reason}\n"
        report_id = uuid.uuid4().hex
        owner = self.principal.user_id or request.header("user_id") or self.app[SETTINGS].default_user
        record = {"owner": owner, "id": report_id, "question": request.task, "error": reason, "report": markdown}
        saved = await asyncio.to_thread(save_report, self.app[SETTINGS].reports_dir, report_id, markdown, record)
        await self.deliver(markdown, saved, "📄 Report saved: the research could not run")

    async def chat(self, payload: str) -> None:
        """GPT-Researcher's chat: answered from the last report's evidence, searching again if needed."""
        try:
            body = json.loads(payload) if payload else {}
        except json.JSONDecodeError as error:
            await self.error(f"invalid JSON after chat: {error.msg} at position {error.pos}")
            return
        message = body.get("message") if isinstance(body, dict) else None
        if not isinstance(message, str) or not message.strip():
            await self.error('chat expects {"message": "..."}')
            return
        if self.chat_session is None:
            content = "Ask a research question first; then chat about its report here."
            await self.send({"type": "chat", "content": content, "role": "assistant", "metadata": None})
            return
        answer = await self.chat_session.answer(message.strip(), self.app[REGISTRY], self.app[DEPS])
        await self.send({"type": "chat", "content": answer.content, "role": "assistant", "metadata": answer.metadata})

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
    principal = principal_of(request)
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
