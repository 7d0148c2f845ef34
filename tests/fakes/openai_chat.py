"""A fake OpenAI-compatible chat endpoint on 127.0.0.1: `POST /v1/chat/completions` streamed as OpenAI
streams it (Server-Sent Events: `data: {chat.completion.chunk}` lines, each choice's text in
`choices[0].delta.content`, a last chunk with `finish_reason`, then `data: [DONE]`), or, when the
request does not ask for `stream`, one `chat.completion` object (`choices[0].message.content`,
`finish_reason`, `usage`); errors as OpenAI sends them (`{"error": {"message", "type", "param",
"code"}}` with the status), scripted per request.

With `context_tokens`, it holds a model's context as servers do: it counts a request's tokens with a
tokenizer of its own (`server_tokens`: as a 32k-piece BPE vocabulary splits text, which is not how
the writer counts) and refuses one whose prompt and `max_tokens` together exceed the context with
HTTP 400, worded as OpenAI, vLLM or llama.cpp word it (`context_error`); llama.cpp checks the
prompt alone. An answer stops at `max_tokens` with `finish_reason: "length"`, as a model's does
(unless `keeps_max_tokens` is False: a misbehaving server's endless stream)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

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
    cut: bool = False  # stopped at max_tokens


def _within(answer: Answer, max_tokens: int | None) -> Answer:
    """The answer as a model writes it under `max_tokens`: stopped where its tokens run out."""
    if max_tokens is None or answer.status != 200:
        return answer
    pieces, left = [], max_tokens
    for piece in answer.pieces:
        if server_tokens(piece) <= left:
            pieces.append(piece)
            left -= server_tokens(piece)
            continue
        low, high = 0, len(piece)  # the longest start of the piece within what is left
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if server_tokens(piece[:middle]) <= left else (low, middle - 1)
        pieces.append(piece[:low])
        return Answer(pieces, answer.status, answer.stall_after, answer.malformed_after, answer.piece_delay_s, cut=True)
    return answer


Script = Callable[[dict[str, Any]], Answer]


@dataclass
class Heard:
    """What a writer under test streamed (`send`) and said of its progress (`emit`)."""

    frames: list[str] = field(default_factory=list)
    events: list[Any] = field(default_factory=list)

    async def send(self, chunk: str) -> None:
        self.frames.append(chunk)

    async def emit(self, event: Any) -> None:
        self.events.append(event)


ContextError = Literal["openai", "vllm", "llamacpp"]

# a 32k-piece BPE vocabulary (Llama 2's, Mistral's), roughly: a word a piece per 4 letters with the space
# before it, a digit, a CJK character or a punctuation mark a piece each, a line break or other spacing one
_SERVER_PIECES = re.compile(r" ?[A-Za-z]+|\s+|.", re.DOTALL)
_TEMPLATE_TOKENS = 4  # a chat template's markers around each message ("<|im_start|>user\n … <|im_end|>")


def server_tokens(text: str) -> int:
    return sum(
        -(-len(p.lstrip(" ")) // 4) if p[-1].isascii() and p[-1].isalpha() else 1 for p in _SERVER_PIECES.findall(text)
    )


def prompt_tokens(body: dict[str, Any]) -> int:
    """A request's prompt as the server counts it: each message's text and its template's markers."""
    return 3 + sum(_TEMPLATE_TOKENS + server_tokens(str(m.get("content") or "")) for m in body["messages"])


def context_exceeded(style: ContextError, limit: int, prompt: int, completion: int) -> dict[str, Any]:
    """How each server says a request is longer than its context (HTTP 400)."""
    if style == "llamacpp":
        message = f"request ({prompt} tokens) exceeds the available context size ({limit} tokens), try increasing it"
        return {
            "error": {
                "code": 400,
                "message": message,
                "type": "exceed_context_size_error",
                "n_prompt_tokens": prompt,
                "n_ctx": limit,
            }
        }
    message = (
        f"This model's maximum context length is {limit} tokens. However, you requested {prompt + completion} "
        f"tokens ({prompt} in the messages, {completion} in the completion). Please reduce the length of the "
        "messages or completion."
    )
    if style == "vllm":
        return {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


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
    def __init__(
        self, context_tokens: int | None = None, context_error: ContextError = "openai", keeps_max_tokens: bool = True
    ) -> None:
        self.context_tokens = context_tokens
        self.context_error: ContextError = context_error
        self.keeps_max_tokens = keeps_max_tokens  # False: a server that streams on past max_tokens
        self.prompts: list[int] = []  # each request's prompt in tokens, as counted here
        self.refused: list[int] = []  # the requests (by index) refused as longer than the context
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
        prompt, completion = prompt_tokens(body), body.get("max_tokens") or 0
        self.prompts.append(prompt)
        limit = self.context_tokens
        if limit is not None and prompt + (0 if self.context_error == "llamacpp" else completion) > limit:
            self.refused.append(len(self.requests) - 1)
            return web.json_response(context_exceeded(self.context_error, limit, prompt, completion), status=400)
        script = self.script[min(len(self.requests), len(self.script)) - 1]
        answer = script(body)
        if self.keeps_max_tokens:
            answer = _within(answer, body.get("max_tokens"))
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
        await response.write(_chunk(model, {}, "length" if answer.cut else "stop").encode())
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
                        "finish_reason": "length" if answer.cut else "stop",
                    }
                ],
                "usage": {"prompt_tokens": 100, "completion_tokens": len(text.split()), "total_tokens": 100},
            }
        )


_FIRST_SENTENCE = re.compile(r"^(?:\([^)]*\) )?(.+?(?:[.!?](?=\s|$)|[。！？]))")


def first_sentence(text: str) -> str:
    """A passage's first sentence with its stop, its title (in brackets before it) left out."""
    found = _FIRST_SENTENCE.match(text)
    return found.group(1) if found else text


def cited(sentence: str, number: int) -> str:
    """A sentence with its marker before its stop, as models write it: "… ranks [2]." ("…排序[2]。")."""
    body = sentence.rstrip(".!?。！？")
    stop = sentence[len(body) :] or "."
    return f"{body}[{number}]{stop}" if stop in "。！？" else f"{body} [{number}]{stop}"


def is_summing(body: dict[str, Any]) -> bool:
    """Whether the writer asks for a section that sums the others up (from their drafts)."""
    return "Drafts of the report's sections" in body["messages"][-1]["content"]


def drafts_of(body: dict[str, Any]) -> dict[str, list[str]]:
    """The drafts a summing request holds: each section's title and its sentences, markers kept."""
    user = body["messages"][-1]["content"]
    found: dict[str, list[str]] = {}
    for block in user.split("\n\n### ")[1:] if "\n\n### " in user else []:
        title, _, text = block.partition("\n")
        found[title] = re.findall(r"[^.!?。！？]+[.!?。！？](?: ?\[\d+\])+", text)
    return found


def faithful(body: dict[str, Any]) -> Answer:
    """A model that writes what it is given, citing it: a section, the first sentences of its first
    passages (a list when asked for points); a summing section, each draft's first sentence."""
    if is_summing(body):
        sentences = [said[0].strip() for said in drafts_of(body).values() if said]
        return Answer(pieces=[" ".join(sentences[:4])])
    passages = list(passages_of(body).items())[:4]
    said = [cited(first_sentence(text), n) for n, text in passages]
    if "as a list only" in body["messages"][0]["content"]:
        return Answer(pieces=["\n".join(f"- {sentence}" for sentence in said)])
    return Answer(pieces=[" ".join(said[:2]), "\n\n", " ".join(said[2:])])
