"""Vectors of short texts (questions, web snippets), encoded once per distinct text: repeats
(retries, several retrievers of one task, the same question twice) cost nothing, concurrent askers
of one text wait for one pass, and different texts asked at once are encoded together as one batch."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future

import numpy as np

from fedresearch.library.embeddings import Encoder

_ENTRIES = 1024
_BATCH = 32


class QueryVectors:
    """A cache in front of a batching encoder.

    Whoever finds a free pass (the encoder runs `passes` at once, one per core) runs one over the
    texts queued so far; the others wait, and one of those still waiting runs the next. One batched
    pass over n short texts costs less than n passes, and no asker waits behind more than a pass or
    two before its own.
    """

    def __init__(self, encoder: Encoder, entries: int = _ENTRIES, batch: int = _BATCH) -> None:
        self.encoder = encoder
        self.entries = entries
        self.batch = batch
        self.batches = 0  # passes run, for tests and benchmarks
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._pending: dict[str, Future[np.ndarray]] = {}
        self._askers: dict[str, int] = {}  # how many askers wait for each pending text
        self._queue: list[str] = []
        self._passes = max(1, int(getattr(encoder, "passes", 1)))
        self._encoding = 0  # passes running now
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()

    def __call__(self, text: str) -> np.ndarray:
        vector = self.many([text])[0]
        assert vector is not None  # no deadline: every text is encoded
        return vector

    def many(self, texts: Sequence[str], deadline: float | None = None) -> list[np.ndarray | None]:
        """One vector per text; with a `deadline` (time.monotonic()), None for the texts whose pass
        had not started by then, which are then left out of later passes unless others want them."""
        futures, registered = self._enqueue([" ".join(text.split()) for text in texts])
        waiting = [f for f in dict.fromkeys(futures) if not f.done()]
        try:
            while not all(f.done() for f in waiting):
                batch = self._next_batch(waiting, deadline)
                if batch is None:
                    break
                self._run(batch)
        finally:
            self._withdraw(registered)
        return [None if f.cancelled() or not f.done() else f.result() for f in futures]  # a failed pass raises

    def _enqueue(self, keys: list[str]) -> tuple[list[Future[np.ndarray]], list[str]]:
        """Each key's future (done when cached), and the keys this asker now waits for."""
        futures, registered = [], []
        with self._lock:
            for key in keys:
                cached = self._cache.get(key)
                if cached is not None:
                    self._cache.move_to_end(key)
                    done: Future[np.ndarray] = Future()
                    done.set_result(cached)
                    futures.append(done)
                    continue
                if key not in self._pending:
                    self._pending[key] = Future()
                    self._queue.append(key)
                self._askers[key] = self._askers.get(key, 0) + 1
                registered.append(key)
                futures.append(self._pending[key])
        return futures, registered

    def _next_batch(self, waiting: list[Future[np.ndarray]], deadline: float | None) -> list[str] | None:
        """Wait until our texts are done (None), the deadline passes (None), or a pass is free (our turn)."""
        with self._changed:
            while (self._encoding >= self._passes or not self._queue) and not all(f.done() for f in waiting):
                timeout = None if deadline is None else deadline - time.monotonic()
                if timeout is not None and timeout <= 0:
                    return None
                self._changed.wait(timeout)
            if all(f.done() for f in waiting) or (deadline is not None and time.monotonic() >= deadline):
                return None
            self._encoding += 1
            batch, self._queue = self._queue[: self.batch], self._queue[self.batch :]
            return batch

    def _run(self, batch: list[str]) -> None:
        try:
            self._encode(batch)
        finally:
            with self._changed:
                self._encoding -= 1
                self._changed.notify_all()

    def _encode(self, batch: list[str]) -> None:
        with self._lock:
            futures = [self._pending.pop(key) for key in batch]
        try:
            vectors = self.encoder.encode(batch, batch_size=min(len(batch), 16))
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

    def _withdraw(self, keys: list[str]) -> None:
        """Texts no asker waits for any more leave the queue (when their pass has not started)."""
        with self._lock:
            for key in keys:
                self._askers[key] -= 1
                if self._askers[key] > 0:
                    continue
                del self._askers[key]
                if key in self._queue:
                    self._queue.remove(key)
                    self._pending.pop(key).cancel()
