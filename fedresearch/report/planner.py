"""Sub-questions for detailed reports, and deep research's follow-up questions: the model's, when one
is configured, else the extractive planner's.

Without a model, a question is decomposed along the themes its first results are about: the most
frequent two-word phrases of the best sources that the question does not already say. With one, the
model is asked (a plain chat completion: no tool calling, no JSON mode, which local servers often
lack) for a numbered list, read leniently: `<think>` blocks, bullets, bold and quotes are tolerated;
an answer with no usable list is a failure, and the caller falls back to the extractive planner.
Deep research's follow-ups are asked of the model given what a question's own search found (its
best sources' titles and openings) and every question asked before, as many of those as fit the
request's budget (LLM_CONTEXT_TOKENS).
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
from fedresearch.report.tokens import Budget, text_tokens

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
# words that make no heading and no sub-question: modal, vague, or saying only that something was used or shown
WEAK_WORDS = frozenset({
    "may", "might", "can", "could", "would", "should", "will", "must", "also", "thus", "however", "number",
    "using", "used", "uses", "based", "given", "many", "much", "several", "various", "different", "new",
    "well", "high", "higher", "low", "lower", "per", "way", "ways", "use", "made", "make", "makes", "found",
    "shown", "show", "shows", "showed", "two", "three", "one", "first", "second", "least", "less", "more",
    "most", "other", "others", "same", "such", "total", "whole", "picks", "gives", "give", "get", "gets",
    "enough", "fast", "slow", "good", "better", "best", "very", "too", "quite", "either", "neither", "beat",
    "beats", "every", "another", "certain", "whose", "none", "like", "unlike",
})  # fmt: skip


def _plural(word: str) -> bool:
    """An English word in a plural -s ("rankings", not "class", "corpus", "analysis")."""
    return len(word) > 4 and word.endswith("s") and not word.endswith(("ss", "us", "is"))


def stemmed(phrase: str) -> str:
    """A phrase with its words' plural "s" off: "dense retrievers" and "dense retriever" are one."""
    return " ".join(word[:-1] if _plural(word) else word for word in phrase.split())


def whole_phrase(phrase: str, texts: str) -> str:
    """`phrase` with the word all of its uses in `texts` (lowercase; two uses or more) come after, and
    then go on with, while there is one: "rank fusion" always after "reciprocal" is "reciprocal rank
    fusion", "vector space" always followed by "model" is "vector space model"."""
    if cjk_bigrams(phrase):
        return phrase
    for _ in range(2):
        before = re.findall(rf"(?:\b([a-z]+) )?\b{re.escape(phrase)}\b", texts)
        if len(before) < 2 or len(set(before)) != 1:  # once is no pattern
            break
        word = before[0]
        if len(word) < 3 or word in STOPWORDS or word in WEAK_WORDS:
            break
        phrase = f"{word} {phrase}"  # "rank fusion" always after "reciprocal": "reciprocal rank fusion"
    for _ in range(2):
        after = re.findall(rf"\b{re.escape(phrase)}\b(?: ([a-z]+))?", texts)
        if len(after) < 2 or len(set(after)) != 1:  # once is no pattern: "dense retriever beats"
            break
        word = after[0]
        if len(word) < 3 or word in STOPWORDS or word in WEAK_WORDS or word.endswith(("s", "ed")):
            break  # in -s or -ed it is more likely the phrase's verb ("ranking raises") than its noun
        phrase = f"{phrase} {word}"
    return phrase


def says(text: str, phrase: str) -> bool:
    """Whether `text` says `phrase`, plural or not ("dense retrievers" says "dense retriever")."""
    if cjk_bigrams(phrase):
        return phrase in text
    words = stemmed(phrase.lower()).split()
    return bool(words) and bool(
        re.search(r"\b" + r"\W+".join(re.escape(w) + r"\w*" for w in words) + r"\b", text.lower())
    )


# words after a noun phrase that show it is no subject followed by its verb
_NOT_VERB_AFTER = "and|or|of|in|for|with|to|on|are|were|can|may|that|which"


def subject_and_verb(phrase: str, texts: str) -> bool:
    """A phrase that `texts` (lowercase) use as a subject and its verb, not a term: "graph keeps a",
    "fusion needs normalization"."""
    if re.search(rf"\b{re.escape(phrase)} (?:a|an|the|no|its|their|each|every|this|that|these)\b", texts):
        return True
    first, last = phrase.split(" ", 1)[0], phrase.rsplit(" ", 1)[-1]
    if first != last and _plural(first):
        return True  # a plural seldom names a thing before another noun: "rankings find", "systems rerank"
    return _plural(last) and bool(re.search(rf"\b{re.escape(phrase)} (?!(?:{_NOT_VERB_AFTER})\b)[a-z]{{3,}}", texts))


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
    uses: Counter[str] = Counter()  # by texts, a plural and its singular as one ("dense retriever(s)")
    shown: dict[str, str] = {}  # each phrase as the texts first write it
    for text in texts:
        said = evidence_phrases([text], asked)
        uses.update({stemmed(p) for p in said})
        for phrase in said:
            shown.setdefault(stemmed(phrase), phrase)
    lowered = " ".join(texts).lower()
    avoided = {stemmed(p) for p in avoid}
    keys: list[str] = []
    for key, used in sorted(uses.items(), key=lambda item: (-item[1], item[0])):
        if used < 2 or len(keys) >= count:
            break
        words = set(key.split())
        if words & WEAK_WORDS or any(words & set(k.split()) for k in keys) or key in avoided:
            continue
        if subject_and_verb(shown[key], lowered):
            continue
        keys.append(key)
    chosen = [whole_phrase(shown[key], lowered) for key in keys]  # "reciprocal rank" -> "reciprocal rank fusion"
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


def _list_form(question: str, count: int, languages: Sequence[str]) -> str:
    other = _other_language(question, languages)
    if other:
        return (
            f"1. … to {count}. …, one per line, each written as: the question in the user's question's language, "
            f"then ' || ', then the same search query in {other} (the sources are in {other})"
        )
    return f"1. … to {count}. …, one per line"


def _fitting(head: str, lines: Sequence[str], system: str, budget: Budget | None) -> str:
    """`head` and as many of `lines` as the request's budget holds beside `system`."""
    if budget is None:
        return "\n".join([head, *lines])
    left = budget.prompt - text_tokens(system) - text_tokens(head) - 100  # the templates' own and the labels
    kept = []
    for line in lines:
        left -= text_tokens(line) + 1
        if left < 0:
            break
        kept.append(line)
    return "\n".join([head, *kept])


def planning_messages(
    question: str,
    sources: Sequence[FusedResult],
    count: int,
    languages: Sequence[str] = (),
    budget: Budget | None = None,
) -> list[ChatCompletionMessageParam]:
    """The question and the titles of the first results (as many as fit `budget`), so sub-questions
    are about what can be found; when those are in a language the question is not (`languages`),
    each sub-question also in it."""
    titles = [f"- {' '.join(s.title.split())[:160]}" for s in sources[:10] if s.title.strip()]
    system = (
        f"You plan research. Split the user's question into {count} distinct sub-questions that together "
        "cover it, each one a self-contained search query a researcher would type, in the question's "
        f"language. Answer with a numbered list only: {_list_form(question, count, languages)}, nothing else."
    )
    user = f"Question: {question}"
    if titles:
        user = _fitting(f"{user}\n\nFirst results found so far:", titles, system, budget)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def follow_up_messages(
    question: str,
    asking: str,
    found: Sequence[FusedResult],
    asked: Sequence[str],
    count: int,
    languages: Sequence[str] = (),
    budget: Budget | None = None,
) -> list[ChatCompletionMessageParam]:
    """Deep research's next level for one question (`asking`, under the user's `question`): what its
    search found (each of its best sources' title and opening) and the questions asked before, so
    that the follow-ups dig into what was found and ask nothing twice; as much as fits `budget`."""
    system = (
        f"You plan deep research. Given a research question, one of its sub-questions and what a search for "
        f"that sub-question found, write {count} follow-up questions that dig deeper into what the findings "
        "leave open or only touch on, each a self-contained search query a researcher would type, in the "
        "research question's language, none repeating a question asked before. Answer with a numbered list "
        f"only: {_list_form(question, count, languages)}, nothing else."
    )
    learned = [
        f"- {' '.join(s.title.split())[:160]}: {' '.join(s.body.split())[:300]}" for s in found[:8] if s.body.strip()
    ]
    before = [f"- {' '.join(q.split())[:200]}" for q in asked[:30]]
    head = f"Research question: {question}\n\nSub-question: {asking}"
    if before:
        head = _fitting(f"{head}\n\nAsked before:", before, system, budget)
    user = _fitting(f"{head}\n\nWhat its search found:", learned, system, budget)
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
    languages = source_languages(sources)
    answer = await complete(config, planning_messages(question, sources, count, languages, config.budget))
    found = numbered_list(answer, question, count)
    if len(found) < 2:
        raise WriterFailure(f"the model's plan had {len(found)} usable sub-question(s), not a numbered list")
    return [sub_question(item) for item in found]


async def model_follow_ups(
    config: LlmConfig,
    question: str,
    asking: str,
    found: Sequence[FusedResult],
    asked: Sequence[str],
    count: int,
) -> list[SubQuestion]:
    """The model's follow-up questions to `asking` given what its search `found`, none of them one
    `asked` before; WriterFailure when it gives none."""
    messages = follow_up_messages(question, asking, found, asked, count, source_languages(found), config.budget)
    answer = await complete(config, messages)
    before = {_key(q) for q in asked}
    items = [
        item
        for item in numbered_list(answer, asking, count + len(asked))
        if _key(sub_question(item).heading) not in before
    ]
    if not items:
        raise WriterFailure("the model's follow-ups were no numbered list of new questions")
    return [sub_question(item) for item in items[:count]]
