"""What the model is asked, one section of a report at a time, each request fitted to its `Budget`
(report/tokens.py): a section of findings with the numbered passages chosen for it, as many as fit
(the most relevant first, the first cut to fit when even it does not); a section that sums the
others up (an answer, an introduction, a conclusion) with their drafts, each cut to its share.

The model sees only passages (or drafts) each introduced by its marker `[n]`, and is told to end
every sentence that states a fact with the markers of those that state it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedresearch.core.models import ReportType
from fedresearch.report.evidence import Evidence
from fedresearch.report.sections import PlannedSection
from fedresearch.report.tokens import Budget, cut_to_tokens, message_tokens, text_tokens
from fedresearch.report.writer import Asked, Role

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

PASSAGE_CHARS = 900  # of a passage, what the model is shown (and what its sentences are checked against)
SECTION_PASSAGES = 8  # the most a section is written from: enough for a few paragraphs, few enough to stay on topic
_LEAST_PASSAGE_TOKENS = 60  # a passage cut shorter than this says too little to write from
_LANGUAGES = {"en": "English", "zh": "Simplified Chinese"}
_RULES = (
    "End every sentence that states a fact with the marker of each {what} that states it, exactly as "
    "numbered, e.g. [2] or [1][3]. Never cite a number that is not listed; never add facts, figures or names "
    "the {whats} do not state; if they do not answer something, say so. No title, no heading for the section, "
    "no reference list, no URLs. Separate paragraphs with a blank line. Write in {language}."
)
_ASKS: dict[Role, str] = {
    "findings": "Write this section: two or three paragraphs on what the passages say about its topic, "
    "leaving to the other sections what their headings cover.",
    "open_questions": "Write this section: where the passages disagree with each other, what they leave open "
    "and what limits their findings. If they show no disagreement and leave nothing open, say so in one sentence.",
    "points": "Write this section as a list only: `- ` points, each one finding ending with its markers, and "
    "indented `  - ` sub-points where a point needs them.",
    "answer": "Write the report's answer, which comes before its other sections: one short paragraph that "
    "answers the question directly.",
    "introduction": "Write the report's introduction, which comes before its other sections: one short paragraph "
    "on what the question asks and what the report finds.",
    "conclusion": "Write the report's conclusion, which comes after its other sections: one short paragraph on "
    "what they together show and what remains open.",
}


@dataclass(frozen=True)
class Draft:
    """A section as drafted, for the sections that sum it up: its title and its sentences, each with
    the numbers of the sources it cites (as the summing request numbers them)."""

    title: str
    sentences: Sequence[tuple[str, Sequence[int]]]


def seen_text(passage: Evidence) -> str:
    """The passage as the model is shown it (and as its sentences are checked against)."""
    return " ".join(passage.text.split())[:PASSAGE_CHARS]


def passage_line(number: int, passage: Evidence, text: str | None = None) -> str:
    title = " ".join(passage.source.title.split())[:160]
    text = seen_text(passage) if text is None else text
    return f"[{number}] ({title}) {text}" if title else f"[{number}] {text}"


def language_name(code: str) -> str:
    return _LANGUAGES.get(code, code)


def asked_of_model(report_type: ReportType, asked: Asked) -> str:
    """What the request asks of the report besides its form (a custom prompt; a subtopic's main
    question and the sections written already), as every section's request says it."""
    said = []
    if report_type is ReportType.custom_report and asked.custom_prompt:
        said.append(f"The user asks, within those rules: {' '.join(asked.custom_prompt.split())[:2000]}")
    if report_type is ReportType.subtopic_report:
        if asked.parent_query:
            said.append(
                f"The report is on its question as one subtopic of: {' '.join(asked.parent_query.split())[:500]}"
            )
        if asked.existing_headers:
            written = "; ".join(" ".join(h.split())[:120] for h in asked.existing_headers[:30])
            said.append(f"Leave out what these sections, written already, cover: {written}")
    return " ".join(said)


def section_messages(
    question: str,
    section: PlannedSection,
    outline: Sequence[str],
    candidates: Sequence[Evidence],
    language: str,
    asked: str,
    budget: Budget,
) -> tuple[list[ChatCompletionMessageParam], list[Evidence]]:
    """The request for a section of findings (or points, or open questions) and the passages it
    holds, numbered from 1 in that order: of `candidates` (best first), as many as fit `budget`, at
    most SECTION_PASSAGES; none when not even a cut one fits. `outline`: every section's title, so
    that each leaves the others' topics to them (left out when the budget is too small for it)."""
    system = " ".join(
        part
        for part in (
            "You write one section of a research report, using only the numbered evidence passages you are given.",
            _RULES.format(what="passage", whats="passages", language=language_name(language)),
            _ASKS[section.role],
            asked,
        )
        if part
    )

    def messages(lines: Sequence[str], listed: bool = True) -> list[ChatCompletionMessageParam]:
        parts = [f"Question: {question}"]
        if listed and outline:
            parts.append("The report's sections: " + "; ".join(outline))
        parts += [f"This section: {section.title}", "Evidence passages:", "\n\n".join(lines)]
        return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]

    listed = budget.fits(messages([]))
    left = budget.prompt - message_tokens(messages([], listed))
    lines: list[str] = []
    held: list[Evidence] = []
    for passage in candidates:
        if len(held) >= SECTION_PASSAGES:
            break
        line = passage_line(len(held) + 1, passage)
        cost = text_tokens(line) + 1  # and the blank line before the next
        if cost > left and not held:  # the best passage alone is too long: its start, if that says enough
            room = left - text_tokens(passage_line(1, passage, "")) - 1
            if room < _LEAST_PASSAGE_TOKENS:
                break
            line = passage_line(1, passage, cut_to_tokens(seen_text(passage), room))
            cost = text_tokens(line) + 1
        if cost > left:
            break
        lines.append(line)
        held.append(passage)
        left -= cost
    while held and not budget.fits(messages(lines, listed)):  # counted piece by piece above: checked whole
        lines.pop()
        held.pop()
    return messages(lines, listed), held


def summary_messages(
    question: str, section: PlannedSection, drafts: Sequence[Draft], language: str, asked: str, budget: Budget
) -> tuple[list[ChatCompletionMessageParam], int]:
    """The request for a section that sums up the others (`drafts`, in the report's order), each
    draft cut to its share of `budget` at a sentence's end; and how many drafts it holds (none when
    not even one sentence fits)."""
    system = " ".join(
        part
        for part in (
            "You write one section of a research report from drafts of its other sections, using only what the "
            "drafts state. Each draft sentence ends with the numbers of the sources it rests on.",
            _RULES.format(what="source", whats="drafts", language=language_name(language)),
            _ASKS[section.role],
            asked,
        )
        if part
    )

    def messages(texts: Sequence[str]) -> list[ChatCompletionMessageParam]:
        user = f"Question: {question}\n\nDrafts of the report's sections:\n\n" + "\n\n".join(texts)
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    shown = [d for d in drafts if d.sentences]
    left = budget.prompt - message_tokens(messages([]))
    texts = []
    for index, draft in enumerate(shown):
        share = left // (len(shown) - index)  # what one draft leaves unused, the next may use
        text = f"### {draft.title}\n"
        for sentence, numbers in draft.sentences:
            said = f"{sentence} {''.join(f'[{n}]' for n in numbers)}".rstrip() + " "
            if text_tokens(text + said) + 2 > share:
                break
            text += said
        if text_tokens(text) + 2 <= share and text.endswith(" "):
            texts.append(text.rstrip())
            left -= text_tokens(text) + 2
    return messages(texts), len(texts)
