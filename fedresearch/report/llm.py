"""The LLM writer's model side: numbered passages in, streamed paragraphs of cited prose out.

Any OpenAI-compatible chat endpoint (OpenAI, vLLM, Ollama, llama.cpp) through the official `openai`
SDK: plain chat completions, streamed; no tool calling, no JSON mode. `<think>` blocks are removed
as the text streams (a tag may arrive split across chunks); a stream that sends nothing for
`LLM_TIMEOUT_S` is a failure, as is an answer with no text.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fedresearch.core.settings import Settings, secret
from fedresearch.report.evidence import Evidence

if TYPE_CHECKING:  # the SDK is imported by the first client made: a server without a model never
    # loads it (13 MB a worker)
    from openai import AsyncOpenAI
    from openai.types.chat import ChatCompletionMessageParam

_OPEN, _CLOSE = "<think>", "</think>"
_PASSAGE_CHARS = 900
_ENDINGS = ("## references", "## sources", "references:", "sources:", "## 参考", "## bibliography")


class WriterFailure(Exception):
    """The model gave no usable report; the message says why (it never carries a key)."""


@dataclass(frozen=True)
class LlmConfig:
    base_url: str
    api_key: str
    model: str
    timeout_s: float
    max_retries: int
    clients: LlmClients | None = field(default=None, compare=False, repr=False)  # None: a client per call
    max_answer_chars: int = 200_000  # LLM_MAX_ANSWER_CHARS: a report's answer, thinking included


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
        raise WriterFailure(failure_reason(error, config)) from error


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
    )
    return config, note


def seen_text(passage: Evidence) -> str:
    """The passage as the model is shown it (and as its sentences are checked against)."""
    return " ".join(passage.text.split())[:_PASSAGE_CHARS]


def numbered_passages(passages: Sequence[Evidence]) -> str:
    lines = []
    for number, passage in enumerate(passages, start=1):
        title = " ".join(passage.source.title.split())[:160]
        text = seen_text(passage)
        lines.append(f"[{number}] ({title}) {text}" if title else f"[{number}] {text}")
    return "\n\n".join(lines)


def messages_for(
    question: str, passages: Sequence[Evidence], language: str, shape: str
) -> list[ChatCompletionMessageParam]:
    """The model's instructions and evidence; `shape` is what its report type asks for (types.py)."""
    system = (
        "You write research reports using only the numbered evidence passages you are given. "
        "End every sentence that states a fact with the marker of each passage that states it, "
        "exactly as numbered, e.g. [2] or [1][3]. Never cite a number that is not listed; never add "
        "facts, figures or names the passages do not state; if the passages do not answer something, say so. "
        f"Write {shape}. No title, no reference list, no URLs. Separate paragraphs with a blank line. "
        f"Write in {language}."
    )
    user = f"Question: {question}\n\nEvidence passages:\n\n{numbered_passages(passages)}"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


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
    """Streamed text cut at blank lines; a heading line is a paragraph of its own. Linear in the
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
    prose: list[str] = []
    for line in block.strip().splitlines():
        if line.lstrip().startswith("#"):
            if prose:
                pieces.append(" ".join(prose))
                prose = []
            pieces.append(line.strip())
        elif line.strip():
            prose.append(line.strip())
    if prose:
        pieces.append(" ".join(prose))
    return pieces


async def complete(config: LlmConfig, messages: list[ChatCompletionMessageParam]) -> str:
    """The model's whole answer, not streamed (short answers: plans), within `LLM_TIMEOUT_S` in all,
    retries included; WriterFailure when it is late or empty."""
    async with _client(config) as client:
        try:
            async with asyncio.timeout(config.timeout_s):
                with _model_failures(config):
                    response = await client.chat.completions.create(
                        model=config.model, messages=messages, temperature=0.2
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
    return reason.replace(config.api_key, "[LLM_API_KEY]")


async def stream_paragraphs(
    config: LlmConfig, messages: list[ChatCompletionMessageParam], deadline: float | None = None
) -> AsyncIterator[str]:
    """The model's answer, paragraph by paragraph, thinking removed; WriterFailure when it fails, and
    when it runs past `deadline` (time.monotonic(): when the report is due, so that the extractive
    writer can still finish it) or past LLM_MAX_ANSWER_CHARS."""
    thinking, paragraphs, produced, received = ThinkFilter(), Paragraphs(), False, 0
    async with _client(config) as client:
        with _model_failures(config):
            stream = await client.chat.completions.create(
                model=config.model,
                messages=messages,
                stream=True,
                temperature=0.2,
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
                if content is not None and not isinstance(content, str):
                    raise WriterFailure("the model sent a malformed chunk (content is not text)")
                received += len(content or "")
                if received > config.max_answer_chars:
                    raise WriterFailure(f"the model's answer ran past {config.max_answer_chars:,} characters")
                for paragraph in paragraphs.feed(thinking.feed(content or "")):
                    produced = True
                    yield paragraph
    for paragraph in paragraphs.feed(thinking.close()) + paragraphs.close():
        produced = True
        yield paragraph
    if not produced:
        raise WriterFailure("the model's answer was empty")
