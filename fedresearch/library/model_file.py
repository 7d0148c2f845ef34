"""The encoder's ONNX graph, written once to a folder every process of a host maps from.

Built in memory, the graph and its 90 MB of weights were copied into each process (the weights as
loaded, the graph holding them, its bytes, ONNX Runtime's own copy): 204 MB more memory (PSS) a
worker, 627 MB at its peak while it started, 0.6 s of CPU. ONNX Runtime maps a model's external data file
instead, read-only, so every worker on the host shares one copy in the page cache, and only the
pages a pass touches are read (the word embeddings, half the weights, are mostly never touched).
The folder's name carries a key of what the graph is built from, so a new model or a changed
graph builds a new folder. One process builds it while the others starting beside it wait, under
a temporary name renamed when whole, so none reads half a file, even after a crash.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import onnx

from fedresearch.library.locking import IndexBusy, exclusive

log = logging.getLogger(__name__)

GRAPH = "model.onnx"
WEIGHTS = "weights.data"
_PREFIX = "minilm-"
_BUILDING = ".building-"
_ABANDONED_S = 3600.0  # a building folder this old was left by a process that died while writing it
_BUILD_WAIT_S = 120.0


def model_key(model_dir: Path, builder: Path) -> str:
    """What the graph is built from: the weights (by size and time, as a reinstall changes them),
    the model's configuration, the code that builds the graph and the onnx that writes it."""
    digest = hashlib.sha256()
    weights = (model_dir / "model.safetensors").stat()
    digest.update(f"{weights.st_size}:{weights.st_mtime_ns}:{onnx.__version__}\n".encode())
    digest.update((model_dir / "config.json").read_bytes())
    digest.update(builder.read_bytes())
    return digest.hexdigest()[:16]


def model_file(cache_dir: Path, key: str, build: Callable[[], onnx.ModelProto], variant: str = "") -> Path | None:
    """The graph's file in `cache_dir`, built by `build` when no process has built it yet; None
    (and why, in the log) when the folder cannot be written. A `variant` (the int8 graph) is a
    folder of its own beside the graph of the same key."""
    final = cache_dir / f"{_PREFIX}{key}{variant}"
    if (final / GRAPH).is_file():
        return final / GRAPH
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        # one process builds while the others wait for its file: each building at once would take
        # 0.5 GB at its peak, in a container sized for what the workers hold once started
        with exclusive(cache_dir / ".lock", wait_s=_BUILD_WAIT_S):
            if (final / GRAPH).is_file():
                return final / GRAPH
            return _build(cache_dir, final, build, keep=f"{_PREFIX}{key}")
    except IndexBusy:
        log.warning(
            "embedding model: another process has been writing %s for over %g s; this one holds its own copy",
            cache_dir,
            _BUILD_WAIT_S,
        )
    except OSError as error:
        log.warning("embedding model: cannot write %s (%s); each process holds its own copy", cache_dir, error)
    return None


def _build(cache_dir: Path, final: Path, build: Callable[[], onnx.ModelProto], keep: str) -> Path:
    started = time.perf_counter()
    if final.exists():  # a folder emptied by hand: it would refuse the rename below at every start
        shutil.rmtree(final)
    building = Path(tempfile.mkdtemp(prefix=_BUILDING, dir=cache_dir))
    try:
        onnx.save_model(
            build(),
            str(building / GRAPH),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=WEIGHTS,
            size_threshold=1024,
        )
        for written in (GRAPH, WEIGHTS):  # on disk before its name says it is whole, should power fail
            descriptor = os.open(building / written, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
            # public weights, readable by every user: a server may run as another user than the
            # `fedresearch ingest` that wrote them (`docker exec` as root)
            (building / written).chmod(0o644)
        building.chmod(0o755)
        os.rename(building, final)  # whole or not at all, should this process die while writing
    except OSError:
        if (final / GRAPH).is_file():  # renamed first by a process the lock did not hold back (NFS)
            return final / GRAPH
        raise
    finally:
        shutil.rmtree(building, ignore_errors=True)  # nothing is left there after the rename
    took = time.perf_counter() - started
    log.info("embedding model: graph written to %s in %.1f s, mapped by every process", final, took)
    _remove_others(cache_dir, keep)
    return final / GRAPH


def forget(graph: Path) -> None:
    """Remove a graph's folder that would not load, so the next start builds it again."""
    shutil.rmtree(graph.parent, ignore_errors=True)


def _remove_others(cache_dir: Path, keep: str) -> None:
    # graphs of other keys belong to a model or a builder no longer installed; a process still
    # running on one keeps its mapping after the unlink. `keep` is this key's folder name, which
    # its variants' names begin with.
    now = time.time()
    for entry in cache_dir.iterdir():
        if entry.name.startswith(keep):
            continue
        if entry.name.startswith(_PREFIX) or (entry.name.startswith(_BUILDING) and now - _mtime(entry) > _ABANDONED_S):
            shutil.rmtree(entry, ignore_errors=True)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return time.time()
