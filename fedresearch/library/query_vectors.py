"""Query vectors, encoded once per distinct question: repeats (retries, several retrievers of one
task, the same question twice) cost nothing, and concurrent askers of one question wait for one pass."""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future

import numpy as np

from fedresearch.library.embeddings import Encoder

_ENTRIES = 1024


class QueryVectors:
    def __init__(self, encoder: Encoder, entries: int = _ENTRIES) -> None:
        self.encoder = encoder
        self.entries = entries
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._pending: dict[str, Future[np.ndarray]] = {}
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()

    def __call__(self, query: str) -> np.ndarray:
        key = " ".join(query.split())
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
            pending = self._pending.get(key)
            owner = pending is None
            if pending is None:
                pending = self._pending[key] = Future()
        if not owner:
            return pending.result()
        return self._encode(key, pending)

    def _encode(self, key: str, pending: Future[np.ndarray]) -> np.ndarray:
        try:
            vector: np.ndarray = self.encoder.encode([key])[0]
        except BaseException as error:
            pending.set_exception(error)
            raise
        finally:
            with self._lock:
                self._pending.pop(key, None)
        with self._lock:
            self._cache[key] = vector
            while len(self._cache) > self.entries:
                self._cache.popitem(last=False)
        pending.set_result(vector)
        return vector
