"""What the library facade (facade.Library) needs of a store: the embedded one (SQLite + tantivy +
in-memory vectors) or PostgreSQL (postgres.py). Every method takes the user first."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from fedresearch.library.records import DocumentInfo, Prepared
from fedresearch.library.search import Row, SearchFilters

Ranking = list[tuple[int, float]]  # (chunk id, score), best first


class LibraryDatabaseError(RuntimeError):
    """PostgreSQL cannot hold the library as configured (no pgvector, another vector width...)."""


class LibraryUnavailable(RuntimeError):
    """The library's database server cannot be reached now, or cancelled a read that ran past its
    caller's deadline; the message says why (safe to show: no password, no address). Transient:
    the same call may succeed a second later."""


class Store(Protocol):
    # True where searches run in another process (a database server), so the facade runs the BM25
    # search beside the query's encoding and the vector search: a hybrid search then takes the
    # longer of the two rather than their sum. In-process stores would only contend for the cores.
    concurrent_searches: bool

    def hashes(self, user_id: str, sources: list[str]) -> dict[str, str]:
        """The content hash of each of the user's documents named by `sources` that is stored."""

    def store(self, user_id: str, prepared: Sequence[Prepared]) -> tuple[int, int]:
        """Store documents and their passages in one transaction, replacing earlier versions; (added, replaced)."""

    def without_vectors(self, user_id: str) -> list[Row]:
        """The user's passages stored without a vector: id, heading, text, title."""

    def set_vectors(self, user_id: str, vectors: Sequence[tuple[bytes | None, int]]) -> None:
        """(float32 vector bytes, chunk id) pairs, in one transaction."""

    def delete(self, user_id: str, document_id: int) -> bool: ...

    def documents(self, user_id: str) -> list[DocumentInfo]: ...

    def passages(self, user_id: str, chunk_ids: Sequence[int]) -> dict[int, Row]:
        """The rows Passage.of reads (records.PASSAGE_COLUMNS; `vector` as float32 bytes or None)."""

    def bm25(self, user_id: str, kind: str | None, query: str, filters: SearchFilters, limit: int) -> Ranking: ...

    def dense(
        self, user_id: str, query_vector: np.ndarray, kind: str | None, filters: SearchFilters, limit: int
    ) -> Ranking:
        """The user's passages nearest `query_vector` by cosine (scores are cosines)."""

    def document_passages(self, user_id: str, document_id: int) -> list[Row]:
        """The user's document's passages in order: id, heading, page, position, text (none when the
        document is not the user's)."""

    def term_counts(self, user_id: str, words: Sequence[str]) -> dict[str, int]:
        """How many passages hold each English word (stemmed as full text stems it): BM25's
        document frequencies, which choose a Chinese word's sense (crosslingual.py)."""

    def health(self) -> str:
        """What an operator checks: whether derived data is whole, and what the store holds."""

    def unavailable(self) -> str | None:
        """Why the store's server cannot be reached, as last seen (no I/O: `/healthz` asks it);
        None when nothing says so."""

    def close(self) -> None: ...
