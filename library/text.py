"""Text helpers shared by indexing and querying: CJK bigrams and approximate token counts."""

from __future__ import annotations

import re

_CJK_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af]+")
_TOKEN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af]|\w+")


def cjk_bigrams(text: str) -> list[str]:
    """Overlapping character bigrams of every CJK run (a lone character stands for itself)."""
    grams: list[str] = []
    for run in _CJK_RUN.findall(text):
        if len(run) == 1:
            grams.append(run)
        grams.extend(run[i : i + 2] for i in range(len(run) - 1))
    return grams


def tokens(text: str) -> list[str]:
    """Words and single CJK characters: a rough token unit for chunk sizes."""
    return _TOKEN.findall(text)
