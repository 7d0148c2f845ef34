"""What a server process that dies leaves behind, and who cleans it up (the process ties: Linux only).

A worker killed with SIGKILL (the OOM killer, an operator) in the middle of an upload left the PDF
reader it had started (library/pdf.py) running on alone: the reader's time limit is kept by the
worker, so a file that parses slowly, or an input that never ends, kept a process and its memory
for as long as it took. The reader now dies with the process that started it, and never uses more
CPU time than a read is allowed.

Whoever adopts such an orphan must also reap it when it ends. In a container the supervisor of
`serve --workers N` is often PID 1, which adopts every orphan, and it waited only on its own workers:
the orphans stayed zombies. The supervisor now adopts its workers' orphans wherever it runs (a child
subreaper), and reaps them.

A killed process also leaves its temporary folders: an upload's files (up to INGEST_MAX_FILE_MB
each, in the system's temporary directory, often memory) stayed there for good after the OOM killer
took the worker reading them. Such folders are named for their process (`folder_prefix`), and
`remove_abandoned` removes those of processes that are gone: the supervisor when a worker dies, and
every server process as it starts (after a restart, its predecessor's).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import math
import os
import re
import resource
import shutil
import signal
import sys
import tempfile
from pathlib import Path

log = logging.getLogger("fedresearch")

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
UPLOAD_FOLDERS = "fedresearch-upload-"  # an upload's files while they are read (web/documents.py)
METRICS_FOLDERS = "fedresearch-metrics-"  # the workers' metrics under a supervisor (serve/workers.py)


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        log.warning("prctl(%d, %d) failed: %s", option, value, os.strerror(ctypes.get_errno()))
        return False
    return True


def die_with(parent: int, cpu_s: float) -> None:
    """This process is killed when `parent` dies, and after `cpu_s` seconds of CPU time.

    The kernel's parent-death signal follows the thread that started this process, which in the
    server is a pool thread alive as long as its process; the CPU limit holds wherever that would
    not, and a process that lost `parent` before asking exits now. (A parent other than `parent`
    that is alive is a launcher between them: the signal then comes with the launcher's death.)"""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent and not alive(parent):
        os._exit(1)
    soft, hard = max(1, math.ceil(cpu_s)), resource.getrlimit(resource.RLIMIT_CPU)[1]
    limits = (soft, soft + 5) if hard == resource.RLIM_INFINITY else (min(soft, hard), hard)
    resource.setrlimit(resource.RLIMIT_CPU, limits)  # SIGXCPU, then SIGKILL 5 s later


def adopt_orphans() -> bool:
    """This process adopts the orphans of its descendants, as PID 1 does (`reap_orphans` reaps
    them); False where the system has no such thing."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def reap_orphans(own: set[int]) -> list[int]:
    """Reap every ended child that is not one of `own` (whose ends their owners read: a worker's
    `Popen`); the pids reaped. Stops at the first of `own` found ended, for its owner to reap."""
    reaped: list[int] = []
    while True:
        try:
            ended = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)  # looks, reaps nothing
        except ChildProcessError:
            return reaped
        if ended is None or ended.si_pid in own:
            return reaped
        try:
            os.waitpid(ended.si_pid, 0)
        except ChildProcessError:
            return reaped
        reaped.append(ended.si_pid)


def process_space() -> str:
    """This machine's boot and this process's PID namespace (Linux), '' elsewhere: a pid names a
    process only within one, and containers (or hosts) sharing a folder or a Redis each have theirs."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        space = os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
    return f"{boot}/{space}"


def _namespace() -> str:
    """`process_space` in 8 characters, for a folder's name."""
    return hashlib.sha256(process_space().encode()).hexdigest()[:8]


def folder_prefix(kind: str) -> str:
    """The prefix of a temporary folder of `kind` (`UPLOAD_FOLDERS`, ...) this process makes."""
    return f"{kind}{_namespace()}-{os.getpid()}-"


def alive(pid: int) -> bool:
    """Whether a process `pid` of this PID namespace exists (a zombie too, until reaped)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # gone, or no pid at all
        return False
    except OSError:  # there, another user's
        return True
    return True


def remove_abandoned(kind: str, directory: str | None = None) -> int:
    """Remove the temporary folders of `kind` whose processes (of this pid namespace) are gone;
    how many. Folders of live processes, of other namespaces and of other names are left."""
    mine = re.compile(re.escape(f"{kind}{_namespace()}-") + r"([1-9]\d{0,9})-")  # a pid: at most 2^22 on Linux
    removed = 0
    try:
        entries = list(os.scandir(directory or tempfile.gettempdir()))
    except OSError:
        return 0
    for entry in entries:
        owner = mine.match(entry.name)
        gone = owner is not None and int(owner.group(1)) != os.getpid() and not alive(int(owner.group(1)))
        with contextlib.suppress(OSError):  # removed meanwhile, or not ours to read
            if gone and entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed += 1
    return removed
