"""A cache of values kept for a time, bounded in entries and in the size of what they hold.

The pages read and the upstreams' answers were cached in entries alone (512 pages, 2,048 answers),
each as large as an upstream sent: 512 PDFs or text files of FETCH_MAX_BYTES, or 2,048 answers of
50 results of RESULT_MAX_CHARS, were gigabytes in every process. Both now also keep a budget of
characters, the least recently used going first; a value larger than the whole budget is not kept,
since it would push every other one out.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TimedCache(Generic[K, V]):
    def __init__(
        self,
        ttl_s: float,
        entries: int,
        budget: int,
        size: Callable[[V], int],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s, self.entries, self.budget = ttl_s, entries, budget
        self.size, self.clock = size, clock
        self._values: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self._held = 0

    @property
    def held(self) -> int:
        """The size of what the cache holds, in `size`'s unit."""
        return self._held

    def get(self, key: K) -> V | None:
        """The value, if there and not expired; it becomes the most recently used."""
        entry = self._values.get(key)
        if entry is None or entry[0] < self.clock():
            self.drop(key)
            return None
        self._values.move_to_end(key)
        return entry[1]

    def put(self, key: K, value: V) -> None:
        self.drop(key)
        size = self.size(value)
        if self.ttl_s <= 0 or size > self.budget:
            return
        self._values[key] = (self.clock() + self.ttl_s, value)
        self._held += size
        while len(self._values) > self.entries or self._held > self.budget:
            self.drop(next(iter(self._values)))

    def drop(self, key: K) -> None:
        entry = self._values.pop(key, None)
        if entry is not None:
            self._held -= self.size(entry[1])
