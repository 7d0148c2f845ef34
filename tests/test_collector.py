"""The garbage collector's pauses as /metrics shows them (freezing is a server process's alone:
tests/test_workers.py checks it there, since this test process must not freeze its objects)."""

from __future__ import annotations

import gc
import re

from prometheus_client import CollectorRegistry, generate_latest

from fedresearch.core.collector import PAUSE_BUCKETS, PauseMetrics, Pauses


def test_each_collection_is_counted_in_its_generation_and_bucket():
    pauses = Pauses()
    gc.callbacks.append(pauses)
    try:
        gc.collect(0)
        gc.collect(2)
        gc.collect(2)
    finally:
        gc.callbacks.remove(pauses)
    full = sum(pauses.counts[2])
    assert sum(pauses.counts[0]) >= 1 and full >= 2 and pauses.seconds[2] > 0
    registry = CollectorRegistry()
    registry.register(PauseMetrics(pauses))
    exposition = generate_latest(registry).decode()
    assert f'fedresearch_gc_pause_seconds_count{{generation="2"}} {full:.1f}' in exposition
    assert f'fedresearch_gc_pause_seconds_bucket{{generation="2",le="+Inf"}} {full:.1f}' in exposition
    buckets = re.findall(r'fedresearch_gc_pause_seconds_bucket\{generation="2",le="[^"]+"\} (\S+)', exposition)
    assert len(buckets) == len(PAUSE_BUCKETS) + 1
    assert [float(count) for count in buckets] == sorted(float(count) for count in buckets)  # cumulative
    assert re.search(r"^fedresearch_gc_frozen_objects \S+$", exposition, re.M)


def test_a_pause_lands_in_the_first_bucket_that_holds_it():
    pauses = Pauses()
    for took in (0.0004, 0.001, 0.03, 7.0):
        pauses.record(1, took)
    assert pauses.counts[1][0] == 2  # 0.4 ms and exactly 1 ms: le="0.001"
    assert pauses.counts[1][PAUSE_BUCKETS.index(0.05)] == 1
    assert pauses.counts[1][-1] == 1  # past every bucket: +Inf only
    assert sum(pauses.counts[0]) == sum(pauses.counts[2]) == 0
    assert abs(pauses.seconds[1] - 7.0314) < 1e-9
