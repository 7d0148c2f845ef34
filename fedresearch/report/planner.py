"""The extractive planner: sub-questions for detailed reports, from the words the first results share.

Without a model, a question is decomposed along the themes its first results are about: the most
frequent two-word phrases of the best sources that the question does not already say.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Sequence

from fedresearch.core.models import FusedResult
from fedresearch.core.text import STOPWORDS, cjk_bigrams

_WORDS = re.compile(r"[A-Za-z][A-Za-z0-9\-]+")


def sub_questions(question: str, sources: Sequence[FusedResult], count: int = 3) -> list[str]:
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
    return [f"{question} — {phrase}" for phrase in chosen]
