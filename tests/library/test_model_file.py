"""The encoder's ONNX graph written once to a folder every process maps: one process builds it, the
others map it, the vectors are the ones built in memory give, and a damaged or unwritable folder
costs memory, never the encoder."""

from __future__ import annotations

import logging
import multiprocessing
import os
import stat
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fedresearch.library import onnx_graph
from fedresearch.library.embeddings import Encoder, load_encoder
from fedresearch.library.model_file import model_file

pytest.importorskip("onnxruntime")

TEXTS = ["what limits federated search?", "Rank fusion merges the lists of several engines into one. " * 6]


def _same_vectors(encoder: Encoder, reference: Encoder) -> None:
    assert encoder.backend == "onnxruntime"
    assert np.abs(encoder.encode(TEXTS) - reference.encode(TEXTS)).max() < 1e-6


def test_the_first_encoder_writes_the_graph_and_the_next_maps_it_without_building(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, encoder: Encoder
) -> None:
    cache = tmp_path / "models"
    first = load_encoder(cache_dir=cache)
    folders = list(cache.glob("minilm-*"))
    assert len(folders) == 1
    assert sorted(path.name for path in folders[0].iterdir()) == ["model.onnx", "weights.data"]
    # readable by a server running as another user than the process that wrote it
    assert stat.S_IMODE(folders[0].stat().st_mode) == 0o755
    assert {stat.S_IMODE(path.stat().st_mode) for path in folders[0].iterdir()} == {0o644}

    def build_again(*args: Any) -> onnx.ModelProto:
        raise AssertionError("the graph was built again")

    monkeypatch.setattr(onnx_graph, "build_model", build_again)
    second = load_encoder(cache_dir=cache)
    assert first is not None and second is not None
    _same_vectors(first, encoder)
    _same_vectors(second, encoder)


def _load_counting_builds(cache: str, barrier: Any) -> tuple[int, list[list[float]]]:
    built = []
    build = onnx_graph.build_model

    def counted(*args: Any) -> onnx.ModelProto:
        built.append(1)
        return build(*args)

    onnx_graph.build_model = counted  # type: ignore[assignment]
    barrier.wait()
    loaded = load_encoder(cache_dir=Path(cache))
    assert loaded is not None
    return len(built), loaded.encode(TEXTS).tolist()


def test_processes_starting_together_build_the_graph_once_and_share_it(tmp_path: Path, encoder: Encoder) -> None:
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, ProcessPoolExecutor(3, mp_context=context) as pool:
        barrier = manager.Barrier(3)
        results = list(pool.map(_load_counting_builds, [str(tmp_path / "models")] * 3, [barrier] * 3))
    assert sum(built for built, _ in results) == 1
    for _, vectors in results:
        assert np.abs(np.array(vectors, dtype=np.float32) - encoder.encode(TEXTS)).max() < 1e-6
    assert len(list((tmp_path / "models").glob("minilm-*"))) == 1
    assert not list((tmp_path / "models").glob(".building-*"))


_MAPPED = """
import sys
from pathlib import Path
import onnxruntime  # noqa: F401  (imported before the first reading, as by the server)
from fedresearch.library.embeddings import load_encoder

def anonymous_kb():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("RssAnon"))

before = anonymous_kb()
encoder = load_encoder(cache_dir=Path(sys.argv[1]) if sys.argv[1] else None)  # kept: its session holds the mapping
mapped = any(line.rstrip().endswith("weights.data") for line in open("/proc/self/maps"))
print(anonymous_kb() - before, mapped)
"""


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the process's mappings in /proc")
def test_a_process_maps_the_weights_instead_of_copying_them(tmp_path: Path) -> None:
    cache = tmp_path / "models"
    load_encoder(cache_dir=cache)  # written by another process, as by a worker started before
    weights_kb = next(cache.glob("minilm-*/weights.data")).stat().st_size // 1024

    def loaded(where: str) -> tuple[int, bool]:
        done = subprocess.run([sys.executable, "-c", _MAPPED, where], capture_output=True, text=True, check=True)
        grown, mapped = done.stdout.split()
        return int(grown), mapped == "True"

    grown, mapped = loaded(str(cache))
    assert mapped and grown < weights_kb  # measured: 49 MB of its own, the 88 MB of weights shared
    grown, mapped = loaded("")
    assert not mapped and grown > weights_kb  # in memory: 202 MB


def test_a_graph_that_will_not_load_is_removed_and_the_encoder_built_in_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, encoder: Encoder
) -> None:
    cache = tmp_path / "models"
    load_encoder(cache_dir=cache)
    folder = next(cache.glob("minilm-*"))
    os.truncate(folder / "weights.data", 1000)  # cut short, as by a full disk or a careless copy
    with caplog.at_level(logging.WARNING):
        damaged = load_encoder(cache_dir=cache)
    assert damaged is not None
    _same_vectors(damaged, encoder)
    assert "would not load" in caplog.text and "removed, built in memory" in caplog.text
    assert not folder.exists()
    again = load_encoder(cache_dir=cache)  # the next start writes it again
    assert again is not None and (folder / "weights.data").stat().st_size > 1000
    _same_vectors(again, encoder)


def test_a_folder_that_cannot_be_written_leaves_each_process_its_own_copy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, encoder: Encoder
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache would go")
    with caplog.at_level(logging.WARNING):
        loaded = load_encoder(cache_dir=blocker / "models")
    assert loaded is not None
    _same_vectors(loaded, encoder)
    assert f"cannot write {blocker / 'models'}" in caplog.text and "holds its own copy" in caplog.text


def _tiny_graph() -> onnx.ModelProto:
    weights = numpy_helper.from_array(np.arange(1024, dtype=np.float32), "weights")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "weights"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1024])],
        [weights],
    )
    return helper.make_model(graph)


def test_a_new_key_replaces_the_old_graph_and_clears_what_a_dead_builder_left(tmp_path: Path) -> None:
    cache = tmp_path / "models"
    old = model_file(cache, "0ld", _tiny_graph)
    assert old is not None and old.is_file() and (old.parent / "weights.data").is_file()
    abandoned, building = cache / ".building-dead", cache / ".building-now"
    abandoned.mkdir()
    building.mkdir()
    an_hour_and_more = time.time() - 3700
    os.utime(abandoned, (an_hour_and_more, an_hour_and_more))
    new = model_file(cache, "n3w", _tiny_graph)
    assert new is not None and new.is_file()
    assert not old.parent.exists() and not abandoned.exists()
    assert building.exists()  # another process may be writing it right now
    assert model_file(cache, "n3w", lambda: pytest.fail("built again")) == new


def test_the_int8_graph_is_written_beside_the_float_one_once_and_ranks_as_it_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, encoder: Encoder
) -> None:
    cache = tmp_path / "models"
    first = load_encoder(cache_dir=cache)
    assert first is not None
    texts = [*TEXTS, "Dense retrievers trained on one corpus lose accuracy on another.", "Cookie settings"]
    exact = encoder.encode(texts)
    quick = first.encode(texts, int8=True)
    assert np.allclose(np.linalg.norm(quick, axis=1), 1.0, atol=1e-5)
    assert np.abs(quick - exact).max() > 1e-4  # another graph, not the float one again
    assert float((quick * exact).sum(axis=1).min()) > 0.98
    # the same order of likeness to the question as the float vectors give
    assert list(np.argsort(-(quick[1:] @ quick[0]))) == list(np.argsort(-(exact[1:] @ exact[0])))
    names = sorted(path.name for path in cache.glob("minilm-*"))
    assert len(names) == 2 and names[1] == names[0] + "-int8"
    first_int8 = (cache / names[1] / "model.onnx").stat().st_mtime_ns

    def quantize_again(*args: Any) -> onnx.ModelProto:
        raise AssertionError("the int8 graph was built again")

    monkeypatch.setattr(onnx_graph, "quantized", quantize_again)
    second = load_encoder(cache_dir=cache)
    assert second is not None
    second.prepare_int8()
    assert np.abs(second.encode(texts, int8=True) - quick).max() < 1e-6
    assert (cache / names[1] / "model.onnx").stat().st_mtime_ns == first_int8
    assert sorted(path.name for path in cache.glob("minilm-*")) == names  # neither removes the other


def test_a_cut_to_fewer_word_pieces_is_the_tokenizers_own_cut(encoder: Encoder) -> None:
    """The writer's vectors see 128 word pieces of a text (report.task.RANKING_TOKENS): cut as the
    tokenizer cuts, its closing [SEP] kept; texts within the limit are untouched."""
    from tokenizers import Tokenizer

    from fedresearch.report.task import RANKING_TOKENS

    texts = [*TEXTS, "Reciprocal rank fusion sums one over k plus rank for each engine's list. " * 12]
    assert encoder.max_tokens > len(encoder.tokenizer.encode(texts[-1]).ids) > RANKING_TOKENS
    cut = encoder.encode(texts, max_tokens=RANKING_TOKENS)
    whole = encoder.encode(texts)
    assert np.abs(cut[:2] - whole[:2]).max() < 1e-6
    assert np.abs(cut[2] - whole[2]).max() > 1e-4
    by_hand = encoder.tokenizer.encode(texts[2]).ids
    by_hand = by_hand[: RANKING_TOKENS - 1] + by_hand[-1:]
    tokenizer = Tokenizer.from_str(encoder.tokenizer.to_str())
    tokenizer.enable_truncation(RANKING_TOKENS)
    assert tokenizer.encode(texts[2]).ids == by_hand
    assert np.allclose(cut[2], encoder._pass([by_hand], encoder._session)[0], atol=1e-6)


def test_onnx_runtime_runs_the_graphs_with_gelu_fused_and_int8_without_skip_layer_normalization(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ONNX Runtime makes of the graphs decides their speed: GELU written as PyTorch exports it
    becomes one kernel (five element-wise passes before, a quarter of the int8 graph's time), and
    the SkipLayerNormalization fusion, whose kernel took another quarter, is off for the int8 graph.
    ONNX Runtime ignores an optimizer name it does not know, so the graphs it runs are read."""
    import onnxruntime

    real = onnxruntime.InferenceSession
    optimized: list[Path] = []

    def saving(model: Any, options: Any, *args: Any, **kwargs: Any) -> Any:
        optimized.append(tmp_path / f"optimized-{len(optimized)}.onnx")
        options.optimized_model_filepath = str(optimized[-1])
        return real(model, options, *args, **kwargs)

    monkeypatch.setattr(onnxruntime, "InferenceSession", saving)
    encoder = load_encoder(cache_dir=tmp_path / "models")
    assert encoder is not None
    encoder.prepare_int8()
    assert len(optimized) == 2  # the float graph's session, then the int8 one's
    ran = [{node.op_type for node in onnx.load(str(path), load_external_data=False).graph.node} for path in optimized]
    assert "BiasGelu" in ran[0] and "Erf" not in ran[0]
    assert "Gelu" in ran[1] and "Erf" not in ran[1]
    assert "LayerNormalization" in ran[1] and "SkipLayerNormalization" not in ran[1]
    assert "DynamicQuantizeMatMul" in ran[1]  # the int8 graph, its other fusions kept


def test_without_an_int8_graph_the_float_one_serves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    def broken(*args: Any) -> onnx.ModelProto:
        raise ValueError("no quantizer here")

    monkeypatch.setattr(onnx_graph, "quantized", broken)
    loaded = load_encoder(cache_dir=tmp_path / "models")
    assert loaded is not None
    with caplog.at_level(logging.WARNING):
        assert np.abs(loaded.encode(TEXTS, int8=True) - loaded.encode(TEXTS)).max() < 1e-6
    assert any("no int8 graph" in record.getMessage() for record in caplog.records)
