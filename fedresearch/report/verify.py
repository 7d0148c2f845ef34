"""Every cited sentence checked against the passages it cites.

Support is scored from the sentence's content terms found in the passage (lexical recall) and, with
the library's encoder, the best cosine between the sentence and one of the passage's sentences; a
number the sentence states that the passage does not state halves it. A sentence its citations do not
support is re-cited to the passage that supports it best, or marked `⚠ unsupported` when some support
is there, or dropped when none is; an uncited sentence that states a fact is cited when a passage
supports it, else flagged `⚠ uncited`. Thresholds come from the labelled set in
bench/data/verifier_pairs.jsonl (calibration half; see bench/citations.py).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from fedresearch.core.text import split_sentences
from fedresearch.report.evidence import Embed, terms
from fedresearch.report.language import REFERENCES_HEADING
from fedresearch.report.sentences import unattributed

UNSUPPORTED = "⚠ unsupported"
UNCITED = "⚠ uncited"
# passage markers as a model writes them: [3], [1, 2], [1][2]; and as the extractive writer renders
# them: [[3]](https://...)
MARKERS = re.compile(r"\[\[(\d+)\]\]\([^)\s]*\)|\[(\d+(?:\s*[,;]\s*\d+)*)\]")
_LEADING_MARKERS = re.compile(r"^(?:\s*(?:\[\[\d+\]\]\([^)\s]*\)|\[\d+(?:\s*[,;]\s*\d+)*\]))+")
_MARKERS_BEFORE_STOP = re.compile(
    rf"\s*(?:{MARKERS.pattern})(?:\s*(?:{MARKERS.pattern}))*(?=\s*[.,;:!?。，；：！？、])"  # "ranks [2]." "排序[2]。"
)
_NUMBER = re.compile(r"\d+(?:[.,]\d+)?")
_FACT_TERMS = 5  # an uncited sentence with fewer content terms is connective prose, not a finding


@dataclass(frozen=True)
class Thresholds:
    """`support` or more: the passage supports the sentence; under `drop`: nothing of it is there."""

    support: float = 0.5
    drop: float = 0.25


@dataclass
class Checked:
    """One sentence of the report as the verifier left it."""

    text: str  # without its markers
    cited: list[int]  # passage numbers, after verification
    support: float | None
    verdict: str  # supported, recited, cited, unsupported, dropped, uncited, prose
    asked: list[int] = field(default_factory=list)  # what the writer cited
    numbers: list[int] = field(default_factory=list)  # the References' numbers it cites, once rendered


def markers_of(text: str) -> list[int]:
    found: list[int] = []
    for single, group in MARKERS.findall(text):
        found.extend(int(n) for n in re.split(r"\s*[,;]\s*", single or group))
    return list(dict.fromkeys(found))


def strip_markers(text: str) -> str:
    # markers before a stop go with the space before them: "ranks [2]." is "ranks.", "排序[2]。" is "排序。"
    text = _MARKERS_BEFORE_STOP.sub("", text)
    return " ".join(MARKERS.sub(" ", text).split()).replace(" .", ".").replace(" ,", ",")


def sentences_of(paragraph: str) -> list[str]:
    """Sentences with their markers: a marker written after the stop belongs to the sentence before."""
    parts: list[str] = []
    for part in split_sentences(paragraph):
        leading = _LEADING_MARKERS.match(part)
        if leading and parts:
            parts[-1] += " " + leading.group(0).strip()
            part = part[leading.end() :].strip()
        if part:
            parts.append(part)
    return parts


class Verifier:
    """Scores sentences against numbered passages; vectors of the passages' sentences are computed once."""

    def __init__(
        self, passages: Mapping[int, str], embed: Embed | None = None, thresholds: Thresholds | None = None
    ) -> None:
        self.passages = dict(passages)
        self.embed = embed
        self.thresholds = thresholds or Thresholds()
        # line by line: a passage here is often its source's passages joined by line breaks, each
        # through `terms` (cached) when the report ranked them, and no term spans a line break
        self._terms = {n: set().union(*map(terms, text.split("\n"))) for n, text in self.passages.items()}
        self._numbers = {n: set(_NUMBER.findall(text)) for n, text in self.passages.items()}
        self._vectors: dict[int, np.ndarray] = {}
        if embed is not None and self.passages:
            pieces = [(n, s) for n, text in self.passages.items() for s in (split_sentences(text) or [text])]
            matrix = embed([s[:1000] for _, s in pieces])
            for n in self.passages:
                rows = [i for i, (m, _) in enumerate(pieces) if m == n]
                self._vectors[n] = matrix[rows]

    def scores(self, sentence: str) -> dict[int, float]:
        """Support of `sentence` (without markers) by every passage."""
        words = set(terms(sentence))
        if not words:
            return dict.fromkeys(self.passages, 0.0)
        stated = set(_NUMBER.findall(sentence))
        vector = self.embed([sentence])[0] if self.embed is not None and self._vectors else None
        result = {}
        for n in self.passages:
            score = len(words & self._terms[n]) / len(words)
            if vector is not None and len(self._vectors.get(n, ())):
                score = 0.5 * score + 0.5 * float(np.max(self._vectors[n] @ vector))
            if stated - self._numbers[n]:
                score *= 0.5  # a figure the passage does not state is the commonest fabrication
            result[n] = round(score, 4)
        return result

    def check(self, sentence: str, recite: bool = True) -> Checked:
        asked = markers_of(sentence)
        text = strip_markers(sentence)
        cited = [n for n in asked if n in self.passages]
        factual = len(set(terms(text))) >= _FACT_TERMS and not text.endswith(("?", "？", ":"))
        if not cited and not factual:
            return Checked(text, [], None, "prose", asked)
        scores = self.scores(unattributed(text))
        best = max(scores, key=lambda n: scores[n], default=None)
        support = max((scores[n] for n in cited), default=0.0)
        limit = self.thresholds
        if cited and support >= limit.support:
            kept = [n for n in cited if scores[n] >= limit.support] or cited
            return Checked(text, kept, support, "supported", asked)
        if recite and best is not None and scores[best] >= limit.support:
            return Checked(text, [best], scores[best], "recited" if cited else "cited", asked)
        if not cited:
            # citing only numbers that name no passage is a fabricated citation: the sentence goes
            return Checked(
                text, [], scores[best] if best is not None else 0.0, "dropped" if asked else "uncited", asked
            )
        verdict = "unsupported" if support >= limit.drop else "dropped"
        return Checked(text, cited, support, verdict, asked)


@dataclass
class Verification:
    sentences: list[Checked] = field(default_factory=list)
    removed_markers: int = 0  # markers naming no passage

    def counts(self) -> dict[str, int]:
        tally = Counter(checked.verdict for checked in self.sentences)
        checked = sum(1 for s in self.sentences if s.verdict != "prose")
        return {"checked": checked, **tally, "invalid_citations": self.removed_markers}

    def summary(self) -> str:
        counts = self.counts()
        said = ", ".join(
            f"{counts[k]} {k}"
            for k in ("supported", "recited", "cited", "unsupported", "dropped", "uncited")
            if counts.get(k)
        )
        invalid = counts["invalid_citations"]
        tail = f"; {invalid} citations naming no passage removed" if invalid else ""
        return f"🔎 Checked {counts['checked']} sentences against their sources: {said or 'nothing to check'}{tail}"


def verify_paragraph(
    paragraph: str, verifier: Verifier, verification: Verification, recite: bool = True
) -> list[Checked]:
    """The sentences of one paragraph as they stay in the report (dropped ones recorded, not kept)."""
    kept = []
    for sentence in sentences_of(paragraph):
        checked = verifier.check(sentence, recite)
        verification.removed_markers += len([n for n in checked.asked if n not in verifier.passages])
        verification.sentences.append(checked)
        if checked.verdict != "dropped":
            kept.append(checked)
    return kept


def mark_of(checked: Checked) -> str:
    return {"unsupported": f" {UNSUPPORTED}", "uncited": f" {UNCITED}"}.get(checked.verdict, "")


def verify_rendered(
    markdown: str, passages: Mapping[int, str], embed: Embed | None, thresholds: Thresholds | None = None
) -> tuple[str, Verification]:
    """A rendered report (citations already numbered as References number them) checked in place:
    unsupported sentences are marked, never re-cited (that would reorder the References)."""
    verifier = Verifier(passages, embed, thresholds)
    verification = Verification()
    found = REFERENCES_HEADING.search(markdown)  # in any language's words (参考文献 too)
    cut = found.start() if found else len(markdown)
    body, sep, tail = (
        markdown[:cut],
        markdown[cut : found.end() if found else cut],
        markdown[found.end() if found else cut :],
    )
    out = []
    for block in body.split("\n\n"):
        if block.startswith(("#", "- ", "|")) or not MARKERS.search(block):
            out.append(block)
            continue
        pieces = []
        for sentence in sentences_of(block):
            checked = verifier.check(sentence, recite=False)
            verification.sentences.append(checked)
            rendered = sentence
            if checked.verdict in ("unsupported", "dropped"):
                checked.verdict = "unsupported"  # the extractive writer quotes: keep the quote, mark it
                rendered += f" {UNSUPPORTED}"
            pieces.append(rendered)
        out.append(" ".join(pieces))
    return "\n\n".join(out) + sep + tail, verification


def passage_texts(numbered: Sequence[tuple[int, str]]) -> dict[int, str]:
    merged: dict[int, list[str]] = {}
    for number, text in numbered:
        merged.setdefault(number, []).append(text)
    return {n: "\n".join(texts) for n, texts in merged.items()}
