"""Prometheus metrics, one registry per app (so tests and several apps in one process never clash).

Under `fedresearch serve --workers N` a scrape reaches whichever worker the kernel picks, and each
would count only its own: the counters would jump from one worker's count to another's between
scrapes (read as resets by `rate()`), the gauges be one worker's. So the supervisor names a folder
in PROMETHEUS_MULTIPROC_DIR, prometheus_client's multiprocess mode, which each worker's client reads
when imported: every value is kept in a file there per process, and a scrape sums them all. A dead
worker's counts stay in the sums (counters never go back); its gauges leave them (`livesum`), the
supervisor telling the client which process died.

Its counts stay, but not its files: the supervisor adds them into one file per kind
(`counter_dead.db`, `histogram_dead.db`) and removes the dead worker's (`fold_dead_worker`). Every
worker that ever ran left two files that every scrape read, so a worker dying in a loop at the
longest backoff (30 s) added 5,760 a day. A scrape and a fold each hold the folder's lock (shared,
exclusive), so no scrape sees a count twice, or misses one, while it moves. The supervisor counts
the workers that died there too (`fedresearch_worker_deaths_total`, by how they ended), so a worker
dying in a loop shows in the metrics, not only in the log.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector

from fedresearch.core.collector import PAUSE_BUCKETS, Pauses

MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"
log = logging.getLogger("fedresearch")


class Metrics:
    def __init__(self) -> None:
        self.shared_dir = os.environ.get(MULTIPROCESS_DIR)
        self.registry = CollectorRegistry()
        self._retriever_metrics()
        self.sockets = Gauge(
            "fedresearch_active_sockets",
            "Open WebSocket connections",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.tasks = Gauge(
            "fedresearch_active_tasks",
            "Research tasks running",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self._collector_metrics()
        self.pauses: Pauses | None = None  # the collector's, once a server process has settled

    def _retriever_metrics(self) -> None:
        """How each retriever fares: calls, failures, latency, suspensions, cached answers."""
        self.requests = Counter(
            "fedresearch_retriever_requests",
            "Retriever calls, cached answers included",
            ["retriever"],
            registry=self.registry,
        )
        self.failures = Counter(
            "fedresearch_retriever_failures",
            "Retriever calls that failed, by reason",
            ["retriever", "reason"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "fedresearch_retriever_latency_seconds",
            "Time to a retriever's answer",
            ["retriever"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.suspensions = Counter(
            "fedresearch_retriever_suspensions",
            "Times an upstream was suspended by its circuit breaker",
            ["retriever", "reason"],
            registry=self.registry,
        )
        self.cache_hits = Counter(
            "fedresearch_retriever_cache_hits",
            "Answers served from the upstream cache",
            ["retriever"],
            registry=self.registry,
        )

    def _collector_metrics(self) -> None:
        """The garbage collector's pauses, and the start-up objects it skips."""
        self.gc_pauses = Histogram(
            "fedresearch_gc_pause_seconds",
            "Garbage collections by how long they stopped the process",
            ["generation"],
            buckets=PAUSE_BUCKETS,
            registry=self.registry,
        )
        for generation in "012":  # shown from the start: no full collection yet is worth reading too
            self.gc_pauses.labels(generation)
        self.gc_frozen = Gauge(
            "fedresearch_gc_frozen_objects",
            "Start-up objects collections skip (the fewest of any worker)",
            registry=self.registry,
            multiprocess_mode="livemin",
        )

    def publish(self) -> None:
        """This process's garbage collections since the last time, into the histogram."""
        if self.pauses is not None:
            self.pauses.publish(self.gc_pauses)

    def exposition(self) -> bytes:
        """The text a scrape reads: this app's values, or every worker's summed (reads their files)."""
        self.publish()
        if self.shared_dir is None:
            return generate_latest(self.registry)
        every_worker = CollectorRegistry()
        MultiProcessCollector(every_worker, self.shared_dir)
        with _folder_lock(self.shared_dir, fcntl.LOCK_SH):
            return generate_latest(every_worker)


_SUMMED_KINDS = ("counter", "histogram", "summary")  # a gauge's files go with its process (livesum)


@contextlib.contextmanager
def _folder_lock(directory: str, mode: int) -> Iterator[None]:
    descriptor = os.open(os.path.join(directory, ".fold.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, mode)
        yield
    finally:
        os.close(descriptor)


def fold_dead_worker(directory: str, pid: int) -> int:
    """A dead worker's counts added into the folder's `<kind>_dead.db` files and its own files
    removed; how many were. The sums a scrape reads stay the same."""
    folded = 0
    with _folder_lock(directory, fcntl.LOCK_EX):
        for kind in _SUMMED_KINDS:
            dead = os.path.join(directory, f"{kind}_{pid}.db")
            try:
                values = list(MmapedDict.read_all_values_from_file(dead))  # read whole before anything is added
                for key, *_ in values:
                    json.loads(key)  # as a scrape reads it: a broken key kept would break every scrape
            except FileNotFoundError:
                continue
            except Exception as error:  # every scrape would fail on it: set aside, its counts lost
                os.replace(dead, f"{dead}.unreadable")
                log.warning("metrics: %s of a dead worker is unreadable (%r), set aside", dead, error)
                continue
            kept = MmapedDict(os.path.join(directory, f"{kind}_dead.db"))
            try:
                for key, value, timestamp, _ in values:
                    total, _ = kept.read_value(key)
                    kept.write_value(key, total + value, timestamp)
            finally:
                kept.close()
            os.unlink(dead)
            folded += 1
    return folded


_DEATHS = "fedresearch_worker_deaths"


def count_worker_death(directory: str, how: str) -> None:
    """One more worker that died (and was replaced), `how` it ended ("SIGKILL", "status 1"), in
    the supervisor's file of the folder, summed by every scrape as a worker's are."""
    key = mmap_key(
        _DEATHS, f"{_DEATHS}_total", ["how"], [how], "Workers that died and were replaced, by how they ended"
    )
    with _folder_lock(directory, fcntl.LOCK_EX):
        counts = MmapedDict(os.path.join(directory, "counter_supervisor.db"))
        try:
            deaths, _ = counts.read_value(key)
            counts.write_value(key, deaths + 1, time.time())
        finally:
            counts.close()
