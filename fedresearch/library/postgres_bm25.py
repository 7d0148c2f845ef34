"""BM25 on PostgreSQL from posting blocks, ranked as the embedded store's tantivy index ranks.

A passage's terms are made in Python by the very analyzers the embedded index uses (fulltext.py:
tantivy's simple tokenizer, long words out, lowercase, the project's stopwords, the English
stemmer; CJK bigrams as words), so both stores see the same terms.

library_postings holds each (user, field, term)'s postings in blocks of at most BLOCK, one row
each: the passages' ids (int64), the term's frequency in each (uint16) and each passage's length as
tantivy keeps it (its one-byte fieldnorm id), packed little-endian in one bytea. A term's document
frequency is the sum of its blocks' counts; library_users holds the user's passage and token counts.

A search reads every block of the question's terms in one statement and scores every posting in
numpy: tantivy's Okapi BM25 (k1 1.2, b 0.75, idf ln(1 + (N - df + 0.5) / (df + 0.5)), the average
length the user's tokens over passages), exact, over all the user's passages. Reading the postings
row by row and pruning (MaxScore) cost a long question 30 ms p50 and 0.7 s p99 at 100k passages, a
cap on the postings read per term (the best first) lost 4 of the top 10 there; with blocks BM25
took 3-6 ms p50 and 9-15 ms p99 there (docs/benchmarks.md).

A write appends its postings to each term's last block while it has room (read, extended, written
back in the writing transaction), then in new blocks (a bulk load writes only full blocks until its
end); a removed passage's postings are cut out of the blocks that hold them. Passage ids grow with
every write of a user (its writers take turns), so a term's blocks hold its postings in id order;
nothing depends on it but where new ones go.
"""

from __future__ import annotations

import bisect
import functools
import math
import struct
from array import array
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import psycopg
import tantivy
from psycopg.rows import tuple_row

from fedresearch.core.text import cjk_bigrams
from fedresearch.library.fulltext import _analyzers
from fedresearch.library.search import indexed_texts

BODY, CJK = 0, 1  # library_postings.field: the English body, the CJK bigrams
K1, B = 1.2, 0.75  # tantivy's
# Postings a block holds at most: a block of a common term is 11 KB (TOASTed); a write appends to
# the last block while it has room, so a small write rewrites at most this many postings per term.
BLOCK = 1024
TF_MAX = 65_535  # a term frequency's width (uint16); a passage is at most 2,640 characters
# A filtered search checks its best passages against the filters in rounds: the first 4 x limit;
# when fewer than `limit` pass, every passage the filters allow is read if there are at most this
# many (then the ranking is masked at once), else rounds 8 times larger.
ALLOWED_AT_MOST = 50_000

_ID, _TF, _NORM = np.dtype("<i8"), np.dtype("<u2"), np.dtype("u1")
POSTING_BYTES = _ID.itemsize + _TF.itemsize + _NORM.itemsize
Key = tuple[int, str]  # (field, term)


@functools.cache
def english_analyzer() -> tantivy.TextAnalyzer:
    """The embedded index's English analyzer (fulltext.py): one, shared by every thread."""
    return _analyzers()["en_stem"]


def _fieldnorms() -> list[int]:
    """tantivy's fieldnorm buckets (as Lucene's): lengths 0-40 exact, then eight steps per
    doubling of the step (42, 44 ... 56, 60 ... 88, 96 ...); 256 of them."""
    table = list(range(41))
    step = 2
    while len(table) < 256:
        for _ in range(8):
            if len(table) < 256:
                table.append(table[-1] + step)
        step *= 2
    return table


_FIELDNORM_LIST = _fieldnorms()
FIELDNORMS = np.array(_FIELDNORM_LIST, dtype=np.int64)


def fieldnorm_id(length: int) -> int:
    """tantivy's one-byte id of a length of `length` tokens: its bucket."""
    return bisect.bisect_right(_FIELDNORM_LIST, length) - 1


def fieldnorm(length: int) -> int:
    """The length tantivy scores a passage of `length` tokens by: its bucket's lower bound."""
    return _FIELDNORM_LIST[fieldnorm_id(length)]


@dataclass(frozen=True)
class PassageTerms:
    """One passage's terms per field (term: frequency) and its lengths in tokens."""

    body: Counter[str]
    cjk: Counter[str]
    body_length: int
    cjk_length: int

    @classmethod
    def of(cls, title: str, heading: str, text: str) -> PassageTerms:
        body, cjk = indexed_texts(title, heading, text)
        body_tokens = english_analyzer().analyze(body)
        cjk_tokens = cjk.split()
        return cls(Counter(body_tokens), Counter(cjk_tokens), len(body_tokens), len(cjk_tokens))

    @property
    def count(self) -> int:
        """Its postings."""
        return len(self.body) + len(self.cjk)

    def terms(self) -> list[Key]:
        """(field, term) of each of its postings."""
        return [(BODY, t) for t in self.body] + [(CJK, t) for t in self.cjk]


def encode(passages: np.ndarray, tf: np.ndarray, norm: np.ndarray) -> bytes:
    """A block's bytes: the passage ids, then the frequencies, then the fieldnorm ids."""
    return (
        passages.astype(_ID, copy=False).tobytes()
        + tf.astype(_TF, copy=False).tobytes()
        + norm.astype(_NORM, copy=False).tobytes()
    )


def decode(data: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(passage ids, frequencies, fieldnorm ids) of a block, as views of its bytes."""
    n = len(data) // POSTING_BYTES
    return (
        np.frombuffer(data, _ID, n),
        np.frombuffer(data, _TF, n, _ID.itemsize * n),
        np.frombuffer(data, _NORM, n, (_ID.itemsize + _TF.itemsize) * n),
    )


class Postings:
    """A write's postings, gathered passage by passage, then written as blocks (`write`)."""

    def __init__(self) -> None:
        self._names: list[Key] = []  # each key's (field, term), by its number
        self._numbers: dict[int, dict[str, int]] = {BODY: {}, CJK: {}}  # and back, by field
        self._read: set[int] = set()  # keys whose last block in the database is taken in (or none is)
        self._fresh = False  # the user held no block when the writes began
        self._start()

    def _start(self, tail: tuple[np.ndarray, ...] = ()) -> None:
        self._keys, self._passages, self._tf, self._norm = array("q"), array("q"), array("q"), array("q")
        # kept from the last write (not final): key, passage, tf, norm, sorted by key then passage
        self._tail = tail or tuple(np.zeros(0, dtype=np.int64) for _ in range(4))
        self.passages = self.body_tokens = self.cjk_tokens = 0

    def add(self, passage: int, terms: PassageTerms) -> None:
        for field, counts, length in ((BODY, terms.body, terms.body_length), (CJK, terms.cjk, terms.cjk_length)):
            if counts:
                numbers = self._numbers[field]
                keys: list[int | None] = list(map(numbers.get, counts))
                if None in keys:  # terms new to this write
                    for i, term in enumerate(counts):
                        if keys[i] is None:
                            keys[i] = numbers[term] = len(self._names)
                            self._names.append((field, term))
                self._keys.extend(keys)  # type: ignore[arg-type]  # None no more
                self._tf.extend(counts.values())
                self._passages.extend([passage] * len(counts))
                self._norm.extend([fieldnorm_id(length)] * len(counts))
        self.passages += 1
        self.body_tokens += terms.body_length
        self.cjk_tokens += terms.cjk_length

    def write(self, db: psycopg.Connection[Any], user_id: str, first_write: bool, final: bool = True) -> None:
        """Into the user's blocks (each term's last block extended while it has room, then new
        ones), and the passages gathered since the last write into the user's counts.
        `first_write`: the user holds no block. Not `final` (a bulk load's writes but its last):
        each term's postings past its last full block stay gathered for the next write, so no block
        is written twice in one transaction (a block rewritten at each of a million passages' 50
        writes left 50 dead versions for every later lookup of it: the load fell from 5,300
        passages/s at 120k to 1,950)."""
        if not self.passages and not len(self._keys) and not len(self._tail[0]):
            return
        self._fresh = self._fresh or first_write
        names = self._names
        keys, passages, tf, norm = (
            np.frombuffer(a, dtype=np.int64) for a in (self._keys, self._passages, self._tf, self._norm)
        )
        present = np.unique(keys).tolist()
        unread = [] if self._fresh else [names[k] for k in present if k not in self._read]
        last = _last_blocks(db, user_id, unread) if unread else {}
        self._read.update(present)
        if last:
            held = [decode(data) for _, data in last.values()]
            counts = [len(ids) for ids, _, _ in held]
            which = np.array([self._numbers[field][term] for field, term in last], dtype=np.int64)
            keys = np.concatenate([np.repeat(which, counts), keys])
            passages, tf, norm = (
                np.concatenate([*(h[i] for h in held), mine]) for i, mine in enumerate((passages, tf, norm))
            )
        order = np.lexsort((passages, keys))
        mine = (keys[order], passages[order], np.minimum(tf[order], TF_MAX), norm[order])
        keys, passages, tf, norm = (np.concatenate([t, m]) for t, m in zip(self._tail, mine, strict=True))
        if len(self._tail[0]):  # two sorted runs: a stable sort merges them in one pass
            if _packable(keys, passages):
                order = np.argsort(keys * (1 << 40) + passages, kind="stable")
            else:
                order = np.lexsort((passages, keys))
            keys, passages, tf, norm = keys[order], passages[order], tf[order], norm[order]
        kept = np.zeros(len(keys), dtype=bool) if final else _past_full_blocks(keys)
        rows = _blocks(names, keys[~kept], passages[~kept], tf[~kept], norm[~kept])
        _delete_blocks(db, user_id, [(field, term, low) for (field, term), (low, _) in last.items()])
        _copy_blocks(db, user_id, rows)
        _count(db, user_id, self.passages, self.body_tokens, self.cjk_tokens)
        if final:  # the last blocks written may have room: the next write reads them
            self._start()
            self._read.clear()
            self._fresh = False
        else:
            self._start((keys[kept], passages[kept], tf[kept], norm[kept]))


def _packable(keys: np.ndarray, passages: np.ndarray) -> bool:
    """Whether (key, passage) fit one int64 as key * 2**40 + passage."""
    return bool(keys.max(initial=0) < 1 << 22 and passages.min(initial=0) >= 0 and passages.max(initial=0) < 1 << 40)


def _past_full_blocks(keys: np.ndarray) -> np.ndarray:
    """Which postings (sorted by key) lie past their key's last full block of BLOCK."""
    if not len(keys):
        return np.zeros(0, dtype=bool)
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
    lengths = np.diff(np.concatenate([starts, [len(keys)]]))
    position = np.arange(len(keys)) - np.repeat(starts, lengths)
    return position >= np.repeat(lengths // BLOCK * BLOCK, lengths)


Block = tuple[int, str, int, int, int, bytes]  # field, term, low, high, postings, data


def _blocks(
    names: Sequence[Key], keys: np.ndarray, passages: np.ndarray, tf: np.ndarray, norm: np.ndarray
) -> list[Block]:
    """Blocks of at most BLOCK postings of postings sorted by key (an index into `names`), then passage."""
    if not len(keys):
        return []
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
    ends = np.concatenate([starts[1:], [len(keys)]])
    pieces = (ends - starts + BLOCK - 1) // BLOCK  # blocks per term
    term = np.repeat(np.arange(len(starts)), pieces)
    first = starts[term] + (np.arange(len(term)) - np.repeat(np.cumsum(pieces) - pieces, pieces)) * BLOCK
    last = np.minimum(first + BLOCK, ends[term])
    ids, tfs, norms = passages.astype(_ID).tobytes(), tf.astype(_TF).tobytes(), norm.astype(_NORM).tobytes()
    a, b = _ID.itemsize, _TF.itemsize
    rows = []
    for key, start, end, low, high in zip(
        keys[first].tolist(),
        first.tolist(),
        last.tolist(),
        passages[first].tolist(),
        passages[last - 1].tolist(),
        strict=True,
    ):
        field, word = names[key]
        data = ids[a * start : a * end] + tfs[b * start : b * end] + norms[start:end]
        rows.append((field, word, low, high, end - start, data))
    return rows


_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + bytes(8)  # binary COPY: signature, no flags, no extension
_FIELD = {field: struct.pack(">ih", 2, field) for field in (BODY, CJK)}
_BLOCK_TAIL = struct.Struct(">iqiqiii")  # low, high, postings (each with its length), the data's length


def _copy_blocks(db: psycopg.Connection[Any], user_id: str, blocks: Sequence[Block]) -> None:
    """The blocks into library_postings through one binary COPY, its rows packed here (psycopg's
    write_row took 14 us a row)."""
    if not blocks:
        return
    user = user_id.encode()
    head = struct.pack(">hi", 7, len(user)) + user
    with (
        db.cursor() as cursor,
        cursor.copy(
            "COPY library_postings (user_id, field, term, low, high, postings, data) FROM STDIN (FORMAT BINARY)"
        ) as copy,
    ):
        parts = [_COPY_SIGNATURE]
        size = 0
        for field, term, low, high, count, data in blocks:
            word = term.encode()
            parts += [head, _FIELD[field], len(word).to_bytes(4, "big"), word]
            parts += [_BLOCK_TAIL.pack(8, low, 8, high, 4, count, len(data)), data]
            size += len(data) + len(word) + 60
            if size > 8 << 20:
                copy.write(b"".join(parts))
                parts, size = [], 0
        parts.append(b"\xff\xff")
        copy.write(b"".join(parts))


def _delete_blocks(db: psycopg.Connection[Any], user_id: str, blocks: Sequence[tuple[int, str, int]]) -> None:
    """Delete these blocks, (field, term, low) each."""
    if blocks:
        db.execute(
            "DELETE FROM library_postings WHERE user_id = %s AND (field, term, low) IN"
            " (SELECT * FROM unnest(%s::int2[], %s::text[], %s::int8[]))",
            (user_id, [b[0] for b in blocks], [b[1] for b in blocks], [b[2] for b in blocks]),
        )


def _last_blocks(db: psycopg.Connection[Any], user_id: str, keys: Sequence[Key]) -> dict[Key, tuple[int, bytes]]:
    """The last block (low, data) of each of these terms that has room for more."""
    with db.cursor(binary=True, row_factory=tuple_row) as cursor:
        rows = cursor.execute(
            "SELECT q.field, q.term, b.low, b.data FROM unnest(%s::int2[], %s::text[]) AS q(field, term)"
            " CROSS JOIN LATERAL (SELECT low, postings, data FROM library_postings WHERE user_id = %s"
            " AND field = q.field AND term = q.term ORDER BY low DESC LIMIT 1) b WHERE b.postings < %s",
            ([k[0] for k in keys], [k[1] for k in keys], user_id, BLOCK),
        ).fetchall()
    return {(field, term): (low, bytes(data)) for field, term, low, data in rows}


def remove(db: psycopg.Connection[Any], user_id: str, gone: Sequence[tuple[int, PassageTerms]]) -> int:
    """Cut these passages' postings (passage id, its terms as made now) out of the blocks holding
    them, and take them out of the user's counts; how many postings were cut."""
    if not gone:
        return 0
    ids = np.array(sorted(passage for passage, _ in gone), dtype=np.int64)
    keys = sorted({key for _, terms in gone for key in terms.terms()})
    with db.cursor(binary=True, row_factory=tuple_row) as cursor:
        blocks = cursor.execute(
            "SELECT field, term, low, data FROM library_postings WHERE user_id = %s AND (field, term) IN"
            " (SELECT * FROM unnest(%s::int2[], %s::text[])) AND low <= %s AND high >= %s",
            (user_id, [k[0] for k in keys], [k[1] for k in keys], int(ids[-1]), int(ids[0])),
        ).fetchall()
    cut = _cut(db, user_id, blocks, ids)
    made = [terms for _, terms in gone]
    _count(db, user_id, -len(made), -sum(t.body_length for t in made), -sum(t.cjk_length for t in made))
    return cut


def remove_by_scan(db: psycopg.Connection[Any], user_id: str, ids: Sequence[int]) -> int:
    """Cut every posting of these passages out of the user's blocks whatever its term (a scan of
    the user's blocks in their id range: for postings made by another analyzer than today's)."""
    wanted = np.array(sorted(ids), dtype=np.int64)
    if not len(wanted):
        return 0
    with db.cursor(binary=True, row_factory=tuple_row) as cursor:
        blocks = cursor.execute(
            "SELECT field, term, low, data FROM library_postings WHERE user_id = %s AND low <= %s AND high >= %s",
            (user_id, int(wanted[-1]), int(wanted[0])),
        ).fetchall()
    return _cut(db, user_id, blocks, wanted)


def _cut(
    db: psycopg.Connection[Any], user_id: str, blocks: Iterable[tuple[int, str, int, bytes]], ids: np.ndarray
) -> int:
    """Cut the postings of passages `ids` out of these blocks (field, term, low, data): each block
    that held one is written again without them, or deleted when none is left; how many were cut."""
    cut, deleted, rows = 0, [], []
    for field, term, low, data in blocks:
        passages, tf, norm = decode(bytes(data))
        keep = ~np.isin(passages, ids, assume_unique=True)
        if keep.all():
            continue
        cut += int(len(keep) - keep.sum())
        deleted.append((field, term, low))
        if keep.any():
            kept = passages[keep]
            rows.append((field, term, int(kept[0]), int(kept[-1]), len(kept), encode(kept, tf[keep], norm[keep])))
    _delete_blocks(db, user_id, deleted)
    _copy_blocks(db, user_id, rows)
    return cut


def _count(db: psycopg.Connection[Any], user_id: str, passages: int, body_tokens: int, cjk_tokens: int) -> None:
    """Add these passages and tokens (or take them away: negative) to the user's counts."""
    db.execute(
        "UPDATE library_users SET passages = passages + %s, body_tokens = body_tokens + %s,"
        " cjk_tokens = cjk_tokens + %s WHERE user_id = %s",
        (passages, body_tokens, cjk_tokens, user_id),
    )


def query_terms(query: str) -> list[Key]:
    """(field, term) of a query, each once, as fulltext.FullTextIndex.search makes them."""
    asked = [(BODY, t) for t in dict.fromkeys(english_analyzer().analyze(query))]
    return asked + [(CJK, g) for g in dict.fromkeys(cjk_bigrams(query))]


class Narrow(Protocol):
    """Which passages a search's kind and filters allow."""

    def among(self, db: psycopg.Connection[Any], ids: np.ndarray) -> np.ndarray:
        """Those of `ids` allowed (an int64 array)."""
        ...

    def every(self, db: psycopg.Connection[Any], at_most: int) -> np.ndarray | None:
        """Every allowed passage of the user, when there are at most `at_most` (else None)."""
        ...


def search(
    db: psycopg.Connection[Any], user_id: str, query: str, narrow: Narrow | None, limit: int
) -> list[tuple[int, float]]:
    """(passage id, BM25 score) of the user's best `limit` passages, best first (ties by id);
    `narrow` keeps the passages a search's kind and filters allow (None: all)."""
    asked = query_terms(query)
    if not asked or limit <= 0:
        return []
    with db.cursor(binary=True, row_factory=tuple_row) as cursor:
        user = cursor.execute(
            "SELECT passages, body_tokens, cjk_tokens FROM library_users WHERE user_id = %s", (user_id,)
        ).fetchone()
        if user is None or not user[0]:
            return []
        rows = cursor.execute(
            "SELECT field, term, data FROM library_postings WHERE user_id = %s AND (field, term) IN"
            " (SELECT * FROM unnest(%s::int2[], %s::text[]))",
            (user_id, [f for f, _ in asked], [t for _, t in asked]),
        ).fetchall()
    if not rows:
        return []
    ids, scores = _scores(rows, int(user[0]), {BODY: int(user[1]), CJK: int(user[2])})
    if narrow is None:
        return [(int(ids[i]), float(scores[i])) for i in _best(ids, scores, limit)]
    return _narrowed(db, narrow, ids, scores, limit)


def _scores(
    rows: Sequence[tuple[int, str, bytes]], total: int, tokens: dict[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """(passage ids, their BM25 scores) of every passage holding one of the terms whose blocks are `rows`."""
    blocks: defaultdict[Key, list[bytes]] = defaultdict(list)
    for field, term, data in rows:
        blocks[(field, term)].append(data)
    # what a fieldnorm id makes of k1 * (1 - b + b * length / average), per field
    lengths = {field: K1 * (1 - B + B * FIELDNORMS / (count / total)) for field, count in tokens.items() if count > 0}
    passages: list[np.ndarray] = []
    contributions: list[np.ndarray] = []
    for (field, _), held in blocks.items():
        frequency = sum(len(data) for data in held) // POSTING_BYTES  # the term's document frequency
        weight = math.log(1 + (total - frequency + 0.5) / (frequency + 0.5)) * (K1 + 1)
        for data in held:
            ids, tf, norm = decode(data)
            f = tf.astype(np.float64)
            passages.append(ids)
            contributions.append(weight * f / (f + lengths[field][norm]))
    every = np.concatenate(passages)
    scored = np.concatenate(contributions)
    low = int(every.min())
    span = int(every.max()) - low + 1
    if span <= 4 * len(every) + 100_000:  # the user's ids are dense enough to count by offset
        sums = np.bincount(every - low, weights=scored, minlength=span)
        held_ids = np.flatnonzero(sums > 0)
        return held_ids + low, sums[held_ids]
    unique, inverse = np.unique(every, return_inverse=True)
    return unique, np.bincount(inverse, weights=scored, minlength=len(unique))


def _best(ids: np.ndarray, scores: np.ndarray, m: int) -> np.ndarray:
    """Indexes of the best `m` by score, then id, in that order."""
    if len(scores) > m:
        kth = np.partition(scores, len(scores) - m)[len(scores) - m]  # the m-th highest
        above = np.flatnonzero(scores > kth)
        tied = np.flatnonzero(scores == kth)
        tied = tied[np.argsort(ids[tied], kind="stable")][: m - len(above)]
        pick = np.concatenate([above, tied])
    else:
        pick = np.arange(len(scores))
    return pick[np.lexsort((ids[pick], -scores[pick]))]


def _narrowed(
    db: psycopg.Connection[Any], narrow: Narrow, ids: np.ndarray, scores: np.ndarray, limit: int
) -> list[tuple[int, float]]:
    """The best `limit` the filters allow: the best passages checked in rounds (the first 4 x limit,
    then all allowed at once when few, else rounds 8 times larger)."""
    checked, size = 0, 4 * limit
    kept: list[int] = []
    while checked < len(ids) and len(kept) < limit:
        order = _best(ids, scores, size)[checked:]
        allowed = narrow.among(db, ids[order])
        kept.extend(int(i) for i in order[np.isin(ids[order], allowed)])
        checked += len(order)
        if len(kept) < limit and checked < len(ids) and checked == 4 * limit:
            every = narrow.every(db, ALLOWED_AT_MOST)
            if every is not None:
                mask = np.isin(ids, every)
                ids, scores = ids[mask], scores[mask]
                return [(int(ids[i]), float(scores[i])) for i in _best(ids, scores, limit)]
        size *= 8
    return [(int(ids[i]), float(scores[i])) for i in kept[:limit]]
