"""A fake OpenAI-compatible chat endpoint on 127.0.0.1: `POST /v1/chat/completions` streamed as OpenAI
streams it (Server-Sent Events: `data: {chat.completion.chunk}` lines, each choice's text in
`choices[0].delta.content`, a last chunk with `finish_reason`, then `data: [DONE]`), or, when the
request does not ask for `stream`, one `chat.completion` object (`choices[0].message.content`,
`finish_reason`, `usage`); errors as OpenAI sends them (`{"error": {"message", "type", "param",
"code"}}` with the status), scripted per request."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Answer:
    """One scripted answer: the text pieces to stream, or an HTTP error status."""

    pieces: list[str] = field(default_factory=list)
    status: int = 200
    stall_after: int | None = None  # stop sending (but keep the connection open) after this many pieces
    malformed_after: int | None = None  # send a line that is not JSON after this many pieces
    piece_delay_s: float = 0.0  # a pause before each piece: a slow model
    retry_after: str | None = None


Script = Callable[[dict[str, Any]], Answer]


def passages_of(body: dict[str, Any]) -> dict[int, str]:
    """The numbered passages the writer sent, as the model reads them."""
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    return {int(n): text for n, text in re.findall(r"^\[(\d+)\] (.+)$", user, re.MULTILINE)}


def number_of(body: dict[str, Any], words: str) -> int:
    """The number of the passage that contains `words`."""
    return next(n for n, text in passages_of(body).items() if words.lower() in text.lower())


def _chunk(model: str, delta: dict[str, Any], finish: str | None = None) -> str:
    chunk = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": None,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    return f"data: {json.dumps(chunk)}\n\n"


class FakeOpenAI:
    def __init__(self) -> None:
        self.script: list[Script] = []
        self.requests: list[dict[str, Any]] = []
        self.authorization: list[str | None] = []
        self.peers: list[tuple[str, int]] = []  # the client's address of each request: one per connection
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> FakeOpenAI:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.completions)
        self.runner = web.AppRunner(app, handler_cancellation=True)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/v1"
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.authorization.append(request.headers.get("Authorization"))
        self.peers.append(request.transport.get_extra_info("peername") if request.transport else ("", 0))
        script = self.script[min(len(self.requests), len(self.script)) - 1]
        answer = script(body)
        if answer.status != 200:
            message = f"fake error {answer.status}"
            if answer.status == 401:  # OpenAI names the key it refused (masked; a local server may not mask it)
                key = (request.headers.get("Authorization") or "").removeprefix("Bearer ")
                message = f"Incorrect API key provided: {key}."
            error = {"message": message, "type": "server_error", "param": None, "code": None}
            headers = {"retry-after": answer.retry_after} if answer.retry_after else None
            return web.json_response({"error": error}, status=answer.status, headers=headers)
        if not body.get("stream"):
            return await self._whole(body["model"], answer)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        model = body["model"]
        await response.write(_chunk(model, {"role": "assistant", "content": ""}).encode())
        for index, piece in enumerate(answer.pieces):
            if answer.piece_delay_s:
                await asyncio.sleep(answer.piece_delay_s)
            if answer.stall_after == index:
                await asyncio.sleep(3600)
            if answer.malformed_after == index:
                await response.write(b'data: {"id": "chatcmpl-fake", "choices": [{"delta": \n\n')
            await response.write(_chunk(model, {"content": piece}).encode())
        await response.write(_chunk(model, {}, "stop").encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    async def _whole(self, model: str, answer: Answer) -> web.Response:
        """A non-streamed answer: stalling sends nothing at all, malformed sends a body that is not JSON."""
        if answer.stall_after is not None:
            await asyncio.sleep(3600)
        if answer.malformed_after is not None:
            return web.Response(
                text='{"id": "chatcmpl-fake", "choices": [{"message": ', content_type="application/json"
            )
        text = "".join(answer.pieces)
        return web.json_response(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "system_fingerprint": None,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text, "refusal": None},
                        "logprobs": None,
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 100, "completion_tokens": len(text.split()), "total_tokens": 100},
            }
        )
