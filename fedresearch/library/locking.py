"""The library's write lock, across processes: a server, CLI ingests and `library check` take turns.

Storing a file in SQLite and indexing it happen under one lock, so a second writer waits before it
commits anything: it never leaves a file stored but unindexed because the index was busy, and never
sees the index mid-write and mistakes it for a damaged one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

WRITER_WAIT_S = 60.0
_POLL_S = 0.1


class IndexBusy(RuntimeError):
    """Another process has held the library's write lock for longer than we wait."""


@contextlib.contextmanager
def exclusive(path: Path, wait_s: float | None = None) -> Iterator[None]:
    """Hold the lock file at `path`, waiting at most `wait_s` (WRITER_WAIT_S) for another holder;
    IndexBusy past that."""
    wait_s = WRITER_WAIT_S if wait_s is None else wait_s
    with path.open("a+") as handle:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise IndexBusy(_busy_message(path, wait_s)) from None
                time.sleep(_POLL_S)
        try:
            handle.truncate(0)
            handle.write(str(os.getpid()))  # who holds it, for the message another writer shows
            handle.flush()
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _busy_message(path: Path, wait_s: float) -> str:
    holder = path.read_text(errors="replace").strip() if path.exists() else ""
    who = f"process {holder}" if holder.isdecimal() else "another process"
    return (
        f"{who} (another ingest?) has been writing the library for over {wait_s:g} s; "
        "nothing more was stored: run this again when it is done"
    )
