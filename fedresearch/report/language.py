"""The report's language: the question's own, unless the request names one; headings follow it."""

from __future__ import annotations

from dataclasses import dataclass

from fedresearch.core.text import cjk_bigrams


@dataclass(frozen=True)
class Labels:
    code: str
    summary: str
    question: str
    searched: str
    nothing: str
    nothing_searched: str
    resources: str
    outline: str
    found_by: str
    kinds: dict[str, str]


ENGLISH = Labels(
    code="en",
    summary="Summary",
    question="Question",
    searched="Sources searched",
    nothing="No source answered this question",
    nothing_searched="No source answered this question, though {count} were searched",
    resources="Resources",
    outline="Outline",
    found_by="Found by",
    kinds={
        "library": "From your library",
        "knowledge": "From your knowledge bases",
        "scholarly": "From the scholarly record",
        "web": "From the web",
    },
)
CHINESE = Labels(
    code="zh",
    summary="摘要",
    question="问题",
    searched="检索的来源",
    nothing="没有来源回答这个问题",
    nothing_searched="检索了 {count} 个来源，但没有来源回答这个问题",
    resources="资源",
    outline="提纲",
    found_by="来源检索器",
    kinds={"library": "来自你的文献库", "knowledge": "来自你的知识库", "scholarly": "来自学术文献", "web": "来自网络"},
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


def labels_for(question: str, language: str | None) -> Labels:
    """`language` as GPT-Researcher clients send it ("english", "chinese", "zh"...), else the
    question's script: a question mostly in CJK characters is answered in Chinese."""
    if language:
        named = _NAMES.get(language.strip().lower())
        if named is not None:
            return named
    letters = [c for c in question if c.isalpha()]
    cjk = sum(1 for c in letters if cjk_bigrams(c))
    return CHINESE if letters and cjk / len(letters) > 0.3 else ENGLISH
