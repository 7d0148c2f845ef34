"""BM25 on PostgreSQL from a postings table, ranked as the embedded store's tantivy index ranks.

A passage's terms are made in Python by the very analyzers the embedded index uses (fulltext.py:
tantivy's simple tokenizer, long words out, lowercase, the project's stopwords, the English
stemmer; CJK bigrams as words), so both stores see the same terms. Each (user, field, term,
passage) is one row of library_postings holding the term's frequency and the passage's length
as tantivy keeps it (its one-byte "fieldnorm": exact to 40, then in buckets), in a btree read by
index-only scans. library_tokens holds each term's document frequency among the user's passages
and library_users the user's passage and token counts, kept exact in the writing transaction.

A search is tantivy's Okapi BM25 (k1 1.2, b 0.75, idf ln(1 + (N - df + 0.5) / (df + 0.5)), the
average length the user's tokens over passages) with MaxScore pruning: the passages holding the
query's rarest terms are scored in full, and the commoner terms are read only for those
passages as long as their largest possible sum cannot lift any other passage into the top k;
otherwise the next rarest term joins and the round repeats, up to READ_AT_MOST postings read in
full: the top k is exact when proven so within it (most questions; bench/library_pg.py counts).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
import tantivy
from psycopg.rows import tuple_row

from fedresearch.core.text import cjk_bigrams
from fedresearch.library.fulltext import _analyzers
from fedresearch.library.search import indexed_texts

BODY, CJK = 0, 1  # library_postings.field: the English body, the CJK bigrams
K1, B = 1.2, 0.75  # tantivy's
CANDIDATES = 3_000  # the first round scores the passages of the rarest terms, about this many
# Rounds stop once the terms read in full would hold more postings than this, and the top k found
# is returned: reading on until it is proven exact cost a long question 86 ms p50 and 0.8 s p99 at
# 100k passages (docs/benchmarks.md); a passage holding only the question's commonest words can then
# be missed, as before version 3. A search that has not yet found k passages always reads on.
READ_AT_MOST = 12_000


@functools.cache
def english_analyzer() -> tantivy.TextAnalyzer:
    """The embedded index's English analyzer (fulltext.py): one, shared by every thread."""
    return _analyzers()["en_stem"]


# passages of `ids` (an int64 array) that the search's kind and filters allow
Narrow = Callable[[psycopg.Connection[Any], np.ndarray], np.ndarray]


def _fieldnorms() -> np.ndarray:
    """tantivy's fieldnorm buckets (as Lucene's): lengths 0-40 exact, then eight steps per
    doubling of the step (42, 44 ... 56, 60 ... 88, 96 ...); 256 of them."""
    table = list(range(41))
    step = 2
    while len(table) < 256:
        for _ in range(8):
            if len(table) < 256:
                table.append(table[-1] + step)
        step *= 2
    return np.array(table, dtype=np.int64)


FIELDNORMS = _fieldnorms()


def fieldnorm(length: int) -> int:
    """The length tantivy scores a passage of `length` tokens by: its bucket's lower bound."""
    return int(FIELDNORMS[np.searchsorted(FIELDNORMS, length, side="right") - 1])


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
        """Its rows in library_postings."""
        return len(self.body) + len(self.cjk)

    def rows(self, user_id: str, passage: int) -> list[tuple[str, int, str, int, int, int]]:
        """(user_id, field, term, passage, tf, norm) for COPY into library_postings."""
        body_norm, cjk_norm = fieldnorm(self.body_length), fieldnorm(self.cjk_length)
        return [(user_id, BODY, t, passage, tf, body_norm) for t, tf in self.body.items()] + [
            (user_id, CJK, t, passage, tf, cjk_norm) for t, tf in self.cjk.items()
        ]


POSTING_COLUMNS = "user_id, field, term, passage, tf, norm"
POSTING_TYPES = ["text", "int2", "text", "int8", "int4", "int4"]


def copy_postings(db: psycopg.Connection[Any], rows: Sequence[tuple[str, int, str, int, int, int]]) -> None:
    with (
        db.cursor() as cursor,
        cursor.copy(f"COPY library_postings ({POSTING_COLUMNS}) FROM STDIN (FORMAT BINARY)") as copy,
    ):
        copy.set_types(POSTING_TYPES)
        for row in rows:
            copy.write_row(row)


def add_counts(db: psycopg.Connection[Any], user_id: str, terms: Sequence[PassageTerms], sign: int) -> None:
    """Add (sign 1) or take away (-1) these passages in the user's counts: passages, tokens, and
    each term's document frequency (a term left at none is deleted)."""
    if not terms:
        return
    db.execute(
        "UPDATE library_users SET passages = passages + %s, body_tokens = body_tokens + %s,"
        " cjk_tokens = cjk_tokens + %s WHERE user_id = %s",
        (
            sign * len(terms),
            sign * sum(t.body_length for t in terms),
            sign * sum(t.cjk_length for t in terms),
            user_id,
        ),
    )
    frequencies: Counter[tuple[int, str]] = Counter()
    for t in terms:
        frequencies.update((BODY, term) for term in t.body)
        frequencies.update((CJK, term) for term in t.cjk)
    add_frequencies(db, user_id, frequencies, sign)


def add_frequencies(
    db: psycopg.Connection[Any], user_id: str, frequencies: Counter[tuple[int, str]], sign: int
) -> None:
    if not frequencies:
        return
    fields, words = [f for f, _ in frequencies], [w for _, w in frequencies]
    counts = [sign * n for n in frequencies.values()]
    gone = db.execute(
        "WITH changed AS (INSERT INTO library_tokens AS t (user_id, field, term, passages)"
        " SELECT %s, f, w, n FROM unnest(%s::int2[], %s::text[], %s::int8[]) AS c(f, w, n)"
        " ON CONFLICT (user_id, field, term) DO UPDATE SET passages = t.passages + excluded.passages"
        " RETURNING t.field, t.term, t.passages) SELECT field, term FROM changed WHERE passages <= 0",
        (user_id, fields, words, counts),
    ).fetchall()
    if gone:
        db.execute(
            "DELETE FROM library_tokens WHERE user_id = %s AND (field, term) IN"
            " (SELECT * FROM unnest(%s::int2[], %s::text[]))",
            (user_id, [_at(r, 0, "field") for r in gone], [_at(r, 1, "term") for r in gone]),
        )


def _at(row: Any, index: int, name: str) -> Any:
    return row[name] if isinstance(row, dict) else row[index]


def query_terms(query: str) -> list[tuple[int, str]]:
    """(field, term) of a query, each once, as fulltext.FullTextIndex.search makes them."""
    asked = [(BODY, t) for t in dict.fromkeys(english_analyzer().analyze(query))]
    return asked + [(CJK, g) for g in dict.fromkeys(cjk_bigrams(query))]


@dataclass
class _Term:
    field: int
    term: str
    df: int
    idf: float

    @property
    def bound(self) -> float:
        """The most this term adds to any passage's score."""
        return self.idf * (K1 + 1)


def search(
    db: psycopg.Connection[Any], user_id: str, query: str, narrow: Narrow | None, limit: int
) -> list[tuple[int, float]]:
    """(passage id, BM25 score) of the user's best `limit` passages, best first (ties by id);
    `narrow` keeps the passages a search's kind and filters allow (None: all)."""
    asked = query_terms(query)
    if not asked or limit <= 0:
        return []
    user = db.execute(
        "SELECT passages, body_tokens, cjk_tokens FROM library_users WHERE user_id = %s", (user_id,)
    ).fetchone()
    if user is None or not _at(user, 0, "passages"):
        return []
    total = int(_at(user, 0, "passages"))
    average = {BODY: _at(user, 1, "body_tokens") / total, CJK: _at(user, 2, "cjk_tokens") / total}
    found = db.execute(
        "SELECT field, term, passages FROM library_tokens WHERE user_id = %s AND (field, term) IN"
        " (SELECT * FROM unnest(%s::int2[], %s::text[]))",
        (user_id, [f for f, _ in asked], [t for _, t in asked]),
    ).fetchall()
    terms = []
    for row in found:
        df = int(_at(row, 2, "passages"))
        idf = math.log(1 + (total - df + 0.5) / (df + 0.5))
        terms.append(_Term(int(_at(row, 0, "field")), str(_at(row, 1, "term")), df, idf))
    if not terms:
        return []
    terms.sort(key=lambda t: (t.df, t.field, t.term))  # rarest first
    essential, covered = 0, 0
    while essential < len(terms) and (essential == 0 or covered + terms[essential].df <= CANDIDATES):
        covered += terms[essential].df
        essential += 1
    while True:
        ranked, threshold = _round(db, user_id, narrow, limit, terms, essential, average)
        rest = sum(t.bound for t in terms[essential:])
        if essential == len(terms) or (len(ranked) >= limit and rest < threshold):
            return ranked
        budget = max(covered, CANDIDATES) * 4  # the next round reads about four times as many
        if len(ranked) >= limit and covered + terms[essential].df > READ_AT_MOST:
            return ranked
        essential += 1
        covered = sum(t.df for t in terms[:essential])
        while essential < len(terms) and covered + terms[essential].df <= budget:
            covered += terms[essential].df
            essential += 1


def _round(
    db: psycopg.Connection[Any],
    user_id: str,
    narrow: Narrow | None,
    limit: int,
    terms: list[_Term],
    essential: int,
    average: dict[int, float],
) -> tuple[list[tuple[int, float]], float]:
    """The top `limit` of the passages holding one of terms[:essential], scored by every term;
    and the lowest score among them (0 when fewer)."""
    postings = _postings(db, user_id, terms[:essential], average, None)
    candidates = np.unique(postings[0]) if len(postings[0]) else postings[0]
    if len(candidates) and narrow is not None:
        candidates = narrow(db, candidates)
    if not len(candidates):
        return [], 0.0
    if essential < len(terms):
        more = _postings(db, user_id, terms[essential:], average, candidates)
        postings = tuple(np.concatenate([a, b]) for a, b in zip(postings, more, strict=True))  # type: ignore[assignment]
    passages, tf, norm, weight, avg = postings
    k = K1 * (1 - B + B * norm / avg)
    contribution = weight * tf / (tf + k)
    keep = np.isin(passages, candidates)
    ids, inverse = np.unique(passages[keep], return_inverse=True)
    scores = np.bincount(inverse, weights=contribution[keep], minlength=len(ids))
    order = np.lexsort((ids, -scores))[:limit]
    ranked = [(int(ids[i]), float(scores[i])) for i in order]
    threshold = ranked[-1][1] if len(ranked) >= limit else 0.0
    return ranked, threshold


_Postings = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _postings(
    db: psycopg.Connection[Any],
    user_id: str,
    terms: Sequence[_Term],
    average: dict[int, float],
    among: np.ndarray | None,
) -> _Postings:
    """(passage, tf, norm, the term's idf * (k1 + 1), the field's average length) of every posting
    of `terms`, or of those among the passages `among`, as arrays."""
    if not terms:
        empty = np.zeros(0)
        return np.zeros(0, dtype=np.int64), empty, empty, empty, empty
    within = "" if among is None else " AND passage = ANY(%s::int8[])"
    values: list[Any] = [user_id, [t.field for t in terms], [t.term for t in terms]]
    if among is not None:
        values.append(among.tolist())
    with db.cursor(binary=True, row_factory=tuple_row) as cursor:
        rows = cursor.execute(
            "SELECT field, term, array_agg(passage), array_agg(tf), array_agg(norm) FROM library_postings"
            " WHERE user_id = %s AND (field, term) IN (SELECT * FROM unnest(%s::int2[], %s::text[]))"
            f"{within} GROUP BY field, term",
            values,
        ).fetchall()
    idf = {(t.field, t.term): t.idf * (K1 + 1) for t in terms}
    parts: list[list[np.ndarray]] = [[], [], [], [], []]
    for field, term, passages, tf, norm in rows:
        n = len(passages)
        parts[0].append(np.asarray(passages, dtype=np.int64))
        parts[1].append(np.asarray(tf, dtype=np.float64))
        parts[2].append(np.asarray(norm, dtype=np.float64))
        parts[3].append(np.full(n, idf[(field, term)]))
        parts[4].append(np.full(n, average[field]))
    if not rows:
        return _postings(db, user_id, [], average, None)
    return tuple(np.concatenate(p) for p in parts)  # type: ignore[return-value]
