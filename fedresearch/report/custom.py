"""What a `custom_report`'s prompt asks that extraction can do: a form (bullets, an outline, a list of
sources, a report), a length, a focus; and what it asks that quoting sources cannot do (a table, a
tone, a translation, an opinion...), which the report and a notice frame name instead of ignoring."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_WORDS_ASKED = re.compile(
    r"(?:at most|up to|under|about|around|no more than|max(?:imum)?|within)?\s*(\d{2,5})\s*(?:words|字)"
)
_FOCUS = re.compile(
    r"(?:focus(?:ing|ed)?\s+(?:only\s+)?on|concentrat\w*\s+on|especially|with emphasis on|emphasi[sz]e|"
    r"重点(?:关注|是)?|侧重|关注)\s*[:：]?\s*([^.;。；\n]{3,120})",
    re.IGNORECASE,
)
# what a quoting writer can shape: (words that ask for it, its form, how the notice names it)
_FORMS = (
    (("bullet", "bullets", "bullet points", "list", "要点", "列表"), "bullets", "bullet points"),
    (("outline", "提纲", "大纲"), "outline", "an outline"),
    (("bibliography", "annotated", "resources", "reading list", "参考书目", "资源"), "resources", "a list of sources"),
)
_SHORT = ("short", "brief", "concise", "summary only", "简短", "简要", "简洁")
_LONG = ("long", "detailed", "in depth", "in-depth", "comprehensive", "详细", "深入")
# what it cannot do: quoting sources writes no table, takes no tone, translates nothing, judges nothing
_CANNOT = (
    (("table", "表格"), "a table"),
    (("chart", "graph", "diagram", "figure", "图表"), "a chart or diagram"),
    (("tone", "style", "humor", "humour", "funny", "formal", "informal", "casual", "语气", "风格"), "a tone or style"),
    (("poem", "rhyme", "haiku", "story", "诗"), "a poem or story"),
    (("translate", "translation", "in french", "in german", "in spanish", "in japanese", "翻译"), "a translation"),
    (("opinion", "recommend", "recommendation", "persuade", "persuasive", "argue", "建议", "观点"), "an opinion"),
    (("code", "python", "javascript", "sql", "代码"), "code"),
)  # fmt: skip


@dataclass
class CustomAsk:
    """A custom prompt as the offline writer can follow it."""

    layout: str = "research"  # research, bullets, outline or resources
    words: int | None = None  # the length asked, in words
    focus: str | None = None  # what to rank the evidence against besides the question
    followed: list[str] = field(default_factory=list)
    unmet: list[str] = field(default_factory=list)


def _has(text: str, words: tuple[str, ...]) -> bool:
    return any(re.search(rf"(?<![a-z]){re.escape(word)}(?![a-z])", text) for word in words)


def read_custom_prompt(prompt: str | None) -> CustomAsk:
    ask = CustomAsk()
    if not prompt:
        return ask
    text = " ".join(prompt.lower().split())
    for words, layout, name in _FORMS:
        if _has(text, words):
            ask.layout, ask.followed = layout, [*ask.followed, name]
            break
    asked = _WORDS_ASKED.search(text)
    if asked is not None:
        ask.words = max(50, min(int(asked.group(1)), 3000))
        ask.followed.append(f"about {ask.words} words")
    elif _has(text, _SHORT):
        ask.words = 250
        ask.followed.append("short")
    elif _has(text, _LONG):
        ask.words = 1500
        ask.followed.append("long")
    focus = _FOCUS.search(prompt)
    if focus is not None:
        ask.focus = " ".join(focus.group(1).split())
        ask.followed.append(f"focused on “{ask.focus}”")
    ask.unmet = [name for words, name in _CANNOT if _has(text, words)]
    if not ask.followed and not ask.unmet:
        ask.unmet.append("the prompt as a whole (it names no form, length or focus the offline writer knows)")
    return ask
