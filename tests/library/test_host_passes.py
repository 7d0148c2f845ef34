"""The encoder's passes across the processes of a host: never more at once than the host's slots."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fedresearch.core.cores import usable_cores
from fedresearch.library.embeddings import load_encoder
from fedresearch.library.host_passes import HostPasses

# a process of its own: `threads` threads each take a slot `rounds` times, hold it 15 ms, and the
# moments they held it are printed (CLOCK_MONOTONIC: one clock for every process of the machine)
_HOLDERS = """
import json, sys, threading, time
from pathlib import Path
from fedresearch.library.host_passes import HostPasses

folder, slots, threads, rounds = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
passes = HostPasses.open(folder, slots)
held, lock = [], threading.Lock()

def work():
    for _ in range(rounds):
        with passes.slot():
            start = time.monotonic()
            time.sleep(0.015)
            end = time.monotonic()
        with lock:
            held.append((start, end))

workers = [threading.Thread(target=work) for _ in range(threads)]
for worker in workers:
    worker.start()
for worker in workers:
    worker.join()
print(json.dumps(held))
"""

# a process of its own that takes every one of `slots` slots, says so, and holds them until its
# standard input closes (or it is killed)
_HOGGING = """
import os
import sys
from pathlib import Path
from fedresearch.library.host_passes import HostPasses

passes = HostPasses.open(Path(sys.argv[1]), int(sys.argv[2]))
held = [passes.slot() for _ in range(passes.slots)]
for slot in held:
    slot.__enter__()
print("held", flush=True)
sys.stdin.read()
os._exit(0)  # its slots end with its files, as a killed process's do
"""


def _most_at_once(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(end, -1) for _, end in intervals] + [(start, 1) for start, _ in intervals])
    running = most = 0
    for _, change in events:  # at one moment an end counts before a start
        running += change
        most = max(most, running)
    return most


def _python(script: str, *args: object, **options: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)],
        text=True,
        stdout=subprocess.PIPE,
        **options,  # type: ignore[call-overload]
    )


def test_processes_together_hold_no_more_slots_than_the_host_has(tmp_path: Path):
    # three processes of three threads each: nine callers at once for two slots
    processes = [_python(_HOLDERS, tmp_path, 2, 3, 12) for _ in range(3)]
    intervals = []
    for process in processes:
        out, _ = process.communicate(timeout=120)
        assert process.returncode == 0
        intervals += [tuple(pair) for pair in json.loads(out)]
    assert len(intervals) == 3 * 3 * 12
    assert _most_at_once(intervals) == 2  # each process alone would have run 3 at once; both slots in use


def test_threads_of_one_process_never_share_a_slot(tmp_path: Path):
    passes = HostPasses.open(tmp_path, 1)
    assert passes is not None
    held: list[tuple[float, float]] = []

    def work() -> None:
        for _ in range(10):
            with passes.slot():
                start = time.monotonic()
                time.sleep(0.005)
                held.append((start, time.monotonic()))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(held) == 40 and _most_at_once(held) == 1  # one file, one lock: threads shared it before


def test_a_process_killed_while_holding_every_slot_frees_them(tmp_path: Path):
    hog = _python(_HOGGING, tmp_path, 2, stdin=subprocess.PIPE)
    assert hog.stdout is not None and hog.stdout.readline().strip() == "held"
    passes = HostPasses.open(tmp_path, 2)
    assert passes is not None
    got = threading.Event()

    def take() -> None:
        with passes.slot():
            got.set()

    taker = threading.Thread(target=take, daemon=True)
    taker.start()
    assert not got.wait(0.5)  # every slot is the other process's
    hog.kill()
    hog.wait(10)
    assert got.wait(10)  # the kernel drops a dead process's locks with its files


@pytest.mark.skipif(os.environ.get("FEDRESEARCH_MODEL_CACHE_DIR") is None, reason="the session's model folder")
def test_an_encoder_waits_while_other_processes_run_every_pass_of_the_host():
    pytest.importorskip("onnxruntime")
    models = Path(os.environ["FEDRESEARCH_MODEL_CACHE_DIR"])
    encoder = load_encoder(cache_dir=models)
    assert encoder is not None and encoder.backend == "onnxruntime"
    first = encoder.encode(["federated retrieval"])
    hog = _python(_HOGGING, models, usable_cores().usable, stdin=subprocess.PIPE)
    try:
        assert hog.stdout is not None and hog.stdout.readline().strip() == "held"
        done = threading.Event()
        vectors = []

        def question() -> None:
            vectors.append(encoder.encode(["federated retrieval"]))
            done.set()

        threading.Thread(target=question, daemon=True).start()
        assert not done.wait(0.5)  # before: encoded at once, beside the other process's passes
    finally:
        assert hog.stdin is not None
        hog.stdin.close()
        hog.wait(10)
    assert done.wait(10)
    assert abs(vectors[0] - first).max() < 1e-6


def test_a_folder_that_cannot_be_made_leaves_each_process_on_its_own(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    blocked = tmp_path / "a file"
    blocked.write_text("not a folder")
    with caplog.at_level(logging.WARNING):
        assert HostPasses.open(blocked, 2) is None
    assert "each process runs its own passes" in caplog.text
