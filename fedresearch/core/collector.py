"""Python's garbage collector, set for a server process that runs for weeks, and its pauses counted.

A full collection walks every container object the process holds, and everything waits for it.
Measured with bench.scaling (one worker, 512 sockets in a closed loop, then 1,000 at half that
rate, 2 cores): the imports, pydantic's schemas and the registry are about 190k objects before the
first task, and with the tasks in flight full collections took 200-300 ms, 17 of them in 40 s: a
cause of the steady p99 of 200-360 ms seen on 16 cores. Two settings every long-running CPython
server wants (same load after them: the longest 130-140 ms, 10 full collections):

- what start-up made lives as long as the process: `gc.freeze()` moves it out of the collector's
  sight, so a full collection walks only what tasks made;
- a young collection every YOUNG_EVERY new objects instead of CPython's 700, so most of a task's
  objects are gone before a collection could promote them to the old generations, where only a
  full collection frees them.
"""

from __future__ import annotations

import collections
import gc
import time
from typing import Any

from prometheus_client import Histogram

YOUNG_EVERY = 10_000  # container objects allocated, net of those freed, between young collections
PAUSE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)  # seconds
PUBLISH_S = 5.0  # how often a server process hands its pauses to the histogram every worker's scrape reads


class Pauses:
    """Each collection's generation and duration, noted by a gc callback, until `publish` hands them
    to the histogram.

    The callback only appends to a deque: it runs wherever a collection starts, inside any
    allocation, so it must take no lock a thread could already hold (prometheus_client's metrics
    take one, and under workers write to a shared file)."""

    def __init__(self) -> None:
        self.pending: collections.deque[tuple[int, float]] = collections.deque()
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.pending.append((info["generation"], time.perf_counter() - self._started))

    def publish(self, histogram: Histogram) -> None:
        while self.pending:
            generation, took = self.pending.popleft()
            histogram.labels(str(generation)).observe(took)


def settle() -> Pauses:
    """Call once a server process has started (modules imported, stores open), before it serves."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_EVERY, middle, old)
    pauses = Pauses()
    gc.callbacks.append(pauses)
    return pauses
