"""Query vectors: cached, one pass per question, and questions asked at once encoded as one batch."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from fedresearch.library.query_vectors import QueryVectors


class Recording:
    """The real encoder, recording each call's batch; the first pass is held long enough for a queue to form."""

    def __init__(self, encoder) -> None:
        self.encoder = encoder
        self.dims = encoder.dims
        self.calls: list[list[str]] = []
        self.fail_on: str | None = None
        self._first = True
        self._lock = threading.Lock()

    def encode(self, texts, batch_size=32):
        with self._lock:
            self.calls.append(list(texts))
            first, self._first = self._first, False
        if first:
            time.sleep(0.5)
        if self.fail_on in texts:
            raise RuntimeError("encoder failed")
        return self.encoder.encode(texts, batch_size)


def test_concurrent_questions_share_one_pass_and_get_their_own_vectors(encoder):
    recording = Recording(encoder)
    vectors = QueryVectors(recording)
    questions = [f"question number {i} about retrieval" for i in range(12)]
    with ThreadPoolExecutor(12) as pool:
        first = pool.submit(vectors, questions[0])
        time.sleep(0.1)  # the first pass is running: the rest queue behind it
        rest = list(pool.map(vectors, questions[1:] + questions[1:3]))
    assert len(recording.calls) == 2 and sorted(recording.calls[1]) == sorted(questions[1:])
    expected = encoder.encode(questions)
    for got, want in zip([first.result(), *rest[:11]], expected, strict=True):
        assert np.abs(got - want).max() < 1e-5
    assert vectors.batches == 2
    vectors(questions[5])
    assert len(recording.calls) == 2  # cached


def test_a_failed_pass_fails_only_its_askers_and_the_next_pass_runs(encoder):
    recording = Recording(encoder)
    recording.fail_on = "bad question"
    vectors = QueryVectors(recording)
    with ThreadPoolExecutor(4) as pool:
        bad = pool.submit(vectors, "bad question")
        time.sleep(0.1)
        later = pool.submit(vectors, "a later good question")
        with pytest.raises(RuntimeError, match="encoder failed"):
            bad.result()
        assert later.result().shape == (encoder.dims,)
    assert vectors("a second good question").shape == (encoder.dims,)


def test_past_the_deadline_texts_not_started_come_back_empty_and_leave_the_queue(encoder):
    recording = Recording(encoder)
    vectors = QueryVectors(recording, batch=2)
    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(vectors, "the first pass holds the encoder")
        time.sleep(0.1)
        texts = ["snippet one", "snippet two", "snippet three"]
        got = vectors.many(texts, deadline=time.monotonic() + 0.2)
        slow.result()
    assert got == [None, None, None]  # the encoder was busy until after the deadline
    assert len(recording.calls) == 1 and not vectors._queue and not vectors._pending
    again = vectors.many(texts, deadline=time.monotonic() + 30)
    assert all(v is not None for v in again) and [len(c) for c in recording.calls[1:]] == [2, 1]


class Held:
    """The real encoder, running `passes` at once; a pass over `hold` waits until `release` is set."""

    def __init__(self, encoder, hold: str) -> None:
        self.encoder, self.dims, self.passes, self.hold = encoder, encoder.dims, 2, hold
        self.release = threading.Event()

    def encode(self, texts, batch_size=32):
        if self.hold in texts:
            assert self.release.wait(30)
        return self.encoder.encode(texts, batch_size)


def test_an_encoder_running_two_passes_serves_two_batches_at_once(encoder):
    held = Held(encoder, "the first pass holds one core")
    vectors = QueryVectors(held)
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(vectors, held.hold)
        time.sleep(0.1)
        second = pool.submit(vectors, "a second question takes the other core")
        try:
            assert second.result(timeout=20).shape == (encoder.dims,)  # with one pass it would wait for `first`
            assert not first.done()
        finally:
            held.release.set()
        assert first.result().shape == (encoder.dims,)
