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


_CHARS_PER_TOKEN = 12  # a passage's character bound, per token of `size`: generous for any language


def _bounded(sentence: str, size: int, limit: int) -> list[str]:
    """`sentence` cut into pieces of at most `size` words and `limit` characters.

    Text without sentence ends (a 10 MB log, a table dump) is one "sentence": whole, it would be
    one passage served whole by every API.
    """
    if len(sentence) <= limit and len(tokens(sentence)) <= size:
        return [sentence]
    pieces: list[str] = []
    words = [word[start : start + limit] for word in sentence.split() for start in range(0, len(word), limit)]
    window: list[str] = []
    length = 0
    for word in words:
        if window and (len(window) >= size or length + len(word) + 1 > limit):
            pieces.append(" ".join(window))
            window, length = [], 0
        window.append(word)
        length += len(word) + 1
    if window:
        pieces.append(" ".join(window))
    return pieces


def _chars(window: list[tuple[str, int]]) -> int:
    return sum(len(sentence) + 1 for sentence, _ in window)


def _overlap(window: list[tuple[str, int]], overlap: int) -> tuple[list[tuple[str, int]], int]:
    """The window's last sentences, up to `overlap` tokens and their share of characters, to repeat."""
    kept: list[tuple[str, int]] = []
    count = 0
    for item in reversed(window):
        if count + item[1] > overlap or _chars(kept) + len(item[0]) > overlap * _CHARS_PER_TOKEN:
            break
        kept.insert(0, item)
        count += item[1]
    return kept, count


def chunk_sections(sections: list[Section], size: int = 220, overlap: int = 40) -> list[Chunk]:
    """Passages of at most `size` tokens and `size * _CHARS_PER_TOKEN` characters, overlap included."""
    chunks: list[Chunk] = []
    limit = size * _CHARS_PER_TOKEN
    piece_limit = (size - overlap) * _CHARS_PER_TOKEN  # room for the overlap repeated in front of it
    for section in sections:
        window: list[tuple[str, int]] = []
        count = 0
        for sentence in split_sentences(section.text):
            for piece in _bounded(sentence, size, piece_limit):
                length = max(1, len(tokens(piece)))
                if window and (count + length > size or _chars(window) + len(piece) > limit):
                    chunks.append(Chunk(" ".join(s for s, _ in window), section.heading, section.page, len(chunks)))
                    window, count = _overlap(window, overlap)
                window.append((piece, length))
                count += length
        if window:
            chunks.append(Chunk(" ".join(s for s, _ in window), section.heading, section.page, len(chunks)))
    return chunks
