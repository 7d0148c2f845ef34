"""Evidence for a report: passages from library hits, fetched pages and snippets, ranked against the
question, diversified, and cut into the sentences (claims) the extractive writer cites."""

from __future__ import annotations

import functools
import math
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from fedresearch.core.models import FusedResult
from fedresearch.core.ranking import rrf
from fedresearch.core.text import STOPWORDS, cjk_bigrams, has_cjk, split_sentences
from fedresearch.library.chunking import Chunk, chunk_sections
from fedresearch.library.crosslingual import Counts, chinese_words, passage_reading, query_texts
from fedresearch.library.formats import Section
from fedresearch.report.sentences import is_cut, note_fragment, tidy, users_own

_WORD = re.compile(r"[a-z0-9]+")
_CITATION_LIKE = re.compile(r"\[(\d+(?:\s*[,–-]\s*\d+)*)\]")
# dense scoring costs about 14 ms of a core a 120-token passage (int8 graph): only the lexical best,
# as many as still pay (bench.evidence: nDCG@10 +0.14 MED, +0.11 CISI at 48; 64 adds under 0.01)
_EMBEDDED_PASSAGES = 48
_PAGE_PASSAGE_TOKENS = 120
_SPACED_STOP = re.compile(r"(?<=[a-z0-9)]) \. (?=[a-z(])")
_CUT_END = re.compile(r"\s*(?:…|\.\.\.)\s*$")

Embed = Callable[[list[str]], np.ndarray]  # texts -> unit vectors (the library's encoder)


class RememberedEmbed:
    """`embed` that encodes a text once and then answers from memory, up to `limit` texts (the
    oldest forgotten first; 384 floats a text: 2,048 of them are 3 MB).

    A report's passages are ranked again for each part of a detailed report and for each chat
    message about it, each time with the model: 48 passages, half a second of a core, for a chat
    message whose own text was the only new one. One lives as long as its report's `Writing`, so
    what one user's report read is never remembered for another's."""

    def __init__(self, embed: Embed, limit: int = 2048) -> None:
        self._embed = embed
        self._limit = limit
        self._vectors: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()  # a report's chat may rank on one thread while another writes

    def __call__(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            known = {text: self._vectors[text] for text in texts if text in self._vectors}
        missing = list(dict.fromkeys(text for text in texts if text not in known))
        if not texts or len(missing) > self._limit:
            return self._embed(texts)
        if missing:
            found = dict(zip(missing, self._embed(missing), strict=True))
            known.update(found)
            with self._lock:
                self._vectors.update(found)
                for oldest in list(self._vectors)[: max(0, len(self._vectors) - self._limit)]:
                    del self._vectors[oldest]
        return np.stack([known[text] for text in texts])


@functools.lru_cache(maxsize=1 << 16)  # a report's vocabulary is small and every passage repeats it
def _stem(word: str) -> str:
    for suffix in ("ations", "ation", "ings", "ing", "ies", "ers", "er", "es", "ed", "ly", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def terms(text: str) -> list[str]:
    return list(_terms(text))


def question_terms(question: str) -> set[str]:
    """What a question asks for: its English stems, and the bigrams of its Chinese dictionary words
    only (a bigram across two words, 索怎 of 检索怎样, is in no passage and would only dilute the
    share of the question a passage holds)."""
    if not has_cjk(question):
        return set(terms(question))
    english = {t for t in terms(question) if not has_cjk(t)}
    return english | {gram for word in chinese_words(question) for gram in cjk_bigrams(word)}


@functools.lru_cache(maxsize=4096)  # ranking, diversifying, picking and verifying read the same texts
def _terms(text: str) -> tuple[str, ...]:
    words = [_stem(word) for word in _WORD.findall(text.lower()) if word not in STOPWORDS]
    return (*words, *cjk_bigrams(text))


def clean_sentence(text: str) -> str:
    """One line of prose that cannot break the report: no headings, no stray citation markers."""
    text = " ".join(text.split())
    text = re.sub(r"^[#>*\-|\s]+", "", text)
    text = text.replace("[", "(").replace("]", ")").replace("|", "/")
    return _CITATION_LIKE.sub(r"(\1)", text)


def claim_sentences(text: str, title: str = "") -> list[str]:
    """The sentences of `text` that can stand as a finding in a report: whole (a snippet cut off
    mid-sentence is not), without a label before them or their page's title glued on (`tidy`)."""
    sentences = []
    # " . " ends a sentence in lower-cased collections (MED, CISI) that split_sentences reads as one
    for part in split_sentences(_SPACED_STOP.sub(".\n", text)):
        sentence = tidy(clean_sentence(part), title)
        if title and sentence.rstrip(".").casefold() == " ".join(title.split()).rstrip(".").casefold():
            continue  # the page's title on a line of its own: a heading, not a finding
        substantive = len(sentence) >= 30 or len(cjk_bigrams(sentence)) >= 6
        asks = sentence.endswith(("?", "？"))  # a question in a note is not a finding
        if substantive and not asks and not is_cut(sentence) and len(sentence) <= 600:
            sentences.append(sentence)
    return sentences


@dataclass(frozen=True)
class Evidence:
    """One passage of evidence, where it came from, and where in its source it stands."""

    text: str
    source: FusedResult
    origin: str  # library, snippet, or page (the fetched page behind the result)
    page: int | None = None
    position: int = 0


def gather(
    sources: Sequence[FusedResult], pages: dict[str, list[Section]], cut: dict[str, list[Chunk]] | None = None
) -> list[Evidence]:
    """Passages: a fetched page's text in ~120-token passages (page numbers kept), else the result's body.

    `cut` keeps each page's passages by source key, for the next gather over the same `pages`: a
    report gathers the same pages for its claims, its verification and each part of a detailed one,
    and cutting them was most of its time."""
    found: list[Evidence] = []
    for source in sources:
        sections = pages.get(source.key)
        if sections:
            chunks = cut.get(source.key) if cut is not None else None
            if chunks is None:
                chunks = chunk_sections(sections, size=_PAGE_PASSAGE_TOKENS, overlap=0)
                if cut is not None:
                    cut[source.key] = chunks
            for chunk in chunks:
                found.append(Evidence(chunk.text, source, "page", chunk.page, chunk.position))
            # the search's snippet only where the page does not hold it: a cut snippet of a page
            # read in full would be quoted cut
            snippet = " ".join(_CUT_END.sub("", source.body).split())
            page_text = " ".join(" ".join(s.text for s in sections).split())
            if snippet and snippet not in page_text:
                found.append(Evidence(source.body, source, "snippet", source.metadata.get("page"), 0))
            continue
        origin = "library" if source.kind == "library" else "snippet"
        found.append(Evidence(source.body, source, origin, source.metadata.get("page"), 0))
    return found


@dataclass
class Ranked:
    evidence: Evidence
    score: float
    vector: np.ndarray | None = field(default=None, repr=False)
    cosine: float | None = None  # with the question, where the encoder scored this passage
    overlap: float = 0.0  # the share of the question's weight (idf) this passage contains


def _lexical(
    question: str, passages: Sequence[Evidence], translated_words: Sequence[str] = ()
) -> tuple[list[float], list[float]]:
    """Each passage's lexical score, and the share of the question's weight (idf) that it contains;
    `translated_words`: the question's words in the other language (library/crosslingual.py: a
    Chinese question's in English, an English question's in Chinese), which evidence in that
    language is scored by too, its share the better of the two readings'."""
    lexical, shares = _lexical_reading(question, passages)
    if not translated_words:
        return lexical, shares
    translated, translated_shares = _lexical_reading(" ".join(translated_words), passages)
    return (
        [a + b for a, b in zip(lexical, translated, strict=True)],
        [max(a, b) for a, b in zip(shares, translated_shares, strict=True)],
    )


def _lexical_reading(question: str, passages: Sequence[Evidence]) -> tuple[list[float], list[float]]:
    wanted = question_terms(question)
    bags = [terms(passage.text) for passage in passages]
    frequency = Counter(term for bag in bags for term in set(bag))
    total = len(passages)
    weight = {
        term: math.log(1 + total / frequency[term]) if frequency[term] else math.log(1 + total) for term in wanted
    }
    asked = sum(weight.values()) or 1.0
    scores, shares = [], []
    for bag in bags:
        present = wanted.intersection(bag)
        score = sum(weight[term] for term in present)
        scores.append(score / math.sqrt(max(len(set(bag)), 1)) ** 0.5)
        shares.append(score / asked)
    return scores, shares


def rank(
    question: str, passages: Sequence[Evidence], embed: Embed | None = None, counts: Counts | None = None
) -> list[Ranked]:
    """Passages best first: a lexical ranking and, with an encoder, a dense one, fused with the
    library's RRF; the fused source's own standing (retrievers agreeing on it) breaks ties. Each
    keeps how much of the question it contains and, where encoded, its cosine with the question,
    which the relevance gate reads (`bearing`)."""
    if not passages:
        return []
    read = query_texts(question, counts=counts)  # read in the other language too: evidence in either bears on it
    lexical, shares = _lexical(question, passages, read.english + read.chinese)
    order = sorted(range(len(passages)), key=lambda i: lexical[i], reverse=True)
    fused = {i: rrf(rank + 1) for rank, i in enumerate(order)}
    vectors: dict[int, np.ndarray] = {}
    cosines: dict[int, float] = {}
    if embed is not None:
        head = order[:_EMBEDDED_PASSAGES]
        # a Chinese passage read in English, as the library's encoder reads it (crosslingual.py)
        matrix = embed([read.dense, *(passage_reading(passages[i].text[:1500]) for i in head)])
        found = matrix[1:] @ matrix[0]
        for dense_rank, j in enumerate(np.argsort(-found), start=1):
            fused[head[j]] += rrf(dense_rank)
            vectors[head[j]] = matrix[1 + j]
            cosines[head[j]] = float(found[j])
    best_source = max(p.source.score for p in passages) or 1.0
    return sorted(
        (
            Ranked(p, fused[i] + 0.002 * p.source.score / best_source, vectors.get(i), cosines.get(i), shares[i])
            for i, p in enumerate(passages)
        ),
        key=lambda r: r.score,
        reverse=True,
    )


@dataclass(frozen=True)
class Gate:
    """When a source bears on a question: its best passage's relevance (the cosine with the question
    where the encoder scored it, else the share of the question's weight it contains) at least
    `relative` times the best source's and at least `floor`. Chosen by measurement
    (bench/report_quality.py --gate; docs/reports.md)."""

    relative: float = 0.6
    floor: float = 0.3
    lexical_relative: float = 0.0
    lexical_floor: float = 0.2


def relevance(ranked: Sequence[Ranked]) -> dict[str, tuple[float | None, float]]:
    """Each source's best cosine with the question (None where no passage of it was encoded) and
    its best share of the question's weight."""
    best: dict[str, tuple[float | None, float]] = {}
    for item in ranked:
        key = item.evidence.source.key
        # the library's own cosine counts too: it saw the query as the library searched it
        cosine, share = best.get(key, (item.evidence.source.cosine, 0.0))
        if item.cosine is not None:
            cosine = item.cosine if cosine is None else max(cosine, item.cosine)
        best[key] = (cosine, max(share, item.overlap))
    return best


def bearing(ranked: Sequence[Ranked], gate: Gate | None = None) -> set[str]:
    """The keys of the sources that bear on the question `ranked` was ranked against."""
    gate = gate or Gate()
    scores = relevance(ranked)
    dense = [c for c, _ in scores.values() if c is not None]
    if dense:
        top = max(dense)
        return {key for key, (c, _) in scores.items() if c is not None and c >= max(gate.floor, gate.relative * top)}
    top_share = max((share for _, share in scores.values()), default=0.0)
    limit = max(gate.lexical_floor, gate.lexical_relative * top_share)
    return {key for key, (_, share) in scores.items() if share > 0 and share >= limit}


def jaccard(a: set[str], b: set[str]) -> float:
    """Shared terms over all terms: 0.0 when either is empty."""
    shared = len(a & b)  # the union's size from the sizes: building the union cost as much as the rest
    return shared / (len(a) + len(b) - shared) if a and b else 0.0


def term_bits(words: Iterable[str], numbers: dict[str, int]) -> tuple[int, int]:
    """A set of terms as an integer with a bit for each (numbered in `numbers` as first met) and its
    size: the terms two sets share are then one AND and a popcount, a sixteenth of the time a set
    intersection of 80 terms takes."""
    bits = 0
    for word in set(words):
        bits |= 1 << numbers.setdefault(word, len(numbers))
    return bits, bits.bit_count()


def _bits_jaccard(a: tuple[int, int], b: tuple[int, int]) -> float:
    """`jaccard` of two `term_bits`."""
    shared = (a[0] & b[0]).bit_count()
    return shared / (a[1] + b[1] - shared) if a[1] and b[1] else 0.0


def _similarity(a: Ranked, b: Ranked, words: dict[int, tuple[int, int]]) -> float:
    if a.vector is not None and b.vector is not None:
        return float(a.vector @ b.vector)
    return _bits_jaccard(words[id(a)], words[id(b)])


def diversify(ranked: Sequence[Ranked], k: int, per_source: int = 3, balance: float = 0.7) -> list[Ranked]:
    """Maximal marginal relevance: each pick trades relevance against likeness to what is already
    picked, so one source (or one point made five times) cannot fill the report."""
    if not ranked:
        return []
    top = ranked[0].score or 1.0
    pool, used = list(ranked[: k * 4]), Counter[str]()
    numbers: dict[str, int] = {}
    words = {id(r): term_bits(terms(r.evidence.text), numbers) for r in pool}
    # each candidate's likeness to the closest pick so far, raised by each new pick alone: comparing
    # every candidate with every pick on each round made long evidence quadratic in the picks
    likeness = dict.fromkeys(map(id, pool), 0.0)
    chosen: list[Ranked] = []
    while pool and len(chosen) < k:
        best, best_value = None, -math.inf
        for candidate in pool:
            if used[candidate.evidence.source.key] >= per_source:
                continue
            value = balance * candidate.score / top - (1 - balance) * likeness[id(candidate)]
            if value > best_value:
                best, best_value = candidate, value
        if best is None:
            break
        pool.remove(best)
        chosen.append(best)
        used[best.evidence.source.key] += 1
        for candidate in pool:
            if used[candidate.evidence.source.key] < per_source:
                similar = _similarity(candidate, best, words)  # cosines may be negative: no floor
                key = id(candidate)
                likeness[key] = similar if len(chosen) == 1 else max(likeness[key], similar)
    return chosen


@dataclass
class Claim:
    """A sentence the report states, the sources that support it (agreeing ones cited together)."""

    text: str
    sources: list[FusedResult]
    score: float
    evidence: Evidence
    position: int = 0
    vector: np.ndarray | None = field(default=None, repr=False)

    @property
    def source(self) -> FusedResult:
        return self.sources[0]


def select_claims(question: str, chosen: Sequence[Ranked], max_claims: int, per_passage: int = 2) -> list[Claim]:
    """The best sentences of the chosen passages; a sentence another source also states cites both."""
    wanted = question_terms(question)
    candidates: list[Claim] = []
    for rank_index, ranked in enumerate(chosen):
        own = users_own(ranked.evidence.source)
        for position, sentence in enumerate(claim_sentences(ranked.evidence.text, ranked.evidence.source.title)):
            if own and note_fragment(sentence):
                continue  # "Worth measuring … first.": no finding; it goes with its note's question

            overlap = len(wanted.intersection(terms(sentence))) / (len(wanted) or 1)
            lead = 0.1 if position == 0 else 0.0  # a summary's first sentence usually states its point
            score = ranked.score * 100 + overlap + lead - 0.01 * rank_index
            candidates.append(
                Claim(sentence, [ranked.evidence.source], score, ranked.evidence, position, ranked.vector)
            )
    candidates.sort(key=lambda claim: claim.score, reverse=True)
    picked: list[tuple[Claim, tuple[int, int]]] = []
    per: Counter[int] = Counter()
    numbers: dict[str, int] = {}
    for claim in candidates:
        words = term_bits(terms(claim.text), numbers)
        twin = next((kept for kept, kept_words in picked if _bits_jaccard(words, kept_words) > 0.6), None)
        if twin is not None:
            if claim.source.key not in {s.key for s in twin.sources}:
                twin.sources.append(claim.source)  # another source states the same: cite it too
            continue
        if len(picked) >= max_claims or per[id(claim.evidence)] >= per_passage:
            continue
        picked.append((claim, words))
        per[id(claim.evidence)] += 1
    return [claim for claim, _ in picked]
