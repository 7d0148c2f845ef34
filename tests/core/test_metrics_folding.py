"""Under `serve --workers N` a dead worker's counts stay in the sums a scrape reads, but its files
go: they are added into one file per kind, under a lock no scrape reads through. Real processes
writing prometheus_client's multiprocess files."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.parser import text_string_to_metric_families

from fedresearch.core.metrics import MULTIPROCESS_DIR, Metrics, count_worker_death, fold_dead_worker

# a worker's counting, as a retriever's calls count it (core/metrics.py), then it exits
COUNTS = """
import os, sys
from fedresearch.core.metrics import Metrics
metrics, n = Metrics(), int(sys.argv[1])
metrics.requests.labels("tavily").inc(n)
metrics.requests.labels(f"only{n}").inc()
metrics.failures.labels("google", "timeout").inc(2 * n)
for seconds in (0.02, 0.3, 4.0)[: 1 + n % 3]:
    metrics.latency.labels("tavily").observe(seconds)
metrics.sockets.inc(n)  # a livesum gauge: leaves the sums with its process
print(os.getpid())
"""


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def workers_that_counted(folder: Path, count: int) -> list[int]:
    """The pids of `count` processes that counted into `folder` and ended."""
    env = {**os.environ, MULTIPROCESS_DIR: str(folder)}
    pids = []
    for n in range(1, count + 1):
        done = subprocess.run([sys.executable, "-c", COUNTS, str(n)], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        pids.append(int(done.stdout))
    return pids


def test_a_dead_workers_counts_stay_summed_and_its_files_go(tmp_path, monkeypatch):
    pids = workers_that_counted(tmp_path, 3)
    for pid in pids:  # what the supervisor does first: a dead process's live gauges leave
        for gauge in tmp_path.glob(f"gauge_live*_{pid}.db"):
            gauge.unlink()
    monkeypatch.setenv(MULTIPROCESS_DIR, str(tmp_path))
    metrics = Metrics()
    before = samples(metrics)
    assert before[("fedresearch_retriever_requests_total", (("retriever", "tavily"),))] == 6
    assert before[("fedresearch_retriever_latency_seconds_bucket", (("le", "0.5"), ("retriever", "tavily")))] == 5

    assert [fold_dead_worker(str(tmp_path), pid) for pid in pids] == [2, 2, 2]  # counter and histogram each

    assert samples(metrics) == before
    assert sorted(f.name for f in tmp_path.glob("*.db")) == ["counter_dead.db", "histogram_dead.db"]
    assert fold_dead_worker(str(tmp_path), pids[0]) == 0  # folded once only


def test_no_scrape_sees_a_count_twice_or_misses_one_while_workers_are_folded(tmp_path, monkeypatch):
    counted = workers_that_counted(tmp_path, 1)[0]
    pids = [counted, *range(4_000_000, 4_000_300)]  # 300 more dead workers' files, copies of its
    for kind in ("counter", "histogram"):
        for pid in pids[1:]:
            shutil.copyfile(tmp_path / f"{kind}_{counted}.db", tmp_path / f"{kind}_{pid}.db")
    monkeypatch.setenv(MULTIPROCESS_DIR, str(tmp_path))
    metrics = Metrics()
    total = ("fedresearch_retriever_requests_total", (("retriever", "tavily"),))
    seen: list[float | str] = []
    folding = True

    def scrape() -> None:
        while folding:
            try:
                seen.append(samples(metrics)[total])
            except Exception as error:  # a file gone between the collector's listing and its read
                seen.append(repr(error))

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for pid in pids:
            fold_dead_worker(str(tmp_path), pid)
    finally:
        folding = False
        scraper.join()
    assert len(seen) > 1 and set(seen) == {len(pids)}, sorted(set(map(str, seen)))


def test_the_supervisor_counts_the_workers_that_died_by_how_they_ended(tmp_path, monkeypatch):
    pids = workers_that_counted(tmp_path, 2)
    for pid, how in zip(pids, ("SIGKILL", "status 1"), strict=True):
        fold_dead_worker(str(tmp_path), pid)
        count_worker_death(str(tmp_path), how)
    count_worker_death(str(tmp_path), "SIGKILL")
    monkeypatch.setenv(MULTIPROCESS_DIR, str(tmp_path))
    found = samples(Metrics())
    assert found[("fedresearch_worker_deaths_total", (("how", "SIGKILL"),))] == 2
    assert found[("fedresearch_worker_deaths_total", (("how", "status 1"),))] == 1
    assert found[("fedresearch_retriever_requests_total", (("retriever", "tavily"),))] == 3  # the workers' own


def test_an_unreadable_dead_workers_file_is_set_aside_and_scrapes_read_again(tmp_path, monkeypatch):
    """A file no scrape can read (a disk that filled while a worker wrote it) made every scrape
    fail for as long as it was there: folding sets it aside, and the rest stays counted."""
    good = workers_that_counted(tmp_path, 1)[0]
    broken = tmp_path / "counter_999999.db"
    broken.write_bytes(struct.pack("i", 4096) + b"\0" * 4 + b"\xff\xff\xff\x7f" + b"junk" * 100)
    monkeypatch.setenv(MULTIPROCESS_DIR, str(tmp_path))
    metrics = Metrics()
    with pytest.raises(RuntimeError, match="corrupted"):
        metrics.exposition()

    assert fold_dead_worker(str(tmp_path), 999_999) == 0
    assert fold_dead_worker(str(tmp_path), good) == 2
    garbled = MmapedDict(str(tmp_path / "counter_888888.db"))  # whole, but a key no scrape can parse
    garbled.write_value('["fedresearch_retriever_requests", ', 1.0, 0.0)
    garbled.close()
    assert fold_dead_worker(str(tmp_path), 888_888) == 0  # set aside, not added to the counts kept

    assert samples(metrics)[("fedresearch_retriever_requests_total", (("retriever", "tavily"),))] == 1
    assert (tmp_path / "counter_999999.db.unreadable").exists() and not broken.exists()
    assert (tmp_path / "counter_888888.db.unreadable").exists()
