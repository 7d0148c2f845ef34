"""The encoder's batches: cut by length so padding stays small, run side by side, same vectors."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

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


_LONG_CALL = """
import sys
import numpy as np
from fedresearch.library import embeddings

def anonymous_mb():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("RssAnon")) // 1024

if sys.argv[1] == "keep":
    embeddings._RELEASE_TOKENS = 10**12  # as before: the arena keeps what the largest pass took
encoder = embeddings.load_encoder()
assert encoder is not None and encoder.backend == "onnxruntime"
passages = [("Federated retrieval merges the ranked lists of several engines; " * 24) + str(i) for i in range(256)]
first = encoder.encode(passages[:4])
before = anonymous_mb()
for start in range(0, len(passages), 64):  # as an upload's passages are sent: 64 a call, 8 a pass
    encoder.encode(passages[start : start + 64], batch_size=8)
grown = anonymous_mb() - before
again = encoder.encode(passages[:4])
print(grown, float(np.abs(first - again).max()))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the process's memory in /proc")
def test_an_uploads_encoding_gives_its_working_memory_back():
    pytest.importorskip("onnxruntime")

    def grown_mb(how: str) -> tuple[int, float]:
        done = subprocess.run([sys.executable, "-c", _LONG_CALL, how], capture_output=True, text=True, check=True)
        grown, difference = done.stdout.split()
        return int(grown), float(difference)

    kept, _ = grown_mb("keep")
    released, difference = grown_mb("release")
    assert kept > 60  # measured here (2 passes at once): 104 and 175 MB; more with a pass per core
    assert released < 30  # measured: less than before the upload (-53 MB), its heap handed back too
    assert difference < 1e-6  # the passes after it read the same vectors
