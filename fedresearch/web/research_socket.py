"""GPT-Researcher's WebSocket protocol at /ws: text frames in, a task run, progress and the report out.

Only transport lives here: a frame becomes a `ResearchRequest`, which runs as a job (`tasks.py`);
the socket sends the job's frames as the job store hands them over, so a socket that resumes a job
gets the same frames, in the same order, as the one that started it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import aiohttp
from aiohttp import web
from pydantic import ValidationError

from fedresearch.core.auth import Principal
from fedresearch.core.errors import RequestError
from fedresearch.core.events import ProgressStep
from fedresearch.core.models import ResearchRequest
from fedresearch.jobs.frames import ChatFrame, Frame, LogsFrame, PathFrame, error_frames
from fedresearch.jobs.runs import chat_plan, start_job
from fedresearch.jobs.runtime import LiveJob
from fedresearch.jobs.store import JobStatus, follow, may_see
from fedresearch.report.chat import ChatSession, session_from_report
from fedresearch.web.auth import principal_of, validation_message
from fedresearch.web.keys import METRICS, RUNTIME, SETTINGS, SOCKETS

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
    """One client connection: it follows at most one job at a time. A job it started is cancelled when
    the socket closes, unless it was started with `"detach": true`; `resume` follows a job again."""

    def __init__(self, ws: web.WebSocketResponse, app: web.Application, principal: Principal) -> None:
        self.ws = ws
        self.app = app
        self.principal = principal
        self.following: asyncio.Task[None] | None = None
        self.owned: LiveJob | None = None  # the job this socket started, if it dies with the socket
        self.chat_session: ChatSession | None = None
        # a job followed to its end whose chat session lives in no memory here (it ran on another
        # worker or host, or ended before `resume`): the session is made from its saved report
        self.chat_about: str | None = None
        self.answering: asyncio.Future[None] | None = None  # done once the last chat's answer is sent

    async def send(self, frame: Frame) -> None:
        if self.ws.closed:
            return
        with contextlib.suppress(ConnectionError, aiohttp.ClientConnectionResetError):
            await self.ws.send_str(frame.text)

    async def error(self, message: str, metadata: dict[str, Any] | None = None) -> None:
        for frame in error_frames(message, metadata):
            await self.send(frame)

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
        elif text.startswith("resume"):
            await self.resume(text.removeprefix("resume").strip())
        elif text.startswith("chat"):
            await self.chat(text.removeprefix("chat").strip())
        else:
            await self.error("Unknown command received by server: send ping, start {json} with a task, or resume")

    @property
    def busy(self) -> bool:
        return self.following is not None and not self.following.done()

    async def _refuse_when_busy(self) -> bool:
        if self.busy:
            await self.send(LogsFrame(content=ProgressStep.warning, output="Task already running. Please wait."))
        return self.busy

    async def start(self, payload: str) -> None:
        try:
            request = parse_start(payload)
        except RequestError as error:
            await self.error(str(error))  # not a task at all: there is nothing to report on
            return
        if await self._refuse_when_busy():
            return
        run, live = await start_job(self.app[RUNTIME], self.principal, request, "websocket", request.detach)
        self.owned = None if request.detach else live
        self._follow(run.research_id, live)

    async def _text_field(self, command: str, payload: str, name: str) -> str | None:
        """The non-blank string `name` of a command's JSON object; else an error frame and None."""
        try:
            body = json.loads(payload) if payload else {}
        except json.JSONDecodeError as error:
            await self.error(f"invalid JSON after {command}: {error.msg} at position {error.pos}")
            return None
        value = body.get(name) if isinstance(body, dict) else None
        if not isinstance(value, str) or not value.strip():
            await self.error(f'{command} expects {{"{name}": "..."}}')
            return None
        return value

    async def resume(self, payload: str) -> None:
        """`resume {"research_id": ...}`: every frame of that job so far, in order, then the rest live."""
        research_id = await self._text_field("resume", payload, "research_id")
        if research_id is None:
            return
        job = await self.app[RUNTIME].jobs.get(research_id.strip())
        if job is None or not may_see(self.principal, job):
            # another user's job is "not found", like a missing one: ids must not be probed
            await self.error(f"no job {research_id.strip()[:64]!r} for this API key (unknown, expired or not yours)")
            return
        if await self._refuse_when_busy():
            return
        self._follow(job.research_id, self.app[RUNTIME].live.get(job.research_id))

    def _follow(self, research_id: str, live: LiveJob | None) -> None:
        self.chat_session, self.chat_about = None, None
        self.following = asyncio.create_task(self._pump(research_id, live))

    async def _pump(self, research_id: str, live: LiveJob | None) -> None:
        # `path` is a job's last frame: a client may send its next task the moment it reads it, so
        # the socket is free from then on: not after asking the job's store (Redis, for a job run by
        # another worker) whether anything follows, nor after `path`'s send resumes, which waits
        # for a full send buffer (a long report to a slow reader) to drain, and so may resume after
        # the client has read `path` and sent its next task. Its bytes are in the buffer before
        # that wait, so the next job's frames still follow it.
        async with contextlib.aclosing(follow(self.app[RUNTIME].jobs, research_id)) as frames:
            async for frame in frames:
                if isinstance(frame, PathFrame):
                    self.following = None
                    self._chat_after(research_id, live)
                    await self.send(frame)
                    return
                await self.send(frame)
        self._chat_after(research_id, live)

    def _chat_after(self, research_id: str, live: LiveJob | None) -> None:
        self.chat_session = live.chat if live is not None else None
        self.chat_about = research_id if self.chat_session is None else None

    async def _saved_chat(self, research_id: str) -> ChatSession | None:
        """A chat session about a completed job's saved report, wherever it was written."""
        job = await self.app[RUNTIME].jobs.get(research_id)
        if job is None or job.status is not JobStatus.completed or not may_see(self.principal, job):
            return None
        markdown = await self.app[RUNTIME].reports().markdown(research_id)
        if markdown is None:
            return None
        owner = job.owner or self.app[SETTINGS].default_user
        plan = chat_plan(self.app[RUNTIME], self.principal, owner, job.task, job.scope)
        return session_from_report(markdown, ResearchRequest(task=job.task[:2000]), plan, self.app[RUNTIME].deps)

    async def chat(self, payload: str) -> None:
        """GPT-Researcher's chat: answered from the last report's evidence, searching again if needed."""
        message = await self._text_field("chat", payload, "message")
        if message is None:
            return
        answering = self.answering = asyncio.get_running_loop().create_future()  # a stop waits for it
        try:
            await self._answer(message.strip())
        finally:
            answering.set_result(None)

    async def _answer(self, message: str) -> None:
        if self.chat_session is None and self.chat_about is not None:
            self.chat_session = await self._saved_chat(self.chat_about)
        if self.chat_session is None:
            content = "Ask a research question first; then chat about its report here."
            await self.send(ChatFrame(content=content))
            return
        answer = await self.chat_session.answer(message, self.app[RUNTIME].tools)
        await self.send(ChatFrame(content=answer.content, metadata=answer.metadata))

    async def drain(self, grace_s: float) -> None:
        under_way = {work for work in (self.following, self.answering) if work is not None and not work.done()}
        if under_way:
            await asyncio.wait(under_way, timeout=grace_s)
        if not self.busy:
            await self.shut_down()

    async def shut_down(self) -> None:
        """The server is stopping: say so, stop the task, close with 1001 (going away)."""
        if self.busy:
            await self.error("the server is shutting down; the running task was stopped, please retry later")
        await self.close()
        await self.ws.close(code=aiohttp.WSCloseCode.GOING_AWAY, message=b"server shutting down")

    async def close(self) -> None:
        """Stop sending; cancel the job this socket started unless it was detached."""
        owned, self.owned = self.owned, None
        if owned is not None and not owned.task.done():
            owned.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await owned.task
        if self.following is not None and not self.following.done():
            self.following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.following


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
                try:
                    await socket.on_text(message.data)
                except Exception:  # a bug met by one frame must not drop the socket and the job it follows
                    log.exception("handling a frame on /ws failed")
                    await socket.error("internal error while handling this frame; the server log has the details")
            elif message.type == aiohttp.WSMsgType.BINARY:
                await socket.error("binary frames are not supported: send text frames")
    finally:
        request.app[SOCKETS].discard(socket)
        await socket.close()
        request.app[METRICS].sockets.dec()
    return ws
