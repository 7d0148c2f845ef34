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
from fedresearch.library.crosslingual import chinese_words
from fedresearch.report.evidence import Gate
from fedresearch.report.language import is_chinese
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
    heading: str  # the report section its sources become: a question, in the report's language
    phrase: str = ""  # what of the evidence it asks about (the extractive planner's)


# Chinese words any text may say, whatever it is about: no heading, no sub-question
_GENERIC_CHINESE = frozenset({
    "研究", "方法", "结果", "使用", "可以", "没有", "一个", "这个", "那个", "需要",
    "因为", "所以", "但是", "如果", "我们", "他们", "已经", "非常", "其他", "主要",
    "不同", "一些", "很多", "这种", "这样", "作者", "论文", "本文", "提出", "表明",
    "发现", "结论", "解决", "导致", "成为", "用于", "部分", "一种", "时候", "东西",
    "事情", "认为", "觉得", "应该", "因此", "然而", "同时", "这里", "那里", "目前",
    "一般", "通常", "常常", "可能", "不能", "无法", "重要", "有效", "很好", "更好",
    "比较",
})  # fmt: skip
# a phrase's words: letters only, three or more, none a stopword, within one clause of one sentence
_CLAUSES = re.compile(r"[.;:!?,()\[\]\"“”/|。；：！？，（）]+")


def asked_words(question: str) -> set[str]:
    """The words a question says already, English (lowercase) and Chinese (dictionary words)."""
    return {word.lower() for word in _WORDS.findall(question)} | set(chinese_words(question))


def evidence_phrases(texts: Sequence[str], asked: set[str]) -> Counter[str]:
    """Two-word phrases of the texts, counted once per text: both words whole words of a clause (never
    across a sentence's end, a title and its text, or a piece of a word), and not all asked already;
    and the Chinese words of Chinese texts (a Chinese word is a term as a two-word phrase is), those
    any text says (研究, 方法) and those asked left out."""
    phrases: Counter[str] = Counter()
    for text in texts:
        seen: set[str] = {w for w in chinese_words(text) if w not in asked and w not in _GENERIC_CHINESE}
        for clause in _CLAUSES.split(text.lower()):
            words = clause.split()
            for a, b in itertools.pairwise(words):
                if not (a.isalpha() and b.isalpha()) or len(a) < 3 or len(b) < 3:
                    continue
                if a in STOPWORDS or b in STOPWORDS or {a, b} <= asked:
                    continue
                seen.add(f"{a} {b}")
        phrases.update(seen)
    return phrases


def bearing_sources(sources: Sequence[FusedResult], gate: Gate | None = None) -> list[FusedResult]:
    """The first results that bear on the question as far as the search can tell: where the library
    gave cosines, those the relevance gate keeps (report/evidence.py `Gate`), else all."""
    gate = gate or Gate()
    first = list(sources[:12])
    cosines = [s.cosine for s in first if s.cosine is not None]
    if not cosines:
        return first
    limit = max(gate.floor, gate.relative * max(cosines))
    return [s for s in first if s.cosine is None or s.cosine >= limit]


def sub_questions(
    question: str,
    sources: Sequence[FusedResult],
    count: int = 3,
    forms: Sequence[str] = ("What is known about {phrase}?",),
    avoid: Sequence[str] = (),
) -> list[SubQuestion]:
    """Sub-questions about what the first results that bear on `question` say and it does not: the
    phrases most of them use, each asked as a question (`forms`, in the report's language, in turn).
    `avoid`: phrases asked already (a deeper level of deep research asks about something new)."""
    asked = asked_words(question) | {w for p in avoid for w in p.split()}
    texts = [s.body for s in bearing_sources(sources)]
    phrases = evidence_phrases(texts, asked)
    chosen: list[str] = []
    for phrase, uses in sorted(phrases.items(), key=lambda item: (-item[1], item[0])):
        if uses < 2 or len(chosen) >= count:
            break
        words = set(phrase.split())
        if any(words & set(c.split()) for c in chosen) or phrase in avoid:
            continue
        chosen.append(phrase)
    return [
        SubQuestion(f"{phrase} {question}", forms[i % len(forms)].format(phrase=phrase), phrase)
        for i, phrase in enumerate(chosen)
    ]


_LANGUAGE_NAMES = {"en": "English", "zh": "Chinese"}
_TRANSLATED = re.compile(r"\s*\|\|\s*")  # "sub-question || the same in the sources' language"


def source_languages(sources: Sequence[FusedResult]) -> list[str]:
    """The languages the first results are written in ("en", "zh"), the user's library's first: what
    a sub-question must also be written in to find them (an English paper for a Chinese question)."""
    first = [s for s in sources[:20] if s.kind == "library"][:10] or list(sources[:10])
    found = {"zh" if is_chinese(f"{s.title} {s.body[:300]}") else "en" for s in first}
    return sorted(found)


def planning_messages(
    question: str, sources: Sequence[FusedResult], count: int, languages: Sequence[str] = ()
) -> list[ChatCompletionMessageParam]:
    """The question and the titles of the first results, so sub-questions are about what can be found;
    when those are in a language the question is not (`languages`), each sub-question also in it."""
    titles = "\n".join(f"- {' '.join(s.title.split())[:160]}" for s in sources[:10] if s.title.strip())
    other = _other_language(question, languages)
    form = f"1. … to {count}. …, one per line"
    if other:
        form = (
            f"1. … to {count}. …, one per line, each written as: the sub-question in the question's language, "
            f"then ' || ', then the same search query in {other} (the sources are in {other})"
        )
    system = (
        f"You plan research. Split the user's question into {count} distinct sub-questions that together "
        "cover it, each one a self-contained search query a researcher would type, in the question's "
        f"language. Answer with a numbered list only: {form}, nothing else."
    )
    user = f"Question: {question}" + (f"\n\nFirst results found so far:\n{titles}" if titles else "")
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def _other_language(question: str, languages: Sequence[str]) -> str | None:
    asked = "zh" if is_chinese(question) else "en"
    others = [_LANGUAGE_NAMES[code] for code in languages if code != asked and code in _LANGUAGE_NAMES]
    return " and ".join(others) or None


def numbered_list(answer: str, question: str, count: int) -> list[str]:
    """The sub-questions of a model's answer: `<think>` removed, list markers, bold and quotes stripped,
    repeats of each other or of the question dropped, at most `count`. A sub-question written in two
    languages keeps both ("中文 || English")."""
    thinking = ThinkFilter()
    text = thinking.feed(answer) + thinking.close()
    found: list[str] = []
    seen = {_key(question)}
    for line in text.splitlines():
        match = _ITEM.match(line)
        if match is None:
            continue
        item = " || ".join(
            " ".join(part.strip("*_`\"'“”‘’ ").split()) for part in _TRANSLATED.split(match.group(1)) if part.strip()
        )
        key = _key(item)
        if (len(item.split()) < _MIN_WORDS and not cjk_bigrams(item)) or len(item) > _MAX_CHARS or key in seen:
            continue
        seen.add(key)
        found.append(item)
    return found[:count]


def sub_question(item: str) -> SubQuestion:
    """A planned sub-question: its heading in the question's language, its query in that and, where
    the model wrote one, the sources' language too (the library reads each; a search engine both)."""
    heading, _, translated = item.partition(" || ")
    query = f"{heading} {translated}" if translated else heading
    return SubQuestion(query, heading)


def _key(text: str) -> str:
    return " ".join(text.lower().split()).rstrip("?.!。？")


async def model_sub_questions(
    config: LlmConfig, question: str, sources: Sequence[FusedResult], count: int = 3
) -> list[SubQuestion]:
    """The model's sub-questions; WriterFailure (or the SDK's error) when it gives none."""
    answer = await complete(config, planning_messages(question, sources, count, source_languages(sources)))
    found = numbered_list(answer, question, count)
    if len(found) < 2:
        raise WriterFailure(f"the model's plan had {len(found)} usable sub-question(s), not a numbered list")
    return [sub_question(item) for item in found]
