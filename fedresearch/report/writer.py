"""The extractive writer: evidence in, a report out, in the form its type promises (report/types.py).

Offline and deterministic: every finding is a sentence of a source, cited to it, said whose it is
where it does not say so itself (report/sentences.py), and stated once; only sources that bear on
the question (or on the sub-question of their section) are cited (`evidence.bearing`), so thin
evidence makes a short report that says so. Sections take their headings from phrases their own
evidence shares, in the report's language; the words around the quotations (introductions,
conclusions, notices) are the language's (report/language.py).

One function per layout (`LAYOUTS`), all rendered by one template (templates/report.md.j2).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from fedresearch.core.identifiers import is_url
from fedresearch.core.models import FusedResult, ReportType, RetrieverOutcome, RetrieverStatus
from fedresearch.core.text import STOPWORDS, has_cjk, split_sentences
from fedresearch.core.work import WorkPool
from fedresearch.library.chunking import Chunk
from fedresearch.library.crosslingual import Counts, dictionary
from fedresearch.library.formats import Section
from fedresearch.report.citations import Citations, Reference, display_title, reference_entries
from fedresearch.report.custom import read_custom_prompt
from fedresearch.report.evidence import (
    Claim,
    Embed,
    Evidence,
    Ranked,
    bearing,
    diversify,
    gather,
    jaccard,
    question_terms,
    rank,
    select_claims,
    terms,
)
from fedresearch.report.language import ENGLISH, Labels, is_chinese, joined, labels_for
from fedresearch.report.markup import inline_text, link_target
from fedresearch.report.planner import (
    WEAK_WORDS,
    asked_words,
    evidence_phrases,
    says,
    stemmed,
    subject_and_verb,
)
from fedresearch.report.sentences import attributed, authors_year, note_fragment, users_own
from fedresearch.report.types import Layout, form_of

TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=False,  # markdown out: text from outside goes through the `text` filter (report/markup.py)
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    auto_reload=False,  # templates ship with the package: checking their mtime on every render is waste
)
TEMPLATES.filters["text"] = inline_text
TEMPLATES.globals["reference_entries"] = reference_entries
REPORT_TEMPLATE = "report.md.j2"
BLOCKS_TEMPLATE = "_blocks.md.j2"  # sections alone: the report's body, or one section of it
_MAX_THEMES = 5
# the average cosine of two themes' sources above which they are one theme (bench/report_quality.py)
_THEME_LIKENESS = 0.5
# words that make no heading: modals, quantities and other words any sentence may pair with a term
_ANSWER_CLAIMS = 3
_WORDS_A_CLAIM = 25  # a quoted sentence's words on average (MED, CISI): a length asked becomes claims
# a sentence that disputes, limits or leaves open (the research report's disagreements and open questions)
_OPEN = re.compile(
    r"\b(however|but|although|whereas|in contrast|contrary|conflicting|disagree\w*|controvers\w*|unclear|"
    r"unknown|remains? to be|further (?:research|study|studies|work)|open question|not yet|debat\w*|"
    r"limitation\w*|inconsistent|no significant|failed to)\b|但是|然而|尚不清楚|仍需|有待|争议|矛盾|局限",
    re.IGNORECASE,
)


@dataclass
class Part:
    """What one section of a report split into sub-questions is written from: its heading (the
    sub-question), its sources, what they were searched with (`focus`, which its evidence is ranked
    and gated against), the phrase of the evidence it asks about, and deep research's follow-ups."""

    title: str
    sources: list[FusedResult]
    focus: str = ""
    phrase: str = ""
    children: list[Part] = field(default_factory=list)

    @property
    def every_source(self) -> list[FusedResult]:
        return self.sources + [s for child in self.children for s in child.every_source]


@dataclass(frozen=True)
class Asked:
    """What a request asks of its report's form besides the question (custom and subtopic reports)."""

    custom_prompt: str | None = None
    parent_query: str | None = None
    existing_headers: tuple[str, ...] = ()


@dataclass
class Item:
    """A point of a list, with its sub-points; both Markdown already."""

    text: str
    subs: list[str] = field(default_factory=list)


# what a section is in its report's form, for a writer that writes it anew (the model's, report/sections.py):
# the answer, introduction and conclusion sum up the others; findings and open questions are written from
# passages, points as a list; entries (an annotated bibliography's) are the extractive writer's only
Role = Literal["answer", "introduction", "findings", "open_questions", "points", "conclusion", "entries"]


@dataclass(frozen=True)
class Basis:
    """What a section was written from: its role, what its evidence was ranked against (`focus`), the
    sources it was drawn from, and the passages its sentences quote (the most relevant first)."""

    role: Role
    focus: str
    sources: Sequence[FusedResult] = ()
    quoted: Sequence[Evidence] = ()


@dataclass
class Block:
    """A section: its heading (Markdown already, outside text escaped), paragraphs, points, subsections,
    and what it was written from (None: an entry of a bibliography, nothing another writer rewrites)."""

    heading: str
    level: int = 2
    paragraphs: list[str] = field(default_factory=list)
    items: list[Item] = field(default_factory=list)
    children: list[Block] = field(default_factory=list)
    basis: Basis | None = None


def citation_marks(sources: Sequence[FusedResult], citations: Citations) -> tuple[str, list[int]]:
    """Each source's citation, a link to it when it has a URL, and the numbers cited (each once)."""
    marks, numbers = [], []
    for source in sources:
        number = citations.cite(source)
        if number not in numbers:
            numbers.append(number)
            marks.append(f"[[{number}]]({link_target(source.href)})" if is_url(source.href) else f"[{number}]")
    return "".join(marks), numbers


def cite(claim: Claim, citations: Citations) -> str:
    """The claim followed by its citations."""
    return f"{inline_text(claim.text)} {citation_marks(claim.sources, citations)[0]}"


def _likeness(sources: Sequence[Sequence[Claim]]) -> np.ndarray:
    """How alike each two sources' claims are: the cosine of their mean sentence vectors, or without
    vectors 2.5 × the Jaccard of their words (Jaccard runs lower than cosine)."""
    vectors = [[c.vector for c in claims if c.vector is not None] for claims in sources]
    if all(len(found) == len(claims) for found, claims in zip(vectors, sources, strict=True)):
        means = np.array([np.mean(found, axis=0) for found in vectors])
        means /= np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-12)
        return np.asarray(means @ means.T)
    words = [set(terms(" ".join(c.text for c in claims))) for claims in sources]
    return np.array([[2.5 * jaccard(a, b) for b in words] for a in words])


def themes_of(
    claims: Sequence[Claim], limit: int = _MAX_THEMES, threshold: float = _THEME_LIKENESS
) -> list[list[Claim]]:
    """Claims grouped by meaning, a source's claims always together: sources clustered by average
    linkage (the two themes whose sources are most alike on average merge, while that average is at
    least `threshold` or there are more than `limit` themes). Unlike joining each claim to the theme
    whose first claim it is most like, the grouping does not depend on the order claims come in, and
    a theme is about what all its sources share, not what its first sentence says. Themes keep the
    claims' order, and come in the order of their first claim."""
    by_source: dict[str, list[Claim]] = {}
    for claim in claims:
        by_source.setdefault(claim.source.key, []).append(claim)
    units = list(by_source.values())
    if not units:
        return []
    likeness = _likeness(units)
    groups: list[list[int]] = [[i] for i in range(len(units))]
    while len(groups) > 1:
        pairs = ((a, b) for a in range(len(groups)) for b in range(a + 1, len(groups)))
        a, b = max(pairs, key=lambda p: float(likeness[np.ix_(groups[p[0]], groups[p[1]])].mean()))
        if likeness[np.ix_(groups[a], groups[b])].mean() < threshold and len(groups) <= limit:
            break
        groups[a] += groups.pop(b)
    order = {id(claim): at for at, claim in enumerate(claims)}
    themes = [sorted((c for i in group for c in units[i]), key=lambda c: order[id(c)]) for group in groups]
    return sorted(themes, key=lambda theme: order[id(theme[0])])


def coverage_lines(outcomes: Sequence[RetrieverOutcome], labels: Labels = ENGLISH) -> list[str]:
    """How each retriever fared, in the report's language (an upstream's own error as it said it)."""
    lines = []
    for outcome in outcomes:
        if outcome.status is RetrieverStatus.done:
            ms = f"{outcome.elapsed_ms:.0f}"
            lines.append(labels.searched_line.format(name=outcome.name, count=outcome.count, ms=ms))
        else:
            status = labels.statuses.get(outcome.status.value, outcome.status.value)
            lines.append(labels.failed_line.format(name=outcome.name, status=status, error=outcome.error))
    return lines


@dataclass
class Writing:
    """Everything a writer needs besides the sources: fetched pages, the encoder, the language."""

    pages: dict[str, list[Section]] = field(default_factory=dict)
    embed: Embed | None = None
    # how many of the user's passages hold each English word: a Chinese question is read in the
    # senses its library uses (library/crosslingual.py); None outside a user's task
    term_counts: Counts | None = field(default=None, repr=False)
    language: str | None = None
    citation_style: str | None = None  # CSL style of the References (None: CITATION_STYLE's default, APA)
    support_threshold: float = 0.5  # REPORT_SUPPORT_THRESHOLD: what the verifier counts as supported
    work: WorkPool | None = None  # the threads it is written on (None: asyncio's default pool)
    # time.monotonic() by which a model must have finished, so that the extractive writer can still
    # finish the report before the task's time is up (None: no such limit)
    deadline: float | None = None
    passages: dict[str, list[Chunk]] = field(default_factory=dict, repr=False)  # `pages` cut, by source key


@dataclass(frozen=True)
class Brief:
    """What a report is written from, whichever writer writes it: the question and its type, the
    sources (fused, best first), how each retriever fared, the pages read and the writer's options,
    for a report split into sub-questions each one's own sources, and what else the request asks."""

    question: str
    report_type: ReportType
    sources: list[FusedResult]
    outcomes: Sequence[RetrieverOutcome] = ()
    writing: Writing = field(default_factory=Writing)
    parts: Sequence[Part] = ()
    asked: Asked = field(default_factory=Asked)

    @property
    def every_source(self) -> list[FusedResult]:
        """The sources, then those of the parts that are not among them."""
        return self.sources + [s for part in self.parts for s in part.every_source if s not in self.sources]


@dataclass
class Pool:
    """The evidence that bears on one question: its passages best first, and how many sources bear."""

    ranked: list[Ranked]
    bearing: int
    searched: int


def _says_nothing(chinese: str) -> bool:
    """A Chinese word one of whose first sense's readings is only words that make no heading (同一
    "identical; the same", 更多 "more")."""
    words = dictionary()
    senses = words.senses(chinese)[:1] if words is not None else []
    for reading in (part for sense in senses for part in sense.split(";")):
        english = [word for word in re.findall(r"[a-z]+", reading) if word not in STOPWORDS]
        if all(word in WEAK_WORDS for word in english):
            return True
    return not senses


def _as_written(phrase: str, claims: Sequence[Claim]) -> str:
    """`phrase` (lowercase) as the claims write it where they capitalize more than its first letter
    ("RankNet", "MS MARCO"), else as it is."""
    for claim in claims:
        found = re.search(rf"\b{re.escape(phrase)}\b", claim.text, re.IGNORECASE)
        if found and any(letter.isupper() for letter in found.group()[1:]):
            return found.group()
    return phrase


def _key(text: str) -> str:
    return " ".join(re.sub(r"\W+", " ", text.lower()).split())


class Draft:
    """One report being written: its citations, its language, the sentences it has stated."""

    def __init__(self, brief: Brief) -> None:
        self.brief = brief
        self.writing = brief.writing
        self.labels = labels_for(brief.question, brief.writing.language)
        self.citations = Citations()
        self.stated: set[str] = set()
        self.headings: set[str] = set()
        self.phrases: list[str] = []  # the phrases headings were made of, in order
        self.foreign = False  # a sentence in another language than the report's was quoted
        self.common: Counter[str] | None = None  # phrases by how many of the report's sources use them
        self.titles = [_key(s.title) for s in brief.every_source if s.title.strip()]

    def pool(self, question: str, sources: Sequence[FusedResult]) -> Pool:
        """The passages of `sources` that bear on `question` (the relevance gate), best first."""
        passages = gather(sources, self.writing.pages, self.writing.passages)
        ranked = rank(question, passages, self.writing.embed, self.writing.term_counts)
        keys = bearing(ranked)
        return Pool([r for r in ranked if r.evidence.source.key in keys], len(keys), len({s.key for s in sources}))

    def claims(self, question: str, pool: Pool, budget: int, per_source: int = 3) -> list[Claim]:
        """Up to `budget` sentences of the pool not stated yet, the best and most varied first."""
        if budget <= 0 or not pool.ranked:
            return []
        # more passages than sentences wanted: a sentence several sources state is found in each (cited together)
        chosen = diversify(pool.ranked, k=max(2 * budget, 8), per_source=per_source)
        picked = select_claims(question, chosen, max_claims=budget + len(self.stated))
        return [c for c in picked if _key(c.text) not in self.stated][:budget]

    def sentence(self, claim: Claim) -> str:
        """The claim as the report states it: attributed where it does not say whose it is, marked
        where it is in another language than the report's, then its citations."""
        self.stated.add(_key(claim.text))
        text = attributed(claim.text, claim.source, self.labels.your_note)
        # quoted as it is; the report says so once (a mark on each sentence would split none for the verifier)
        self.foreign = self.foreign or is_chinese(text) != (self.labels.code == "zh")
        return f"{inline_text(text)} {citation_marks(claim.sources, self.citations)[0]}"

    def paragraphs(self, claims: Sequence[Claim]) -> list[str]:
        """One paragraph per source, its sentences in the source's own order."""
        by_source: dict[str, list[Claim]] = {}
        for claim in claims:
            by_source.setdefault(claim.source.key, []).append(claim)
        ordered = (sorted(group, key=lambda c: (c.evidence.position, c.position)) for group in by_source.values())
        return [" ".join(self.sentence(c) for c in group) for group in ordered]

    def heading(self, claims: Sequence[Claim], question: str) -> str:
        """A phrase the theme's sources share (whole words, never a piece of a source's title), in
        the report's language; else the language's "Further findings".

        Phrases are ranked by how many of the theme's sources state them in the quoted sentences,
        then by how many of them use them at all, then by how many of the report's sources do (a
        term of the field, not a chance pair). A theme of several sources is named only by a phrase
        two of its sources state, or one states and half of them use: never by what one paragraph
        of four says."""
        asked = asked_words(question)
        # an English report's headings are English (Chinese is quoted, not a heading)
        english = self.labels.code != "zh"
        by_source: dict[str, list[Claim]] = {}
        for claim in claims:
            by_source.setdefault(claim.source.key, []).append(claim)
        stated: Counter[str] = Counter()  # by sources whose quoted sentences hold the phrase
        used: Counter[str] = Counter()  # by sources that hold it anywhere
        shown: dict[str, str] = {}  # each phrase's first form in the sentences
        for group in by_source.values():
            said = evidence_phrases([" ".join(c.text for c in group)], asked)
            for phrase in said:
                if english and has_cjk(phrase):
                    continue
                shown.setdefault(stemmed(phrase), phrase)
            stated.update({stemmed(p) for p in said})
            used.update({stemmed(p) for p in evidence_phrases([group[0].source.body, *(c.text for c in group)], asked)})
        if self.common is None:
            self.common = Counter()
            for source in self.brief.every_source:
                self.common.update({stemmed(p) for p in evidence_phrases([source.body], set())})
        sources, common = len(by_source), self.common
        texts = " ".join(c.text.lower() for c in claims)
        ranked = sorted(shown, key=lambda key: (-stated[key], -used[key], -common[key], key))
        for key in ranked:
            # one source: a term other sources of the report use too
            several = stated[key] >= 2 or used[key] >= max(2, (sources + 1) // 2)
            if not (common[key] >= 2 if sources == 1 else several):
                continue
            phrase = shown[key]
            if self._named_badly(phrase, texts):
                continue
            self.phrases.append(phrase)
            written = _as_written(phrase, claims)
            if english:  # a heading's first letter; a Chinese heading quotes the term as written (关于“input rankings”)
                written = written[0].upper() + written[1:]
            return inline_text(self.labels.about.format(phrase=written))
        return inline_text(self.labels.more_findings)

    def _named_badly(self, phrase: str, texts: str) -> bool:
        """A phrase that makes no heading: a weak word, a heading already given, a piece of a title,
        or a subject and its verb rather than a term."""
        weak = set(phrase.split()) & WEAK_WORDS or any(word.endswith("ly") for word in phrase.split())
        weak = weak or (has_cjk(phrase) and _says_nothing(phrase))
        if weak or phrase in self.phrases or any(phrase in title for title in self.titles):
            return True
        return subject_and_verb(phrase, texts)

    def themes(
        self,
        question: str,
        claims: Sequence[Claim],
        sources: Sequence[FusedResult],
        level: int = 2,
        skip: Callable[[str], bool] | None = None,
        following: bool = False,
    ) -> list[Block]:
        """Sections by theme, of evidence drawn from `sources`; `skip` leaves out a theme by its
        heading (before any of it is cited)."""
        blocks: list[Block] = []
        for heading, group, focus in _named(self, themes_of(claims), question, following=following):
            if skip is None or not skip(heading):
                basis = Basis("findings", focus, sources, _quoted(group))
                blocks.append(Block(heading, level, self.paragraphs(group), basis=basis))
        return blocks

    def open_questions(self, question: str, pool: Pool) -> tuple[list[str], list[Evidence]]:
        """Sentences of the evidence that dispute, limit or leave open, not stated yet, and the
        questions the user's own notes ask about what the report asks (no finding, yet open); and
        the passages that hold such sentences, stated or not."""
        candidates = select_claims(question, diversify(pool.ranked, k=40, per_source=4), max_claims=80)
        disputing = [c for c in candidates if _OPEN.search(c.text)]
        found = [c for c in disputing if _key(c.text) not in self.stated][:4]
        asked, notes = self.notes_ask(question, pool)
        return self.paragraphs(found) + asked, [*_quoted(disputing)[:8], *notes]

    def notes_ask(self, question: str, pool: Pool, most: int = 2) -> tuple[list[str], list[Evidence]]:
        """The questions of the user's notes that share a term with `question`, quoted as theirs,
        and the passages they are in."""
        wanted = question_terms(question)
        asked: list[str] = []
        passages: list[Evidence] = []
        for ranked in pool.ranked:
            source = ranked.evidence.source
            if not users_own(source):
                continue
            said = [" ".join(sentence.split()) for sentence in split_sentences(ranked.evidence.text)]
            for at, sentence in enumerate(said):
                if not sentence.endswith(("?", "？")) or _key(sentence) in self.stated:
                    continue
                if not wanted & set(terms(sentence)):
                    continue
                self.stated.add(_key(sentence))
                marks = citation_marks([source], self.citations)[0]
                line = f"{inline_text(self.labels.your_question.format(text=sentence))} {marks}"
                if at + 1 < len(said) and note_fragment(said[at + 1]):  # "…? Worth measuring first."
                    line += f" {inline_text(self.labels.your_note.format(text=said[at + 1]))} {marks}"
                asked.append(line)
                if ranked.evidence not in passages:
                    passages.append(ranked.evidence)
                if len(asked) >= most:
                    return asked, passages
        return asked, passages

    def notice(self, pool: Pool) -> list[str]:
        """What the report says when little or nothing bears on its question."""
        if pool.bearing == 0:
            return [self.labels.none_bear.format(searched=pool.searched)] if pool.searched else [self.labels.nothing]
        if pool.bearing < 3:
            return [self.labels.only_some.format(count=pool.bearing, searched=pool.searched)]
        return []


def _quoted(claims: Sequence[Claim]) -> list[Evidence]:
    """The passages the claims are sentences of, each once, in the claims' order."""
    return list({id(c.evidence): c.evidence for c in claims}.values())


def _budget(pool: Pool, rich: int, thin: int) -> int:
    return rich if pool.bearing >= 10 else thin


def _research(draft: Draft, brief: Brief, context: dict[str, Any]) -> None:
    """A direct answer first, themed sections, disagreements and open questions, a conclusion."""
    labels, question = draft.labels, brief.question
    pool = draft.pool(question, brief.sources)
    context["lead"] = draft.notice(pool)
    if not pool.bearing:
        return
    claims = draft.claims(question, pool, _budget(pool, 40, 24))
    first = claims[:_ANSWER_CLAIMS]
    answer = Block(
        inline_text(labels.answer),
        paragraphs=[" ".join(draft.sentence(c) for c in first)],
        basis=Basis("answer", question, brief.sources, _quoted(first)),
    )
    blocks = [answer, *draft.themes(question, claims[_ANSWER_CLAIMS:], brief.sources)]
    if pool.bearing >= 3:
        disputed, disputing = draft.open_questions(question, pool)
        basis = Basis("open_questions", question, brief.sources, disputing)
        blocks.append(
            Block(inline_text(labels.open_questions), paragraphs=disputed or [labels.no_disagreement], basis=basis)
        )
    closing = [labels.intro_research.format(count=pool.bearing, searched=pool.searched)]
    if draft.phrases:
        themes = [f"“{p}”" if labels.code == "zh" else p for p in draft.phrases]  # evidence's words, quoted in Chinese
        closing.append(labels.conclusion_text.format(themes=joined(themes, labels)))
    basis = Basis("conclusion", question, brief.sources)
    blocks.append(Block(inline_text(labels.conclusion), paragraphs=[inline_text(" ".join(closing))], basis=basis))
    context["blocks"] = blocks


def _about(pool: Pool, phrase: str) -> Pool:
    """The pool's passages that say what a sub-question asks about (`phrase`, plural or not): a section
    on "Condorcet fusion" quotes what bears on Condorcet fusion, not whatever else its search found
    that bears on the report's question. A sub-question without a phrase (the model's) keeps all."""
    if not phrase:
        return pool
    saying = [r for r in pool.ranked if says(r.evidence.text, phrase)]
    return Pool(saying, len({r.evidence.source.key for r in saying}), pool.searched)  # none: no section to pad


def _plain(markdown: str) -> str:
    return re.sub(r"\\(.)", r"\1", markdown)


def _parts(draft: Draft, parts: Sequence[Part], level: int, budget: int, child_budget: int) -> list[Block]:
    """A section per sub-question, its evidence gated against it; deep research's follow-ups inside."""
    blocks = []
    for part in parts:
        focus = part.focus or part.title
        pool = _about(draft.pool(focus, part.sources), part.phrase)
        claims = draft.claims(focus, pool, budget, per_source=2)
        paragraphs = draft.paragraphs(claims)  # cited in reading order
        children = _parts(draft, part.children, level + 1, child_budget, max(2, child_budget // 2))
        if paragraphs or children:  # a sub-question nothing bears on gets no section to pad
            basis = Basis("findings", focus, part.sources, _quoted(claims))
            blocks.append(Block(inline_text(part.title), level, paragraphs, children=children, basis=basis))
    return blocks


def _split(draft: Draft, brief: Brief, context: dict[str, Any], deep: bool) -> None:
    """The detailed report (and deep research): an introduction with the answer's lead, one section
    per sub-question (deep: with its follow-ups), a conclusion."""
    labels, question = draft.labels, brief.question
    pool = draft.pool(question, brief.sources)
    context["lead"] = draft.notice(pool)
    if not pool.bearing and not brief.parts:
        return
    if not brief.parts:  # no sub-questions could be planned: themes stand in for them
        _research(draft, brief, context)
        return
    leading = draft.claims(question, pool, 3)
    lead = " ".join(draft.sentence(c) for c in leading)  # cited before the sections
    sections = _parts(draft, brief.parts, 2, 16 if deep else 12, 6)
    questions = [_plain(block.heading) for block in sections]
    # what bears on the question that no sub-question's section quoted, by theme after them: the
    # themes a sub-question asks about already left out
    asked = {word[:4] for heading in questions for word in re.findall(r"\w+", heading.lower())}

    def covered(heading: str) -> bool:
        words = re.findall(r"\w+", _plain(heading).lower())
        return bool(words) and not has_cjk(heading) and all(word[:4] in asked for word in words)

    rest = draft.claims(question, pool, _budget(pool, 24, 12))
    sections += draft.themes(question, rest, brief.sources, skip=covered, following=bool(sections))
    cited = len(draft.citations.references)
    intro = labels.intro_parts.format(count=cited, questions=" ".join(questions))
    if not sections:
        intro = labels.intro_research.format(count=pool.bearing, searched=pool.searched)
    introduction = Block(
        inline_text(labels.introduction),
        paragraphs=[inline_text(intro)] + ([lead] if lead else []),
        basis=Basis("introduction", question, brief.sources, _quoted(leading)),
    )
    if deep:
        follow_ups = _count(brief.parts) - len(brief.parts)
        levels = 1 + _depth(brief.parts)
        said = labels.deep_levels.format(levels=levels, queries=follow_ups)
        if labels.code == "en":  # "1 follow-up search", not "1 follow-up searches"
            said = re.sub(r"\b1 (level|follow-up search)(?:e?s)\b", r"1 \1", said)
        context["lead"] = [*context["lead"], said]
    cited = len(draft.citations.references)
    closing = [labels.conclusion_parts.format(count=cited)] if sections else []
    last = draft.claims(question, pool, 2)
    if last:
        closing.append(" ".join(draft.sentence(c) for c in last))
    conclusion = Block(
        inline_text(labels.conclusion),
        paragraphs=closing,
        basis=Basis("conclusion", question, brief.sources, _quoted(last)),
    )
    context["blocks"] = [introduction, *sections] + ([conclusion] if closing else [])


def _count(parts: Sequence[Part]) -> int:
    return sum(1 + _count(part.children) for part in parts)


def _depth(parts: Sequence[Part]) -> int:
    return max((1 + _depth(part.children) if part.children else 0 for part in parts), default=0)


def _detailed(draft: Draft, brief: Brief, context: dict[str, Any]) -> None:
    _split(draft, brief, context, deep=False)


def _deep(draft: Draft, brief: Brief, context: dict[str, Any]) -> None:
    _split(draft, brief, context, deep=True)


def _outline(draft: Draft, brief: Brief, context: dict[str, Any]) -> None:
    """Numbered sections by theme, each point a finding with its sources, a source's further
    findings as its sub-points."""
    question = brief.question
    context["title"] = f"{draft.labels.outline}{draft.labels.colon}{question}"
    pool = draft.pool(question, brief.sources)
    context["lead"] = draft.notice(pool)
    claims = draft.claims(question, pool, 18)
    blocks = []
    for number, (named, group, focus) in enumerate(_named(draft, themes_of(claims), question), start=1):
        heading = f"{number}. {named}"
        by_source: dict[str, list[Claim]] = {}
        for claim in group:
            by_source.setdefault(claim.source.key, []).append(claim)
        items = []
        for point, found in enumerate(by_source.values(), start=1):
            first, *rest = sorted(found, key=lambda c: (c.evidence.position, c.position))
            items.append(Item(f"{number}.{point} {draft.sentence(first)}", [draft.sentence(c) for c in rest]))
        blocks.append(Block(heading, items=items, basis=Basis("points", focus, brief.sources, _quoted(group))))
    context["blocks"] = blocks


def _named(
    draft: Draft,
    groups: Sequence[list[Claim]],
    question: str,
    claims_of: Callable[[list[Claim]], list[Claim]] = lambda group: group,
    following: bool = False,
) -> list[tuple[str, list[Claim], str]]:
    """Each theme with its heading and what it is about (its phrase and the question); the themes no
    term names together, last, as one section: "Further findings", or "Findings" where no theme is
    named and no section comes before them (`following`: the sections of sub-questions do)."""
    further = inline_text(draft.labels.more_findings)
    named: list[tuple[str, list[Claim], str]] = []
    unnamed: list[Claim] = []
    for group in groups:
        heading = draft.heading(claims_of(group), question)
        if heading == further:
            unnamed.extend(group)
        else:
            named.append((heading, group, f"{draft.phrases[-1]} {question}"))
    if not unnamed:
        return named
    alone = not named and not following
    return [*named, (inline_text(draft.labels.findings) if alone else further, unnamed, question)]


def _resources(draft: Draft, brief: Brief, context: dict[str, Any]) -> None:
    """An annotated bibliography of the sources that bear on the question, grouped by theme: each
    source's full entry and the one or two of its sentences that say most about the question."""
    question, labels = brief.question, draft.labels
    context["title"] = f"{labels.resources}{labels.colon}{question}"
    pool = draft.pool(question, brief.sources)
    context["lead"] = draft.notice(pool)
    order = list(dict.fromkeys(r.evidence.source.key for r in pool.ranked))[:20]
    offers: list[tuple[FusedResult, list[Claim]]] = []
    offered: set[str] = set(draft.stated)
    for key in order:
        own = [r for r in pool.ranked if r.evidence.source.key == key]
        best = [c for c in select_claims(question, own[:4], max_claims=2) if _key(c.text) not in offered]
        offered.update(_key(c.text) for c in best)  # a sentence two sources hold is offered by the first
        if best:
            offers.append((own[0].evidence.source, best))
    groups = themes_of([claims[0] for _, claims in offers])
    of_claim = {id(claims[0]): (source, claims) for source, claims in offers}
    blocks = []

    def expanded(group: list[Claim]) -> list[Claim]:  # a theme's sources' sentences, not only their first
        return [c for first in group for c in of_claim[id(first)][1]]

    for heading, group, _ in _named(draft, groups, question, expanded):
        entries = []
        for first in group:
            source, claims = of_claim[id(first)]
            number = draft.citations.cite(source)
            title = inline_text(display_title(source))
            link = f"[{title}]({link_target(source.href)})" if is_url(source.href) else title
            in_order = sorted(claims, key=lambda c: (c.evidence.position, c.position))  # as the source says them
            said = " ".join(draft.sentence(c) for c in in_order)
            found_by = f"*{labels.found_by}: {inline_text(', '.join(source.retrievers))}.*"
            entry = Block(f"{link} [{number}]", 3, [p for p in (_entry(source), said, found_by) if p])
            entries.append(entry)
        blocks.append(Block(heading, children=entries))
    context["blocks"] = blocks


def _entry(source: FusedResult) -> str:
    """Who wrote it, when, where, and where to find it, as far as the source says."""
    meta = source.metadata
    parts = [inline_text(authors_year(source) or (str(meta["year"]) if meta.get("year") else ""))]
    for key in ("venue", "journal", "paper_title"):
        if meta.get(key):
            parts.append(f"*{inline_text(meta[key])}*")
            break
    if meta.get("doi"):
        parts.append(f"doi:{inline_text(meta['doi'])}")
    elif not is_url(source.href):  # a link is the entry's heading already
        parts.append(inline_text(source.href))
    return " · ".join(p for p in parts if p)


def _custom(draft: Draft, brief: Brief, context: dict[str, Any]) -> None:
    """As the custom prompt asks, within what quoting can do: its form, length and focus; a notice
    names what it asks that the offline writer cannot do."""
    labels = draft.labels
    ask = read_custom_prompt(brief.asked.custom_prompt)
    notes = []
    if ask.followed:
        notes.append(labels.followed.format(items="; ".join(ask.followed)))
    if ask.unmet:
        notes.append(labels.could_not_follow.format(items="; ".join(ask.unmet)))
    context["writer_notes"] = [inline_text(note) for note in notes]  # the offline writer's, not the report's
    if ask.layout == "outline":
        _outline(draft, brief, context)
    elif ask.layout == "resources":
        _resources(draft, brief, context)
    else:
        question = f"{brief.question} {ask.focus}" if ask.focus else brief.question
        pool = draft.pool(question, brief.sources)
        context["lead"] = draft.notice(pool)
        budget = max(2, round(ask.words / _WORDS_A_CLAIM)) if ask.words else _budget(pool, 30, 20)
        claims = draft.claims(question, pool, budget)
        if ask.layout == "bullets":
            basis = Basis("points", question, brief.sources, _quoted(claims))
            items = [Item(draft.sentence(c)) for c in claims]
            context["blocks"] = [Block(inline_text(labels.answer), items=items, basis=basis)]
        else:
            context["blocks"] = draft.themes(question, claims, brief.sources) if claims else []


def _subtopic(draft: Draft, brief: Brief, context: dict[str, Any]) -> None:
    """One subtopic of `parent_query`: themed sections on it, leaving out those the sections already
    written (`existing_headers`, `draft_section_titles`) cover."""
    labels, question = draft.labels, brief.question
    parent = brief.asked.parent_query
    pool = draft.pool(question, brief.sources)
    lead = [inline_text(labels.subtopic_of.format(parent=parent))] if parent and parent != question else []
    context["lead"] = lead + draft.notice(pool)
    written = [set(terms(header)) for header in brief.asked.existing_headers if header.strip()]
    claims = [
        c for c in draft.claims(question, pool, 24) if not any(jaccard(set(terms(c.text)), h) > 0.5 for h in written)
    ]
    skipped: list[str] = []

    def covered(heading: str) -> bool:
        words = set(terms(_plain(heading)))
        if any(jaccard(words, header) >= 0.5 for header in written):
            skipped.append(_plain(heading))
            return True
        return False

    blocks = draft.themes(question, claims, brief.sources, skip=covered)
    if skipped:
        context["lead"] = [*context["lead"], inline_text(labels.skipped_headers.format(items=joined(skipped, labels)))]
    context["blocks"] = blocks


LAYOUTS: dict[Layout, Callable[[Draft, Brief, dict[str, Any]], None]] = {
    "research": _research,
    "detailed": _detailed,
    "deep": _deep,
    "outline": _outline,
    "resources": _resources,
    "custom": _custom,
    "subtopic": _subtopic,
}


def draft_report(brief: Brief) -> tuple[Draft, dict[str, Any]]:
    """The report laid out in its type's form, not yet rendered: the draft (its citations) and the
    template's context (`title`, `lead`, `blocks`, and `writer_notes`: what the extractive writer
    says of its own writing, such as the parts of a custom prompt it could not follow)."""
    draft = Draft(brief)
    context: dict[str, Any] = {
        "title": brief.question,
        "lead": [],
        "blocks": [],
        "writer_notes": [],
        "coverage": coverage_lines(brief.outcomes, draft.labels),
        "labels": draft.labels,
        "citation_style": brief.writing.citation_style,
    }
    LAYOUTS[form_of(brief.report_type).layout](draft, brief, context)
    return draft, context


def render_blocks(blocks: Sequence[Block]) -> str:
    """Sections as the report renders them, subsections included."""
    return TEMPLATES.get_template(BLOCKS_TEMPLATE).render(blocks=blocks)


def without_children(block: Block) -> Block:
    return replace(block, children=[])


def write_report(brief: Brief) -> tuple[str, list[Reference]]:
    """The report's markdown and the references it cites, in citation order."""
    draft, context = draft_report(brief)
    labels: Labels = draft.labels
    context["lead"] = [*context["writer_notes"], *context["lead"]]
    if draft.foreign:
        context["lead"] = [*context["lead"], labels.foreign]
    if not context["blocks"] and not context["lead"]:
        context["lead"] = [labels.nothing + "."]
    context["references"] = draft.citations.references
    markdown = TEMPLATES.get_template(REPORT_TEMPLATE).render(**context)
    return markdown, draft.citations.references


__all__ = [
    "TEMPLATES",
    "Asked",
    "Basis",
    "Block",
    "Brief",
    "Labels",
    "Part",
    "Role",
    "Writing",
    "citation_marks",
    "draft_report",
    "render_blocks",
    "write_report",
]
