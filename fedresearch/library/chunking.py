"""Split sections into passages of about `size` tokens with `overlap`, never across sections."""

from __future__ import annotations

from dataclasses import dataclass

from fedresearch.core.text import split_sentences, tokens
from fedresearch.library.formats import Section


@dataclass(frozen=True)
class Chunk:
    text: str
    heading: str
    page: int | None
    position: int


def chunk_sections(sections: list[Section], size: int = 220, overlap: int = 40) -> list[Chunk]:
    chunks: list[Chunk] = []
    for section in sections:
        window: list[tuple[str, int]] = []
        count = 0
        for sentence in split_sentences(section.text):
            length = max(1, len(tokens(sentence)))
            if window and count + length > size:
                chunks.append(Chunk(" ".join(s for s, _ in window), section.heading, section.page, len(chunks)))
                kept: list[tuple[str, int]] = []
                kept_count = 0
                for item in reversed(window):
                    if kept_count + item[1] > overlap:
                        break
                    kept.insert(0, item)
                    kept_count += item[1]
                window, count = kept, kept_count
            window.append((sentence, length))
            count += length
        if window:
            chunks.append(Chunk(" ".join(s for s, _ in window), section.heading, section.page, len(chunks)))
    return chunks
