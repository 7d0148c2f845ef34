"""The garbage collector's pauses as /metrics shows them (freezing is a server process's alone:
tests/serve/test_workers.py checks it there, since this test process must not freeze its objects)."""

from __future__ import annotations

import gc
import re

from fedresearch.core.collector import PAUSE_BUCKETS, Pauses
from fedresearch.core.metrics import Metrics


def test_each_collection_is_counted_in_its_generation_and_bucket():
    pauses = Pauses()
    gc.callbacks.append(pauses)
    try:
        gc.collect(0)
        gc.collect(2)
        gc.collect(2)
    finally:
        gc.callbacks.remove(pauses)
    full = sum(1 for generation, _ in pauses.pending if generation == 2)
    assert full >= 2 and any(generation == 0 for generation, _ in pauses.pending)
    metrics = Metrics()
    metrics.pauses = pauses
    exposition = metrics.exposition().decode()  # a scrape hands over what the callback noted
    assert not pauses.pending
    assert f'fedresearch_gc_pause_seconds_count{{generation="2"}} {full:.1f}' in exposition
    assert f'fedresearch_gc_pause_seconds_bucket{{generation="2",le="+Inf"}} {full:.1f}' in exposition
    assert float(re.findall(r'fedresearch_gc_pause_seconds_sum\{generation="2"\} (\S+)', exposition)[0]) > 0
    buckets = re.findall(r'fedresearch_gc_pause_seconds_bucket\{generation="2",le="[^"]+"\} (\S+)', exposition)
    assert len(buckets) == len(PAUSE_BUCKETS) + 1
    assert [float(count) for count in buckets] == sorted(float(count) for count in buckets)  # cumulative
    assert re.search(r"^fedresearch_gc_frozen_objects \S+$", exposition, re.M)


def test_a_pause_lands_in_the_first_bucket_that_holds_it():
    pauses, metrics = Pauses(), Metrics()
    pauses.pending.extend((1, took) for took in (0.0004, 0.001, 0.03, 7.0))
    pauses.publish(metrics.gc_pauses)
    exposition = metrics.exposition().decode()

    def bucket(bound: str) -> float:
        return float(re.findall(rf'_bucket\{{generation="1",le="{re.escape(bound)}"\}} (\S+)', exposition)[0])

    assert bucket("0.001") == 2  # 0.4 ms and exactly 1 ms: le="0.001"
    assert bucket("0.025") == 2 and bucket("0.05") == 3
    assert bucket("2.5") == 3 and bucket("+Inf") == 4  # past every bucket: +Inf only
    assert 'fedresearch_gc_pause_seconds_count{generation="0"} 0.0' in exposition
    assert abs(float(re.findall(r'_sum\{generation="1"\} (\S+)', exposition)[0]) - 7.0314) < 1e-9
