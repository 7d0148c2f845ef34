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


def _bounded(sentence: str, size: int, limit: int) -> list[tuple[str, int]]:
    """`sentence` cut into pieces of at most `size` words and `limit` characters, each with its
    token count (at least 1).

    Text without sentence ends (a 10 MB log, a table dump) is one "sentence": whole, it would be
    one passage served whole by every API.
    """
    if len(sentence) <= limit:
        count = len(tokens(sentence))
        if count <= size:
            return [(sentence, max(1, count))]
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
    return [(piece, max(1, len(tokens(piece)))) for piece in pieces]


def _overlap(window: list[tuple[str, int]], overlap: int) -> tuple[list[tuple[str, int]], int, int]:
    """The window's last sentences, up to `overlap` tokens and their share of characters, to repeat,
    with their token and character counts."""
    kept: list[tuple[str, int]] = []
    count = chars = 0
    for item in reversed(window):
        if count + item[1] > overlap or chars + len(item[0]) > overlap * _CHARS_PER_TOKEN:
            break
        kept.insert(0, item)
        count += item[1]
        chars += len(item[0]) + 1
    return kept, count, chars


def chunk_sections(sections: list[Section], size: int = 220, overlap: int = 40) -> list[Chunk]:
    """Passages of at most `size` tokens and `size * _CHARS_PER_TOKEN` characters, overlap included."""
    chunks: list[Chunk] = []
    limit = size * _CHARS_PER_TOKEN
    piece_limit = (size - overlap) * _CHARS_PER_TOKEN  # room for the overlap repeated in front of it
    for section in sections:
        window: list[tuple[str, int]] = []
        count = chars = 0  # the window's tokens, and its characters with a space after each piece
        for sentence in split_sentences(section.text):
            # each sentence's tokens counted once, the window's characters kept as it grows: counted
            # again for every piece, they took most of a report's time on pages read (stop 30)
            for piece, length in _bounded(sentence, size, piece_limit):
                if window and (count + length > size or chars + len(piece) > limit):
                    chunks.append(Chunk(" ".join(s for s, _ in window), section.heading, section.page, len(chunks)))
                    window, count, chars = _overlap(window, overlap)
                window.append((piece, length))
                count += length
                chars += len(piece) + 1
        if window:
            chunks.append(Chunk(" ".join(s for s, _ in window), section.heading, section.page, len(chunks)))
    return chunks
