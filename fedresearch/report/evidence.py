"""Pick the sentences of the fused evidence that best answer the question (the extractive writer)."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

from fedresearch.core.models import FusedResult
from fedresearch.core.text import STOPWORDS, cjk_bigrams, split_sentences

_WORD = re.compile(r"[a-z0-9]+")
_CITATION_LIKE = re.compile(r"\[(\d+(?:\s*[,–-]\s*\d+)*)\]")


def _stem(word: str) -> str:
    for suffix in ("ations", "ation", "ings", "ing", "ies", "ers", "er", "es", "ed", "ly", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def terms(text: str) -> list[str]:
    words = [_stem(word) for word in _WORD.findall(text.lower()) if word not in STOPWORDS]
    return words + cjk_bigrams(text)


def clean_sentence(text: str) -> str:
    """One line of prose that cannot break the report: no headings, no stray citation markers."""
    text = " ".join(text.split())
    text = re.sub(r"^[#>*\-\s]+", "", text)
    return _CITATION_LIKE.sub(r"(\1)", text)


def claim_sentences(text: str) -> list[str]:
    """The sentences of `text` that can stand as a finding in a report."""
    sentences = []
    for part in split_sentences(text):
        sentence = clean_sentence(part)
        substantive = len(sentence) >= 30 or len(cjk_bigrams(sentence)) >= 6
        asks = sentence.endswith(("?", "？"))  # a question in a note is not a finding
        if substantive and not asks and len(sentence) <= 600:
            sentences.append(sentence)
    return sentences


@dataclass(frozen=True)
class Claim:
    text: str
    source: FusedResult
    score: float
    position: int = 0


def _too_similar(a: set[str], b: set[str]) -> bool:
    return bool(a and b) and len(a & b) / len(a | b) > 0.6


def select_claims(question: str, sources: list[FusedResult], max_claims: int = 10, per_source: int = 2) -> list[Claim]:
    """The best sentences for the question, diverse across sources, best first."""
    question_terms = set(terms(question))
    candidates: list[tuple[str, FusedResult, list[str], int]] = []
    for source in sources:
        for position, sentence in enumerate(claim_sentences(source.body)):
            candidates.append((sentence, source, terms(sentence), position))
    if not candidates:
        return []
    document_frequency = Counter(term for _, _, words, _ in candidates for term in set(words))
    total = len(candidates)
    best_fused = max(source.score for source in sources) or 1.0

    scored: list[Claim] = []
    for sentence, source, words, position in candidates:
        present = question_terms.intersection(words)
        relevance = sum(math.log(1 + total / document_frequency[term]) for term in present)
        relevance /= math.sqrt(max(len(set(words)), 1)) ** 0.5
        prior = source.score / best_fused  # fused rank: sources several retrievers agree on rise
        lead = 0.15 if position == 0 else 0.0  # a summary's first sentence usually states its point
        scored.append(Claim(sentence, source, relevance + 0.5 * prior + lead, position))
    scored.sort(key=lambda claim: claim.score, reverse=True)

    chosen: list[Claim] = []
    chosen_terms: list[set[str]] = []
    used: Counter[str] = Counter()
    for claim in scored:
        if len(chosen) >= max_claims:
            break
        if used[claim.source.key] >= per_source:
            continue
        distinct = set(terms(claim.text))
        if any(_too_similar(distinct, other) for other in chosen_terms):
            continue
        chosen.append(claim)
        chosen_terms.append(distinct)
        used[claim.source.key] += 1
    return chosen
