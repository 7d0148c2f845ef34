"""The encoder's batches: cut by length so padding stays small, run side by side, same vectors."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from fedresearch.library.embeddings import length_batches, load_encoder


def test_batches_cover_every_text_once_and_cut_where_padding_would_cost_too_much():
    lengths = [12, 300, 14, 13, 250, 11, 40, 41]
    batches = length_batches(lengths, batch_size=3)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    assert all(len(batch) <= 3 for batch in batches)
    for batch in batches:
        longest, real = max(lengths[i] for i in batch), sum(lengths[i] for i in batch)
        assert longest * len(batch) <= real * 1.25 + 8
    assert [sorted(lengths[i] for i in batch) for batch in batches][:2] == [[11, 12, 13], [14]]


def test_questions_of_one_length_share_a_batch():
    assert length_batches([20] * 10, batch_size=16) == [list(range(10))]


def test_two_passes_at_once_give_the_vectors_of_one_pass_at_a_time():
    serial = load_encoder(threads=1, passes=1)
    parallel = load_encoder(threads=1, passes=2)
    assert serial is not None and parallel is not None and parallel.passes == 2
    texts = [("short question " * (1 + i % 7)) + str(i) for i in range(24)] + ["a much longer passage " * 60]
    want = np.stack([serial.encode([text])[0] for text in texts])
    assert np.abs(parallel.encode(texts, batch_size=4) - want).max() < 1e-5
    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda text: parallel.encode([text])[0], texts))
    assert np.abs(np.stack(got) - want).max() < 1e-5
