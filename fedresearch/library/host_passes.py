"""The encoder's forward passes across every process of a host: at most one per usable core at once.

Each process runs a pass per core (embeddings.py), so `serve --workers N` on N cores could run N
times as many as the cores, each taking its working memory (65-90 MB for an upload's batch of 8
passages of 250 tokens) and a core's time it does not get: uploads to 16 workers of a 16-core host
at once ran up to 128 passes (8 a call), eight to a core, each holding its memory meanwhile.
A pass now holds one of `slots` lock files in a folder every process of the host shares (the
model's, beside its graph): a lone upload still has every core, uploads to several workers share
them, and questions take a free slot as a pass does. flock's locks belong to an open file and end
with it, so a process that dies (SIGKILL included) frees its slots at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import logging
import os
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

FOLDER = "passes"


class HostPasses:
    """`with passes.slot():` one of the host's `slots` passes, waiting while other processes (and
    this one's threads) hold them all."""

    def __init__(self, files: list[int]) -> None:
        self.slots = len(files)
        self._files = files
        # a lock belongs to an open file, and a process's threads share its files: two threads of
        # this process must not think they hold the same slot
        self._ours = [threading.Lock() for _ in files]
        self._turns = itertools.count(os.getpid())  # processes start their search at different slots
        weakref.finalize(self, _close, files)  # the files, and so the locks, live as long as this

    @classmethod
    def open(cls, cache_dir: Path, slots: int) -> HostPasses | None:
        """The host's passes in `cache_dir`'s folder of them; None (each process on its own, as
        before) where that folder cannot be made or its files opened, which the log says."""
        folder = cache_dir / FOLDER
        files: list[int] = []
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for number in range(slots):
                files.append(_open(folder / str(number)))
        except OSError as error:
            for descriptor in files:
                os.close(descriptor)
            log.warning(
                "embedding model: cannot use %s (%s); each process runs its own passes, not shared", folder, error
            )
            return None
        return cls(files)

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        number = self._take()
        try:
            yield
        finally:
            fcntl.flock(self._files[number], fcntl.LOCK_UN)
            self._ours[number].release()

    def _take(self) -> int:
        first = next(self._turns) % self.slots
        order = [(first + offset) % self.slots for offset in range(self.slots)]
        for number in order:
            if self._ours[number].acquire(blocking=False):
                try:
                    fcntl.flock(self._files[number], fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return number
                except BlockingIOError:
                    self._ours[number].release()
        # all taken: wait for one this process's threads are not using (the encoder lets no more
        # threads in than there are slots, so there is one), held by another process
        for number in order:
            if self._ours[number].acquire(blocking=False):
                break
        else:
            number = first
            self._ours[number].acquire()
        try:
            fcntl.flock(self._files[number], fcntl.LOCK_EX)
        except BaseException:
            self._ours[number].release()
            raise
        return number


def _close(files: list[int]) -> None:
    for descriptor in files:
        os.close(descriptor)


def _open(path: Path) -> int:
    # flock needs no write access: a server and an ingest run as another user share the slots
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except PermissionError:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
