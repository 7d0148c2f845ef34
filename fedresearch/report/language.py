"""The report's language: the question's own, unless the request names one; its headings, section names
and the words around the quotations (introductions, conclusions, notices) are written in it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from fedresearch.core.text import cjk_bigrams


@dataclass(frozen=True)
class Labels:
    code: str
    searched: str
    nothing: str
    resources: str
    outline: str
    found_by: str
    references: str  # the References section's heading (report/citations.py renders the section)
    answer: str
    introduction: str
    conclusion: str
    open_questions: str
    more_findings: str  # a theme's heading when its evidence shares no phrase
    findings: str  # the same where no theme is named and no section comes before it
    about: str  # a heading from a phrase of the evidence: "{phrase}"
    sub_questions: tuple[str, ...]  # sub-questions about a phrase of the evidence, in turn
    follow_up: str  # a deeper level's follow-up question about a phrase
    only_some: str  # thin evidence: {count} of {searched} sources bear on the question
    none_bear: str
    intro_research: str
    intro_parts: str
    conclusion_text: str
    conclusion_parts: str
    no_disagreement: str
    your_note: str  # a user's note, quoted: {text}
    your_question: str  # a question the user's note asks, quoted: {text}
    foreign: str  # said once, atop a report that quotes evidence in another language as it is
    could_not_follow: str
    followed: str
    subtopic_of: str
    skipped_headers: str
    deep_levels: str
    section_fallback: str  # atop a section the model could not write, which quotes its sources instead
    list_and: str  # how a list's last item is joined
    list_sep: str
    colon: str
    searched_line: str  # a retriever that answered: {name}, {count} results, {ms}
    failed_line: str  # one that did not: {name}, {status}, {error}
    statuses: dict[str, str] = field(default_factory=dict)  # RetrieverStatus values, as the report says them


ENGLISH = Labels(
    code="en",
    searched_line="{name}: {count} results in {ms} ms",
    failed_line="{name}: {status} — {error}",
    searched="Sources searched",
    nothing="No source answered this question",
    resources="Resources",
    outline="Outline",
    found_by="Found by",
    references="References",
    answer="Answer",
    introduction="Introduction",
    conclusion="Conclusion",
    open_questions="Disagreements and open questions",
    more_findings="Further findings",
    findings="Findings",
    about="{phrase}",
    sub_questions=(
        "What is known about {phrase}?",
        "What evidence is there on {phrase}?",
        "What role does {phrase} play here?",
        "How is {phrase} studied?",
        "What do the sources report on {phrase}?",
    ),
    follow_up="What more is known about {phrase} in {parent}?",
    only_some="Only {count} of the {searched} sources found bear on this question, so this report is short.",
    none_bear="None of the {searched} sources found bears on this question, so there is nothing to report.",
    intro_research="{count} of the {searched} sources found bear on this question; this report quotes them.",
    intro_parts="This report answers the question in sub-questions, from {count} sources that bear on it: {questions}",
    conclusion_text="The sources that bear on this question speak to {themes}.",
    conclusion_parts="Taken together, the sections above rest on {count} sources that bear on the question.",
    no_disagreement="No source found here disputes another, and none names an open question.",
    your_note="Your note says: “{text}”",
    your_question="Your note asks: “{text}”",
    foreign="Some sources are in another language: their sentences are quoted as they are, untranslated.",
    could_not_follow="The offline writer could not follow this part of the custom prompt: {items}.",
    followed="Written as the custom prompt asks: {items}.",
    subtopic_of="A subtopic of “{parent}”.",
    skipped_headers="Left out, as sections already written cover it: {items}.",
    deep_levels="Deep research: {levels} levels, {queries} follow-up searches.",
    section_fallback="The model could not write this section; it quotes the sources directly.",
    list_and=" and ",
    list_sep=", ",
    colon=": ",
)
CHINESE = Labels(
    code="zh",
    searched_line="{name}：{count} 条结果，用时 {ms} 毫秒",
    failed_line="{name}：{status} — {error}",
    statuses={"failed": "失败", "skipped": "跳过"},
    searched="检索的来源",
    nothing="没有来源回答这个问题",
    resources="资源",
    outline="提纲",
    found_by="来源检索器",
    references="参考文献",
    answer="回答",
    introduction="引言",
    conclusion="结论",
    open_questions="分歧与未决问题",
    more_findings="其他发现",
    findings="主要发现",
    about="关于“{phrase}”",
    sub_questions=(
        "关于“{phrase}”，已知什么？",
        "有哪些关于“{phrase}”的证据？",
        "“{phrase}”在这里起什么作用？",
        "“{phrase}”是如何研究的？",
        "来源对“{phrase}”有何报道？",
    ),
    follow_up="在“{parent}”方面，关于“{phrase}”还知道什么？",
    only_some="检索到的 {searched} 个来源中只有 {count} 个与这个问题相关，因此本报告较短。",
    none_bear="检索到的 {searched} 个来源都与这个问题无关，因此没有可报告的内容。",
    intro_research="检索到的 {searched} 个来源中有 {count} 个与这个问题相关；本报告引用它们的原文。",
    intro_parts="本报告通过以下子问题回答这个问题，依据 {count} 个相关来源：{questions}",
    conclusion_text="与这个问题相关的来源涉及：{themes}。",
    conclusion_parts="以上各部分共依据 {count} 个与这个问题相关的来源。",
    no_disagreement="这里找到的来源之间没有相互矛盾之处，也没有来源指出未决问题。",
    your_note="你的笔记写道：“{text}”",
    your_question="你的笔记问道：“{text}”",
    foreign="部分来源为其他语言（如英文）：其句子按原文引用，未经翻译。",
    could_not_follow="离线写作器无法按照自定义要求的这一部分写作：{items}。",
    followed="按自定义要求写作：{items}。",
    subtopic_of="“{parent}”的一个子主题。",
    skipped_headers="已写章节涵盖的内容未重复：{items}。",
    deep_levels="深度研究：{levels} 层，{queries} 次后续检索。",
    section_fallback="模型未能写出本节；本节直接引用来源原文。",
    list_and="和",
    list_sep="、",
    colon="：",
)
_NAMES = {
    "en": ENGLISH,
    "english": ENGLISH,
    "zh": CHINESE,
    "zh-cn": CHINESE,
    "zh-hans": CHINESE,
    "chinese": CHINESE,
    "中文": CHINESE,
    "简体中文": CHINESE,
}


# the References block's heading in every language a report is written in
REFERENCES_HEADING = re.compile(r"\n## (?:" + "|".join(re.escape(x.references) for x in (ENGLISH, CHINESE)) + r")\s*\n")


def joined(items: list[str], labels: Labels) -> str:
    """A list in prose: "a, b and c" ("a、b和c")."""
    if len(items) <= 1:
        return "".join(items)
    return labels.list_sep.join(items[:-1]) + labels.list_and + items[-1]


def is_chinese(text: str) -> bool:
    """Mostly CJK characters among its letters."""
    letters = [c for c in text if c.isalpha()]
    cjk = sum(1 for c in letters if cjk_bigrams(c))
    return bool(letters) and cjk / len(letters) > 0.3


def labels_for(question: str, language: str | None) -> Labels:
    """`language` as GPT-Researcher clients send it ("english", "chinese", "zh"...), else the
    question's script: a question mostly in CJK characters is answered in Chinese."""
    if language:
        named = _NAMES.get(language.strip().lower())
        if named is not None:
            return named
    return CHINESE if is_chinese(question) else ENGLISH
