"""The LLM writer's model side: a request in, streamed paragraphs of cited prose (or a whole short
answer) out.

Any OpenAI-compatible chat endpoint (OpenAI, vLLM, Ollama, llama.cpp) through the official `openai`
SDK: plain chat completions, streamed; no tool calling, no JSON mode. Every request fits its
`Budget` (report/tokens.py: LLM_CONTEXT_TOKENS, prompt and `max_tokens` together) or is not sent; a
server that answers that the context is exceeded raises `ContextExceeded`, saying its own context
where it does. `<think>` blocks are removed as the text streams (a tag may arrive split across
chunks); a stream that sends nothing for `LLM_TIMEOUT_S` is a failure, as is an answer with no text;
an answer stopped at `max_tokens` loses its unfinished last sentence.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fedresearch.core.settings import Settings, secret
from fedresearch.report.tokens import Budget, message_tokens

if TYPE_CHECKING:  # the SDK is imported by the first client made: a server without a model never
    # loads it (13 MB a worker)
    from openai import AsyncOpenAI
    from openai.types.chat import ChatCompletionMessageParam

_OPEN, _CLOSE = "<think>", "</think>"
_ENDINGS = ("## references", "## sources", "references:", "sources:", "## 参考", "## bibliography")


class WriterFailure(Exception):
    """The model gave no usable report; the message says why (it never carries a key)."""


class ContextExceeded(WriterFailure):
    """The server refused a request as longer than its context: `limit`, the context it said it has
    (None where it did not say)."""

    def __init__(self, reason: str, limit: int | None) -> None:
        super().__init__(reason)
        self.limit = limit


# how servers refuse a request longer than their context (HTTP 400): OpenAI's and vLLM's "This model's
# maximum context length is 8192 tokens. However, you requested 9000 tokens (…)", OpenAI's code
# context_length_exceeded; llama.cpp's "request (9000 tokens) exceeds the available context size
# (8192 tokens)", type exceed_context_size_error, with n_ctx
_CONTEXT_SAID = ("context_length_exceeded", "maximum context length", "exceed_context_size", "context size")
_CONTEXT_LIMIT = re.compile(
    r"maximum context length is (\d+)|available context size \((\d+)|'n_ctx': (\d+)|\"n_ctx\": ?(\d+)"
)
# the end of a sentence, its citation markers included: where an answer cut at max_tokens is cut back to
_SENTENCE_END = re.compile(r"[.!?。！？](?:\s*\[\d+(?:\s*[,;]\s*\d+)*\])*")
# a line of a Markdown list: "- ", "* ", "+ ", "• ", "1. ", "2) "
_LIST_ITEM = re.compile(r"^\s*(?:[-*+•]|\d{1,2}[.)])\s+(?=\S)")


@dataclass(frozen=True)
class LlmConfig:
    base_url: str
    api_key: str
    model: str
    timeout_s: float
    max_retries: int
    clients: LlmClients | None = field(default=None, compare=False, repr=False)  # None: a client per call
    max_answer_chars: int = 200_000  # LLM_MAX_ANSWER_CHARS: a report's answer, thinking included
    context_tokens: int = 8192  # LLM_CONTEXT_TOKENS: what one request may hold, prompt and answer

    @property
    def budget(self) -> Budget:
        return Budget.of(self.context_tokens)


class LlmClients:
    """The app's clients of model endpoints, one per endpoint and key, made when first asked for
    and kept. Making one builds an SSL context (52 ms of the event loop on this VM, for a plain
    HTTP endpoint too) and it opens connections of its own: with a client per call, each research
    task with a model held every other socket of its worker up for that long once or twice, and
    the model server saw a new connection per call."""

    def __init__(self) -> None:
        self._made: dict[tuple[str, str, float, int], AsyncOpenAI] = {}

    def client(self, config: LlmConfig) -> AsyncOpenAI:
        key = (config.base_url, config.api_key, config.timeout_s, config.max_retries)
        made = self._made.get(key)
        if made is None:
            made = self._made[key] = _new_client(config)
        return made

    async def close(self) -> None:
        made, self._made = list(self._made.values()), {}
        for client in made:
            await client.close()


def _new_client(config: LlmConfig) -> AsyncOpenAI:
    from openai import AsyncOpenAI

    return AsyncOpenAI(
        base_url=config.base_url, api_key=config.api_key, timeout=config.timeout_s, max_retries=config.max_retries
    )


@contextlib.contextmanager
def _model_failures(config: LlmConfig) -> Iterator[None]:
    """What the model endpoint or the SDK raises while it is asked (an HTTP error after the SDK's
    retries, a refused connection, a malformed stream) as a WriterFailure saying why. Only the SDK's
    calls run under it: an error of our own code is a bug, not a model failure, and is not relabelled."""
    try:
        yield
    except (WriterFailure, StopAsyncIteration):  # the latter: a stream's end, not its failure
        raise
    except Exception as error:
        said = str(error)
        if getattr(error, "status_code", None) == 400 and any(words in said.lower() for words in _CONTEXT_SAID):
            limit = next((int(n) for found in _CONTEXT_LIMIT.findall(said) for n in found if n), None)
            raise ContextExceeded(failure_reason(error, config), limit) from error
        raise WriterFailure(failure_reason(error, config)) from error


def _fitted(messages: list[ChatCompletionMessageParam], budget: Budget) -> None:
    """A request that does not fit its budget is never sent: the callers fit what they send, and
    this is where that is checked."""
    tokens = message_tokens(messages)
    if tokens > budget.prompt:
        raise WriterFailure(
            f"the request's prompt counts {tokens} tokens, over the {budget.prompt} that LLM_CONTEXT_TOKENS "
            f"({budget.context}) leaves beside the answer's {budget.answer}"
        )


@contextlib.asynccontextmanager
async def _client(config: LlmConfig) -> AsyncIterator[AsyncOpenAI]:
    with _model_failures(config):
        made = config.clients.client(config) if config.clients is not None else _new_client(config)
    if config.clients is not None:
        yield made
        return
    async with made as client:
        yield client


def llm_config(
    settings: Settings, requested: str | None, clients: LlmClients | None = None
) -> tuple[LlmConfig | None, str | None]:
    """The model to write with (None: the extractive writer) and a note when the request's choice
    was refused; its calls go through `clients` (the app's), or a client each without."""
    if not settings.llm_base_url or not settings.llm_model:
        return None, "headers.llm_model ignored: no LLM is configured (LLM_BASE_URL, LLM_MODEL)" if requested else None
    model, note = settings.llm_model, None
    if requested and requested != model:
        if requested in settings.llm_allowed_models:
            model = requested
        else:
            allowed = ", ".join([settings.llm_model, *settings.llm_allowed_models])
            note = f"headers.llm_model {requested!r} is not allowed here (LLM_ALLOWED_MODELS: {allowed}); using {model}"
    key = secret(settings.llm_api_key) or "not-needed"  # local servers take none; the SDK requires one
    config = LlmConfig(
        settings.llm_base_url,
        key,
        model,
        settings.llm_timeout_s,
        settings.llm_max_retries,
        clients,
        settings.llm_max_answer_chars,
        settings.llm_context_tokens,
    )
    return config, note


class ThinkFilter:
    """Removes `<think>…</think>` from streamed text, tags split across chunks included."""

    def __init__(self) -> None:
        self.inside = False
        self.pending = ""

    def feed(self, text: str) -> str:
        self.pending += text
        out = []
        while self.pending:
            tag = _CLOSE if self.inside else _OPEN
            at = self.pending.find(tag)
            if at >= 0:
                if not self.inside:
                    out.append(self.pending[:at])
                self.pending = self.pending[at + len(tag) :]
                self.inside = not self.inside
                continue
            keep = _partial_tag(self.pending, tag)  # the start of a tag still arriving
            if not self.inside:
                out.append(self.pending[: len(self.pending) - keep])
            self.pending = self.pending[len(self.pending) - keep :]
            break
        return "".join(out)

    def close(self) -> str:
        rest, self.pending = ("" if self.inside else self.pending), ""
        return rest


def _partial_tag(text: str, tag: str) -> int:
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


class Paragraphs:
    """Streamed text cut at blank lines; a heading line is a paragraph of its own, and the lines of a
    list stay lines (each item's own, its indent kept; a line that continues an item joins it). Linear in the
    text however it is cut: a piece is looked at once, and the pieces of a paragraph are joined once,
    when it ends (a buffer scanned again at every piece took 43 s for a 10 MB answer)."""

    def __init__(self) -> None:
        self._open: list[str] = []  # the text since the last blank line, in the pieces it came in
        self._open_ends_in_newline = False  # a blank line may straddle two pieces
        self.ended = False  # the model started its own reference list: the rest is not report

    def feed(self, text: str) -> list[str]:
        if self.ended or not text:
            return []
        if "\n\n" not in text and not (self._open_ends_in_newline and text.startswith("\n")):
            self._open.append(text)
            self._open_ends_in_newline = text.endswith("\n")
            return []
        *blocks, rest = ("".join(self._open) + text).split("\n\n")
        self._open, self._open_ends_in_newline = [rest], rest.endswith("\n")
        done: list[str] = []
        for block in blocks:
            done.extend(self._accept(block))
            if self._stopped():  # the model's own reference list began: the rest is not report
                break
        return done

    def _stopped(self) -> bool:
        return self.ended

    def close(self) -> list[str]:
        block, self._open = "".join(self._open), []
        return [] if self.ended else self._accept(block)

    def _accept(self, block: str) -> list[str]:
        out = []
        for piece in _split_headings(block):
            if piece.lower().lstrip("#* ").startswith(tuple(e.lstrip("# ") for e in _ENDINGS)) and (
                piece.startswith("#") or piece.rstrip().endswith(":")
            ):
                self.ended = True
                break
            out.append(piece)
        return out


def _split_headings(block: str) -> list[str]:
    pieces: list[str] = []
    lines: list[str] = []  # the paragraph's lines: one of prose, or a list's items
    for line in block.strip("\n").splitlines():
        if line.lstrip().startswith("#"):
            if lines:
                pieces.append("\n".join(lines))
                lines = []
            pieces.append(line.strip())
        elif _LIST_ITEM.match(line):
            lines.append(line.rstrip())
        elif line.strip():
            if lines:
                lines[-1] += " " + line.strip()
            else:
                lines.append(line.strip())
    if lines:
        pieces.append("\n".join(lines))
    return pieces


def is_list(paragraph: str) -> bool:
    """Whether a paragraph of `Paragraphs` is a list (each line an item)."""
    return _LIST_ITEM.match(paragraph) is not None


def item_text(line: str) -> str:
    """A line of a list without its marker (the line itself when it has none)."""
    return _LIST_ITEM.sub("", line, count=1).strip()


def whole_sentences(paragraph: str) -> str:
    """The paragraph up to the end of its last whole sentence (its markers kept): what stays of an
    answer the server stopped at `max_tokens` mid-sentence."""
    ends = list(_SENTENCE_END.finditer(paragraph))
    if not ends:
        return ""
    return paragraph[: ends[-1].end()]


async def complete(config: LlmConfig, messages: list[ChatCompletionMessageParam], budget: Budget | None = None) -> str:
    """The model's whole answer, not streamed (short answers: plans), within `LLM_TIMEOUT_S` in all,
    retries included; WriterFailure when it is late or empty, or when the request does not fit
    `budget` (the config's by default)."""
    budget = budget or config.budget
    _fitted(messages, budget)
    async with _client(config) as client:
        try:
            async with asyncio.timeout(config.timeout_s):
                with _model_failures(config):
                    response = await client.chat.completions.create(
                        model=config.model, messages=messages, temperature=0.2, max_tokens=budget.answer
                    )
        except TimeoutError:
            raise WriterFailure(f"the model did not answer within {config.timeout_s:g} s") from None
    content = response.choices[0].message.content if response.choices else None
    if not isinstance(content, str) or not content.strip():
        raise WriterFailure("the model's answer was empty")
    return content


def failure_reason(error: BaseException, config: LlmConfig) -> str:
    """Why the model failed, in words a reader can act on, the key masked should a server echo it."""
    status = getattr(error, "status_code", None)
    text = " ".join(str(error).split())[:300]
    if status is not None:
        reason = f"HTTP {status} from the model endpoint: {text}"
    else:
        reason = text if isinstance(error, WriterFailure) else f"{type(error).__name__}: {text or 'no detail'}"
    return _masked(reason, config.api_key)


def _masked(text: str, key: str) -> str:
    """`text` with `key` masked where it stands as a token of its own: a short key ("k") is not
    masked inside words ("tokens"), and an empty one masks nothing."""
    if not key:
        return text
    return re.sub(rf"(?<![A-Za-z0-9_\-]){re.escape(key)}(?![A-Za-z0-9_\-])", "[LLM_API_KEY]", text)


async def stream_paragraphs(
    config: LlmConfig,
    messages: list[ChatCompletionMessageParam],
    deadline: float | None = None,
    budget: Budget | None = None,
) -> AsyncIterator[str]:
    """The model's answer, paragraph by paragraph, thinking removed; WriterFailure when it fails, and
    when it runs past `deadline` (time.monotonic(): when the report is due, so that the extractive
    writer can still finish it) or past LLM_MAX_ANSWER_CHARS, or when the request does not fit
    `budget` (the config's by default)."""
    budget = budget or config.budget
    _fitted(messages, budget)
    thinking, paragraphs, produced, received, cut = ThinkFilter(), Paragraphs(), False, 0, False
    async with _client(config) as client:
        with _model_failures(config):
            stream = await client.chat.completions.create(
                model=config.model,
                messages=messages,
                stream=True,
                temperature=0.2,
                max_tokens=budget.answer,
            )
        async with stream:  # its connection goes back to the shared client however the stream ends
            chunks = aiter(stream)
            while True:
                left = config.timeout_s if deadline is None else min(config.timeout_s, deadline - time.monotonic())
                try:
                    async with asyncio.timeout(max(0.0, left)):
                        with _model_failures(config):
                            chunk = await anext(chunks)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    if left < config.timeout_s:
                        raise WriterFailure("the model was still writing when the report was due") from None
                    raise WriterFailure(f"the model's stream stalled: nothing for {config.timeout_s:g} s") from None
                content = chunk.choices[0].delta.content if chunk.choices else None
                cut = cut or bool(chunk.choices and chunk.choices[0].finish_reason == "length")
                if content is not None and not isinstance(content, str):
                    raise WriterFailure("the model sent a malformed chunk (content is not text)")
                received += len(content or "")
                if received > config.max_answer_chars:
                    raise WriterFailure(f"the model's answer ran past {config.max_answer_chars:,} characters")
                for paragraph in paragraphs.feed(thinking.feed(content or "")):
                    produced = True
                    yield paragraph
    last = paragraphs.feed(thinking.close()) + paragraphs.close()
    if cut and last and not last[-1].startswith("#"):  # stopped at max_tokens: its last sentence unfinished
        last[-1] = whole_sentences(last[-1])
    for paragraph in filter(None, last):
        produced = True
        yield paragraph
    if not produced:
        raise WriterFailure("the model's answer was empty")
