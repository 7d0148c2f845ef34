"""Sub-questions for detailed reports: the model's, when one is configured, else the extractive planner's.

Without a model, a question is decomposed along the themes its first results are about: the most
frequent two-word phrases of the best sources that the question does not already say. With one, the
model is asked (a plain chat completion: no tool calling, no JSON mode, which local servers often
lack) for a numbered list, read leniently: `<think>` blocks, bullets, bold and quotes are tolerated;
an answer with no usable list is a failure, and the caller falls back to the extractive planner.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedresearch.core.models import FusedResult
from fedresearch.core.text import STOPWORDS, cjk_bigrams
from fedresearch.report.llm import LlmConfig, ThinkFilter, WriterFailure, complete

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

_WORDS = re.compile(r"[A-Za-z][A-Za-z0-9\-]+")
# "1. …", "2) …", "(3) …", "- …", "* …", "• …", "Q4: …", "Sub-question 5: …"
_ITEM = re.compile(
    r"^\s*(?:#+\s*)?\**\s*(?:\(?\d{1,2}[.):]|[-*•]|(?:q|sub-?question)\s*\d{1,2}\s*[.:)])\**\s*(.+?)\s*$",
    re.IGNORECASE,
)
_MIN_WORDS, _MAX_CHARS = 3, 300


@dataclass(frozen=True)
class SubQuestion:
    query: str  # what every chosen retriever is asked
    heading: str  # the report section its sources become


def sub_questions(question: str, sources: Sequence[FusedResult], count: int = 3) -> list[SubQuestion]:
    asked = {word.lower() for word in _WORDS.findall(question)} | set(cjk_bigrams(question))
    phrases: Counter[str] = Counter()
    for source in sources[:12]:
        words = [w.lower() for w in _WORDS.findall(f"{source.title}. {source.body}") if w.lower() not in STOPWORDS]
        seen = {f"{a} {b}" for a, b in itertools.pairwise(words) if len(a) > 2 and len(b) > 2}
        seen |= {gram for gram in cjk_bigrams(source.body) if gram not in asked}
        phrases.update(seen)  # how many sources use a phrase, not how often one source repeats it
    chosen: list[str] = []
    for phrase, uses in phrases.most_common():
        if uses < 2 or len(chosen) >= count:
            break
        if set(phrase.split()) <= asked or any(set(phrase.split()) & set(c.split()) for c in chosen):
            continue
        chosen.append(phrase)
    return [SubQuestion(f"{question} — {phrase}", phrase.capitalize()) for phrase in chosen]


def planning_messages(question: str, sources: Sequence[FusedResult], count: int) -> list[ChatCompletionMessageParam]:
    """The question and the titles of the first results, so sub-questions are about what can be found."""
    titles = "\n".join(f"- {' '.join(s.title.split())[:160]}" for s in sources[:10] if s.title.strip())
    system = (
        f"You plan research. Split the user's question into {count} distinct sub-questions that together "
        "cover it, each one a self-contained search query a researcher would type, in the question's "
        f"language. Answer with a numbered list only: 1. … to {count}. …, one per line, nothing else."
    )
    user = f"Question: {question}" + (f"\n\nFirst results found so far:\n{titles}" if titles else "")
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def numbered_list(answer: str, question: str, count: int) -> list[str]:
    """The sub-questions of a model's answer: `<think>` removed, list markers, bold and quotes stripped,
    repeats of each other or of the question dropped, at most `count`."""
    thinking = ThinkFilter()
    text = thinking.feed(answer) + thinking.close()
    found: list[str] = []
    seen = {_key(question)}
    for line in text.splitlines():
        match = _ITEM.match(line)
        if match is None:
            continue
        item = " ".join(match.group(1).strip("*_`\"'“”‘’ ").split())
        key = _key(item)
        if (len(item.split()) < _MIN_WORDS and not cjk_bigrams(item)) or len(item) > _MAX_CHARS or key in seen:
            continue
        seen.add(key)
        found.append(item)
    return found[:count]


def _key(text: str) -> str:
    return " ".join(text.lower().split()).rstrip("?.!。？")


async def model_sub_questions(
    config: LlmConfig, question: str, sources: Sequence[FusedResult], count: int = 3
) -> list[SubQuestion]:
    """The model's sub-questions; WriterFailure (or the SDK's error) when it gives none."""
    answer = await complete(config, planning_messages(question, sources, count))
    found = numbered_list(answer, question, count)
    if len(found) < 2:
        raise WriterFailure(f"the model's plan had {len(found)} usable sub-question(s), not a numbered list")
    return [SubQuestion(item, item) for item in found]
