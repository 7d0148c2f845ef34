"""The embedded library at scale: ingest rate, disk, peak RSS, and search latency per mode.

    python -m bench.library [--sizes 10000,100000] [--queries 200]
    python -m bench.library --encoders [--queries 200]
    python -m bench.library --crosslingual

--encoders compares the two forward passes of the same model side by side in one process (ONNX
Runtime and numpy): query encoding alone, ingest with real embeddings, and 16 threads asking
different questions at once (batched by the query-vector cache, against one pass per question).

--crosslingual measures what searching a question in the other language too adds (crosslingual.py):
the dictionary's first load and its reading backwards (time, RSS), translating and segmenting each
of med-zh's questions, looking up their English twins' Chinese words, a 400-character question in
each language, and BM25 over MED with each question widened against the question as it is; run on
its own, in a process of its own.

Passages are generated from the word distribution of the collections in ../shared/datasets
(~120 words each). The ingest rate is measured with real embeddings on a sample; the bulk of the
passage vectors are random unit vectors, because embedding 100k passages on 2 cores takes over an
hour and the search cost does not depend on the values. Query encoding is always real and is timed
both alone and inside every dense and hybrid figure. Each size runs in a fresh process so its peak
RSS is its own. The measured user holds min(size, 100k) passages; larger sizes spread the rest
over other users, as a shared server would.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from bench.quality import DEFAULT_DATASETS, load_collection
from fedresearch.library import crosslingual
from fedresearch.library.embeddings import Encoder, load_encoder
from fedresearch.library.facade import Library
from fedresearch.library.formats import Document, Section
from fedresearch.library.search import SearchFilters

PER_USER = 100_000


class SyntheticPassages:
    """Real query vectors, random unit passage vectors (see the module docstring)."""

    def __init__(self, real: Encoder) -> None:
        self.real = real
        self.dims = real.dims
        self.rng = np.random.default_rng(7)

    def encode(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        if len(texts) == 1:
            return self.real.encode(texts)
        vectors = self.rng.standard_normal((len(texts), self.dims)).astype(np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def word_distribution(datasets: Path) -> tuple[list[str], np.ndarray, list[str]]:
    counts: Counter[str] = Counter()
    queries = []
    for collection in sorted(p for p in datasets.iterdir() if (p / "corpus.jsonl").exists()):
        for line in (collection / "corpus.jsonl").open():
            counts.update(json.loads(line)["text"].lower().split())
        queries += [json.loads(line)["text"] for line in (collection / "queries.jsonl").open()]
    words = list(counts)
    frequencies = np.array([counts[w] for w in words], dtype=np.float64)
    return words, frequencies / frequencies.sum(), queries


def passages(words: list[str], p: np.ndarray, count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(words), size=(count, 120), p=p)
    return [" ".join(words[i] for i in row) + "." for row in picks]


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {statistics.median(ordered):6.2f} ms  p99 {p99:6.2f} ms"


def run_size(size: int, query_count: int, datasets: Path) -> dict:
    encoder = load_encoder()
    assert encoder is not None, "the embedding model is not installed (make installs it)"
    words, p, queries = word_distribution(datasets)
    directory = Path(tempfile.mkdtemp(prefix=f"bench-library-{size}-"))

    sample = passages(words, p, 512, seed=1)
    real = Library(directory / "sample", encoder=encoder)
    started = time.perf_counter()
    real.add_documents("sample", [Document("biblio", f"s{i}", "", [Section(t)]) for i, t in enumerate(sample)])
    real_rate = len(sample) / (time.perf_counter() - started)

    library = Library(directory / "library", encoder=SyntheticPassages(encoder))  # type: ignore[arg-type]
    started = time.perf_counter()
    users = max(1, -(-size // PER_USER))
    for user in range(users):
        count = min(PER_USER, size - user * PER_USER)
        for start in range(0, count, 20_000):
            texts = passages(words, p, min(20_000, count - start), seed=user * 1000 + start)
            batch = [Document("biblio", f"u{user}-{start + i}", "", [Section(t)]) for i, t in enumerate(texts)]
            library.add_documents(f"user{user}", batch)
    build_s = time.perf_counter() - started
    disk_mb = sum(f.stat().st_size for f in (directory / "library").rglob("*") if f.is_file()) / 1e6

    started = time.perf_counter()
    library.search("user0", "warm up", top_k=10)  # loads the user's matrix once
    load_ms = (time.perf_counter() - started) * 1000
    asked = [queries[i % len(queries)] for i in range(query_count)]
    timings: dict[str, list[float]] = {"encode": [], "bm25": [], "dense": [], "hybrid": []}
    for query in asked:
        for name, call in (
            ("encode", lambda q=query: encoder.encode([q])),
            ("bm25", lambda q=query: library.search("user0", q, "biblio", 10, "bm25")),
            ("dense", lambda q=query: library.search("user0", q, "biblio", 10, "dense")),
            ("hybrid", lambda q=query: library.search("user0", q, "biblio", 10, "hybrid")),
        ):
            library._query_vectors.clear()  # time real encoding, not the repeated-query cache
            started = time.perf_counter()
            call()
            timings[name].append((time.perf_counter() - started) * 1000)
    return {
        "size": size,
        "user_rows": min(size, PER_USER),
        "ingest_passages_per_s_real_embeddings": round(real_rate, 1),
        "build_s_synthetic_vectors": round(build_s, 1),
        "disk_mb": round(disk_mb, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "first_query_matrix_load_ms": round(load_ms, 1),
        "latency": {name: percentiles(values) for name, values in timings.items()},
    }


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def crosslingual_cost(datasets: Path, rounds: int = 20) -> None:
    questions = [json.loads(line) for line in (datasets / "med-zh" / "queries.jsonl").open()]
    chinese = [q["text"] for q in questions]
    english = [q["metadata"]["english"] for q in questions]
    long_question = ("请帮我查找" + "关于肺癌免疫治疗、基因突变与预后因素的临床研究文献，" * 15)[:400]
    before = _rss_mb()
    started = time.perf_counter()
    crosslingual.dictionary()
    print(f"dictionary: first load {(time.perf_counter() - started) * 1000:.0f} ms, RSS +{_rss_mb() - before:.1f} MB")
    before = _rss_mb()
    started = time.perf_counter()
    crosslingual.reverse()
    built = (time.perf_counter() - started) * 1000
    print(f"read backwards: first build {built:.0f} ms, RSS +{_rss_mb() - before:.1f} MB")
    for label, texts in (
        ("med-zh's 30 Chinese questions", chinese),
        ("the same questions in English", english),
        ("the English questions, 400 characters", [" ".join(english)[:400]]),
        ("one 400-character Chinese question", [long_question]),
    ):
        timings = []
        for _ in range(rounds):
            for text in texts:
                started = time.perf_counter()
                crosslingual.query_texts(text)
                timings.append((time.perf_counter() - started) * 1000)
        print(f"  translate and segment, {label:<36} {percentiles(timings)}")
    corpus, _, _ = load_collection(datasets / "med")
    library = Library(Path(tempfile.mkdtemp(prefix="bench-crosslingual-")))  # BM25 only: no vectors needed
    papers = [Document("biblio", d["_id"], d.get("title") or "", [Section(d["text"])]) for d in corpus]
    library.add_documents("u", papers)
    searched = (
        ("the Chinese question as it is", chinese, lambda q: q),
        ("the Chinese question translated", chinese, lambda q: crosslingual.query_texts(q).full_text),
        ("the English question as it is", english, lambda q: q),
        ("the English question and its Chinese words", english, lambda q: crosslingual.query_texts(q).full_text),
    )
    for label, texts, make in searched:
        timings = []
        for _ in range(rounds):
            for text in texts:
                full_text = make(text)
                started = time.perf_counter()
                library.store.bm25("u", "biblio", full_text, SearchFilters(), 100)
                timings.append((time.perf_counter() - started) * 1000)
        print(f"  BM25 over MED, {label:<44} {percentiles(timings)}")


# (label, backend, threads per pass, passes at once, cut batches by padding): the last session's
# ONNX set-up (2 threads, one pass, batches padded to their longest text) first, then this one
ENCODER_SETUPS = (
    ("ort 2 threads x 1 pass, padded", "onnxruntime", 2, 1, False),
    ("ort 1 thread x 2 passes, bucketed", "onnxruntime", 1, 2, True),
    ("numpy", "numpy", 1, 1, True),
)


def compare_encoders(query_count: int, datasets: Path) -> None:
    """Every set-up in ENCODER_SETUPS, interleaved round by round so load changes hit them alike."""
    import os

    words, p, queries = word_distribution(datasets)
    sample = passages(words, p, 128, seed=1)
    asked = [queries[i % len(queries)] for i in range(query_count)]
    print(f"load average before: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    encoders = _encoder_setups(asked[:4])
    figures: dict[str, dict[str, list[float]]] = {
        label: {"query": [], "query_cpu": [], "ingest": [], "ingest_cpu": [], "batched": [], "each": []}
        for label in encoders
    }
    for round_ in range(3):
        for label, encoder in encoders.items():
            _encoder_round(encoder, asked, sample, round_, figures[label])
    print(f"load average after: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    header = f"{'set-up':<36} {'query encoding':<32} {'CPU ms':>7} {'ingest passages/s':>18} {'per CPU-s':>10}"
    print(f"{header} {'16 at once, batched':>20} {'one pass each':>14}")
    for label, got in figures.items():
        batched, each = statistics.median(got["batched"]), statistics.median(got["each"])
        rate, cpu_rate = statistics.median(got["ingest"]), statistics.median(got["ingest_cpu"])
        line = f"{label:<36} {percentiles(got['query']):<32} {statistics.median(got['query_cpu']):>7.2f}"
        print(f"{line} {rate:>18.1f} {cpu_rate:>10.1f} {batched:>17.0f} ms {each:>11.0f} ms")


def _encoder_setups(warm_up: list[str]) -> dict[str, Encoder]:
    import math

    encoders = {}
    for label, backend, threads, passes, bucketed in ENCODER_SETUPS:
        encoder = load_encoder(backend=backend, threads=threads, passes=passes)  # type: ignore[arg-type]
        assert encoder is not None, "the embedding model is not installed (make installs it)"
        encoder.padding_share = encoder.padding_share if bucketed else math.inf
        encoder.encode(warm_up)
        encoders[label] = encoder
    return encoders


def _encoder_round(
    encoder: Encoder, asked: list[str], sample: list[str], round_: int, figures: dict[str, list[float]]
) -> None:
    """A third of the questions one at a time, a third of the passages ingested, 16 questions at once."""
    slow = encoder.backend == "numpy"  # numpy is slow: a shorter sample
    for query in asked[round_::3][: 10 if slow else None]:
        started, cpu = time.perf_counter(), time.process_time()
        encoder.encode([query])
        figures["query"].append((time.perf_counter() - started) * 1000)
        figures["query_cpu"].append((time.process_time() - cpu) * 1000)
    library = Library(Path(tempfile.mkdtemp(prefix="bench-encoder-")), encoder=encoder)
    part = sample[round_::3][: 8 if slow else None]
    started, cpu = time.perf_counter(), time.process_time()
    library.add_documents("u", [Document("biblio", f"s{i}", "", [Section(t)]) for i, t in enumerate(part)])
    figures["ingest"].append(len(part) / (time.perf_counter() - started))
    figures["ingest_cpu"].append(len(part) / (time.process_time() - cpu))
    batched, each = concurrent_queries(library, encoder, asked[16 * round_ : 16 * round_ + 16])
    figures["batched"].append(batched)
    figures["each"].append(each)


def concurrent_queries(library: Library, encoder: Encoder, questions: list[str]) -> tuple[float, float]:
    """Wall time for 16 threads each asking its own question: through the batching cache, and one pass each."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(questions)) as pool:
        library._query_vectors.clear()  # type: ignore[union-attr]
        started = time.perf_counter()
        list(pool.map(library.query_vector, questions))
        batched = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        list(pool.map(lambda q: encoder.encode([q]), questions))
        serial = (time.perf_counter() - started) * 1000
    return batched, serial


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--datasets", type=Path, default=DEFAULT_DATASETS)
    parser.add_argument("--single", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--encoders", action="store_true", help="compare ONNX Runtime and numpy side by side")
    parser.add_argument("--crosslingual", action="store_true", help="what translating Chinese questions adds")
    args = parser.parse_args()
    if args.crosslingual:
        crosslingual_cost(args.datasets)
        return
    if args.encoders:
        compare_encoders(args.queries, args.datasets)
        return
    if args.single:
        print(json.dumps(run_size(args.single, args.queries, args.datasets)))
        return
    for size in (int(s) for s in args.sizes.split(",")):
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.library",
                "--single",
                str(size),
                "--queries",
                str(args.queries),
                "--datasets",
                str(args.datasets),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        result = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"\n{size:,} passages (measured user holds {result['user_rows']:,})")
        for key, value in result.items():
            if key != "latency":
                print(f"  {key:<40} {value}")
        for name, line in result["latency"].items():
            print(f"  {name:<8} {line}")


if __name__ == "__main__":
    main()
