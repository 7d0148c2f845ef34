"""The embedded store: SQLite is the store of record; a tantivy index and per-user vector matrices
derive from it. Zero configuration, one process (or several readers), one disk. The library's
facade (facade.py) runs on it, or on PostgreSQL (postgres.py).

Every read takes a `user_id` first and puts it inside the query itself (an exact-match term in
the index, a WHERE clause in SQL, one user's matrix for vectors), so no code path can search
across users.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from fedresearch.library.fulltext import FullTextIndex
from fedresearch.library.locking import IndexBusy, exclusive
from fedresearch.library.records import DocumentInfo, Prepared, Records
from fedresearch.library.search import (
    Row,
    SearchFilters,
)
from fedresearch.library.store import Ranking
from fedresearch.library.vectors import VECTOR_CACHE_MB, UserVectors, VectorCache

log = logging.getLogger(__name__)


class EmbeddedStore:
    """SQLite records, the tantivy index and the vector cache kept in step under one write lock."""

    concurrent_searches = False

    def __init__(self, directory: Path, dims: int | None, vector_cache_mb: int = VECTOR_CACHE_MB) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.records = Records(directory / "library.sqlite3")
        self._lock_file = directory / "write.lock"
        self._write_lock = threading.Lock()
        self._vectors = VectorCache(dims, max_bytes=vector_cache_mb * 2**20) if dims is not None else None
        self.index = self._open_index(directory / "index")

    def _open_index(self, directory: Path) -> FullTextIndex:
        """The index, checked and caught up while no other process writes (its half-written state
        would look damaged); if one holds the lock past the wait, opened without catching up."""
        try:
            with exclusive(self._lock_file):
                index = FullTextIndex(directory, self.records)
                if self.records.unindexed():  # left by a crash, another process, or a rebuilt index
                    index.catch_up(self.records)
                return index
        except IndexBusy as busy:
            log.warning("%s", busy)
            return FullTextIndex(directory, self.records)

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """This process's writers one at a time, and other processes' (ingests, a server) too."""
        with self._write_lock, exclusive(self._lock_file):
            yield

    def hashes(self, user_id: str, sources: list[str]) -> dict[str, str]:
        return self.records.hashes(user_id, sources)

    def store(self, user_id: str, prepared: Sequence[Prepared]) -> tuple[int, int]:
        with self._writing():
            stored = self.records.store(user_id, prepared)
            self.index.catch_up(self.records)
        return stored

    def without_vectors(self, user_id: str) -> list[Row]:
        return list(self.records.without_vectors(user_id))

    def set_vectors(self, user_id: str, vectors: Sequence[tuple[bytes | None, int]]) -> None:
        with self._writing():
            self.records.set_vectors(user_id, vectors)

    def delete(self, user_id: str, document_id: int) -> bool:
        with self._writing():
            deleted = self.records.delete(user_id, document_id)
            if deleted:
                self.index.delete_document(document_id)
        return deleted

    def documents(self, user_id: str) -> list[DocumentInfo]:
        return self.records.documents(user_id)

    def passages(self, user_id: str, chunk_ids: Sequence[int]) -> dict[int, Row]:
        return dict(self.records.passages(user_id, chunk_ids))

    def bm25(self, user_id: str, kind: str | None, query: str, filters: SearchFilters, limit: int) -> Ranking:
        return self.index.search(user_id, kind, query, filters, limit)

    def document_passages(self, user_id: str, document_id: int) -> list[Row]:
        return list(self.records.document_passages(user_id, document_id))

    def term_counts(self, user_id: str, words: Sequence[str]) -> dict[str, int]:
        return self.index.term_counts(words)  # the index's, over every user's passages, as BM25 counts them

    def dense(
        self, user_id: str, query_vector: np.ndarray, kind: str | None, filters: SearchFilters, limit: int
    ) -> Ranking:
        if self._vectors is None:
            return []
        rows = self._vectors.get(self.records, user_id)
        return rows.search(query_vector, self._allowed(user_id, rows, kind, filters), limit)

    def _allowed(self, user_id: str, rows: UserVectors, kind: str | None, filters: SearchFilters) -> np.ndarray | None:
        """The vector rows the filters admit (None: all), the same filters the index applies."""
        mask = None if kind is None else rows.kinds == kind

        def both(extra: np.ndarray) -> np.ndarray:
            return extra if mask is None else mask & extra

        if filters.year_min is not None:
            mask = both(rows.years >= filters.year_min)
        if filters.year_max is not None:
            mask = both((rows.years <= filters.year_max) & (rows.years > 0))
        if filters.document_ids:
            mask = both(np.isin(rows.document_ids, np.array(filters.document_ids, dtype=np.int64)))
        for column, values in (("authors", filters.authors), ("tags", filters.tags)):
            if values:
                ids = self.records.document_ids_with(user_id, column, values)
                mask = both(np.isin(rows.document_ids, np.array(ids, dtype=np.int64)))
        return mask

    def health(self) -> str:
        return self.index.health(self.records)

    def unavailable(self) -> str | None:
        return None  # in this process: there when the process is

    def close(self) -> None:
        """Nothing to release: SQLite connections close with their threads."""
