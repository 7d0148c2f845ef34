"""Query vectors, encoded once per distinct question: repeats (retries, several retrievers of one
task, the same question twice) cost nothing, concurrent askers of one question wait for one pass,
and different questions asked at once are encoded together as one batch."""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future

import numpy as np

from fedresearch.library.embeddings import Encoder

_ENTRIES = 1024
_BATCH = 32


class QueryVectors:
    """A cache in front of a batching encoder.

    Whoever finds no pass running runs one over every question queued so far; the others wait,
    and one of those still waiting runs the next. One batched pass over n short questions costs far
    less than n passes, and no asker waits behind more than one pass before its own.
    """

    def __init__(self, encoder: Encoder, entries: int = _ENTRIES) -> None:
        self.encoder = encoder
        self.entries = entries
        self.batches = 0  # passes run, for tests and benchmarks
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._pending: dict[str, Future[np.ndarray]] = {}
        self._queue: list[str] = []
        self._encoding = False
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)

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
            if pending is None:
                pending = self._pending[key] = Future()
                self._queue.append(key)
        while not pending.done():
            with self._changed:
                self._changed.wait_for(lambda: pending.done() or not self._encoding)
                if pending.done():
                    break
                self._encoding = True
                batch, self._queue = self._queue[:_BATCH], self._queue[_BATCH:]
                futures = [self._pending.pop(key) for key in batch]
            try:
                self._encode(batch, futures)
            finally:
                with self._changed:
                    self._encoding = False
                    self._changed.notify_all()
        return pending.result()

    def _encode(self, batch: list[str], futures: list[Future[np.ndarray]]) -> None:
        try:
            vectors = self.encoder.encode(batch, batch_size=len(batch))
        except BaseException as error:  # every asker of this batch sees the failure
            for future in futures:
                future.set_exception(error)
            return
        with self._lock:
            self.batches += 1
            for key, vector in zip(batch, vectors, strict=True):
                self._cache[key] = vector
            while len(self._cache) > self.entries:
                self._cache.popitem(last=False)
        for future, vector in zip(futures, vectors, strict=True):
            future.set_result(vector)
