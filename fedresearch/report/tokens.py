"""How many tokens a request to the model takes, counted without the model's tokenizer, and the
budget a request must fit: LLM_CONTEXT_TOKENS holds the prompt and the answer (`max_tokens`) together,
as vLLM and OpenAI check it (llama.cpp checks the prompt, then stops the answer at the context's end).

The endpoint may serve any model, and no tokenizer of it is at hand (tiktoken is OpenAI's, no
dependency here, and knows no local model's vocabulary), so a text is counted by what it is made of,
each piece at least what the tokenizers of common small models (Llama 2 and 3, Mistral, Qwen:
vocabularies of 32k to 150k pieces) make of it:

- a run of ASCII letters: a token per 3 letters, rounded up; a space before it is free (tokenizers
  join it to the word). English prose runs 4 to 4.5 characters a token in those vocabularies, and a
  rare or technical word splits finer ("tantivy" is 3 in Llama 2's), so prose counts 1.5 to 1.8
  times what it takes;
- a digit: a token (Llama 2 and Mistral split numbers digit by digit);
- any other character but whitespace: a token. A CJK character is one token or less in Llama 3's and
  Qwen's vocabularies; punctuation is one; a letter of another script at most one in most;
- whitespace other than a space before a word: a token a run.

What this under-counts is a character a vocabulary knows only as bytes (an emoji, a rare CJK
character in Llama 2's), 2 to 4 tokens each: the budget keeps a margin for that and for the chat
template's own text (Llama 3.1's adds its dates to the system message). Counting high costs a
passage fewer in a request; counting low costs the request (HTTP 400, the section written without
the model).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

_PIECES = re.compile(r" ?[A-Za-z]+|\s+|.", re.DOTALL)
_PER_MESSAGE = 8  # a chat template's role markers around each message
_PER_REQUEST = 64  # a template's own preamble (a default system text, dates), and the answer's start
_MARGIN = 0.03  # of the context: characters a vocabulary knows only as bytes
_LETTERS_A_TOKEN = 3


def text_tokens(text: str) -> int:
    """At least as many tokens as the tokenizers of common models make of `text` (see above)."""
    count = 0
    for piece in _PIECES.findall(text):
        if piece[-1].isascii() and piece[-1].isalpha():
            count += math.ceil(len(piece.lstrip(" ")) / _LETTERS_A_TOKEN)
        else:
            count += 1
    return count


def message_tokens(messages: Iterable[Mapping[str, object]]) -> int:
    """A chat request's prompt: each message's text and its template's wrapping."""
    return _PER_REQUEST + sum(_PER_MESSAGE + text_tokens(str(message.get("content") or "")) for message in messages)


@dataclass(frozen=True)
class Budget:
    """What one request may hold: `context` tokens in all (LLM_CONTEXT_TOKENS, or the smaller context
    a server said it has), of which `answer` are the answer's (`max_tokens`), and the prompt the rest
    less a margin."""

    context: int
    answer: int

    @classmethod
    def of(cls, context: int) -> Budget:
        # a quarter of the context for the answer: a section's few paragraphs (and a small model's
        # thinking before them) within 2,048 tokens, the rest for the passages it is written from
        return cls(context, max(256, min(2048, context // 4)))

    @property
    def prompt(self) -> int:
        return self.context - self.answer - math.ceil(self.context * _MARGIN)

    def fits(self, messages: Iterable[Mapping[str, object]]) -> bool:
        return message_tokens(messages) <= self.prompt

    def within(self, context: int) -> Budget:
        """This budget in a smaller context (a server that said its own is smaller), else itself."""
        return Budget.of(context) if context < self.context else self


def cut_to_tokens(text: str, tokens: int) -> str:
    """The longest start of `text` that counts `tokens` or fewer, an ellipsis included, cut at a
    space where there is one in its second half."""
    if text_tokens(text) <= tokens:
        return text
    tokens -= 1  # the ellipsis
    low, high = 0, len(text)  # the count grows with the length: the longest fitting start by halving
    while low < high:
        middle = (low + high + 1) // 2
        if text_tokens(text[:middle]) <= tokens:
            low = middle
        else:
            high = middle - 1
    cut = text[:low]
    space = cut.rfind(" ")
    return (cut[:space] if space > len(cut) // 2 else cut).rstrip() + "…" if cut else ""
