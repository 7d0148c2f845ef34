"""Each user's passage vectors as one in-memory float32 matrix, searched exactly.

A query only ever looks at one user's rows, so brute force over that slice is both exact and fast
(0.33 ms at 10k rows, 4.5 ms at 100k here), with no approximate index to build or tune. The matrix
is derived from SQLite and reloaded whenever the user's generation counter moves, which every
write transaction bumps, so it can never drift from the store, even across processes or crashes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from fedresearch.library.records import Records


@dataclass(frozen=True)
class UserVectors:
    generation: int
    chunk_ids: np.ndarray  # int64, one per row
    document_ids: np.ndarray  # int64
    kinds: np.ndarray  # object (str)
    years: np.ndarray  # int64, 0 when unknown
    matrix: np.ndarray  # float32 (rows, dims), unit length

    def search(self, query: np.ndarray, allowed: np.ndarray | None, limit: int) -> list[tuple[int, float]]:
        if not len(self.chunk_ids):
            return []
        scores = self.matrix @ query
        if allowed is not None:
            scores = np.where(allowed, scores, -np.inf)
        limit = min(limit, int(np.isfinite(scores).sum()))
        if limit <= 0:
            return []
        top = np.argpartition(-scores, limit - 1)[:limit]
        top = top[np.argsort(-scores[top])]
        return [(int(self.chunk_ids[i]), float(scores[i])) for i in top]


class VectorCache:
    def __init__(self, dims: int, max_users: int = 64) -> None:
        self.dims = dims
        self.max_users = max_users
        self._users: dict[str, UserVectors] = {}
        self._lock = threading.Lock()

    def get(self, records: Records, user_id: str) -> UserVectors:
        generation = records.generation(user_id)
        cached = self._users.get(user_id)
        if cached is not None and cached.generation == generation:
            return cached
        loaded = self._catch_up(records, user_id, generation, cached) if cached is not None else None
        loaded = loaded or self._rows(records, user_id, 0, generation)
        with self._lock:
            self._users.pop(user_id, None)
            self._users[user_id] = loaded
            while len(self._users) > self.max_users:
                self._users.pop(next(iter(self._users)))
        return loaded

    def _rows(self, records: Records, user_id: str, after_id: int, generation: int) -> UserVectors:
        rows = records.vector_rows(user_id, after_id)
        matrix = np.frombuffer(b"".join(r[4] for r in rows), dtype=np.float32).reshape(len(rows), self.dims)
        return UserVectors(
            generation=generation,
            chunk_ids=np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows)),
            document_ids=np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows)),
            kinds=np.array([r[2] for r in rows], dtype=object),
            years=np.fromiter((r[3] for r in rows), dtype=np.int64, count=len(rows)),
            matrix=matrix,
        )

    def _catch_up(self, records: Records, user_id: str, generation: int, cached: UserVectors) -> UserVectors | None:
        """Append rows added since `cached`; None when rows also went away (then reload whole)."""
        last = int(cached.chunk_ids[-1]) if len(cached.chunk_ids) else 0
        if records.vectors_up_to(user_id, last) != len(cached.chunk_ids):
            return None
        new = self._rows(records, user_id, last, generation)
        return UserVectors(
            generation=generation,
            chunk_ids=np.concatenate([cached.chunk_ids, new.chunk_ids]),
            document_ids=np.concatenate([cached.document_ids, new.document_ids]),
            kinds=np.concatenate([cached.kinds, new.kinds]),
            years=np.concatenate([cached.years, new.years]),
            matrix=np.concatenate([cached.matrix, new.matrix]),
        )
