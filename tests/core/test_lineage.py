"""A process that dies leaves nothing behind: the PDF reader it started dies with it (and is bounded
in CPU time), the supervisor of `serve --workers N` adopts and reaps what a dead worker leaves (as a
container's PID 1 must), and the upload folders of killed processes are removed. Real processes,
read from /proc (Linux)."""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fedresearch.core.lineage import METRICS_FOLDERS, UPLOAD_FOLDERS, folder_prefix, remove_abandoned
from fedresearch.library.pdf import PDF_TIMEOUT_S
from tests.conftest import make_settings

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process ties are Linux's")


def status(pid: int) -> dict[str, str]:
    """/proc/PID/status as fields; empty once the process is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return {}
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def running(pid: int) -> bool:
    """Alive and not a zombie waiting to be reaped."""
    state = status(pid).get("State", "")
    return bool(state) and not state.startswith(("Z", "X"))


def eventually(condition: Callable[[], bool], seconds: float) -> bool:
    """Whether `condition` comes true within `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def parent_of(pid: int) -> str | None:
    return status(pid).get("PPid")


def children(parent: int) -> list[int]:
    return [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and status(int(pid)).get("PPid") == str(parent)]


def cpu_limit(pid: int) -> str:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max cpu time"):
            return " ".join(line.split()[3:5])
    return ""


# read_pdf_text in a process of its own, its reader's input a pipe the test holds open: the reader
# waits on it forever, as it would on a file that never parses
READS = """
import subprocess, sys
from fedresearch.library.pdf import read_pdf_text
run = subprocess.run
subprocess.run = lambda command, input, **options: run(command, stdin=int(sys.argv[1]), **options)
read_pdf_text(b"never sent")
"""


def test_a_pdf_reader_dies_with_the_process_that_started_it():
    held, kept = os.pipe()
    parent = subprocess.Popen([sys.executable, "-c", READS, str(held)], pass_fds=(held,))
    os.close(held)
    reader = 0
    try:
        assert eventually(lambda: bool(children(parent.pid)), 30), "the PDF reader never started"
        reader = children(parent.pid)[0]
        soft = math.ceil(PDF_TIMEOUT_S)
        assert eventually(lambda: cpu_limit(reader) == f"{soft} {soft + 5}", 30), (
            f"its CPU limit: {cpu_limit(reader)!r}"
        )
        parent.kill()
        parent.wait()
        assert eventually(lambda: not running(reader), 10), (
            f"the PDF reader ran on after its parent was killed: {status(reader).get('State')}"
        )
    finally:
        parent.kill()
        parent.wait()
        os.close(kept)
        if reader and running(reader):
            os.kill(reader, signal.SIGKILL)


WORKER = """
import subprocess, sys, tempfile, time
from fedresearch.core.lineage import UPLOAD_FOLDERS, folder_prefix
reading = tempfile.mkdtemp(prefix=folder_prefix(UPLOAD_FOLDERS))  # an upload being read
left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(4)"])  # a PDF being read
open(sys.argv[1], "w").write(f"{left.pid} {reading}")
time.sleep(60)
"""

SUPERVISOR = """
import logging, sys
from fedresearch.serve.workers import Supervisor
logging.basicConfig(level=logging.INFO, format="%(message)s")
sys.exit(Supervisor([sys.executable, "-c", sys.argv[1], sys.argv[2]], 1, grace_s=0).run())
"""


def test_the_supervisor_adopts_and_reaps_what_a_killed_worker_leaves_and_removes_its_uploads(tmp_path):
    told = tmp_path / "left.txt"
    supervisor = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, WORKER, str(told)], stderr=subprocess.PIPE, text=True
    )
    reading = Path()
    try:
        assert eventually(lambda: told.exists() and " " in told.read_text(), 30), "the worker never said what it left"
        pid, folder = told.read_text().split(" ", 1)
        orphan, reading = int(pid), Path(folder)
        worker = int(status(orphan)["PPid"])
        assert parent_of(worker) == str(supervisor.pid)
        assert reading.is_dir()
        told.unlink()
        os.kill(worker, signal.SIGKILL)
        # adopted by the supervisor, not by PID 1 or whatever else is nearest
        assert eventually(lambda: parent_of(orphan) == str(supervisor.pid), 3), f"adopted by {parent_of(orphan)}"
        assert eventually(lambda: not reading.exists(), 5), "the killed worker's upload folder stayed"
        assert eventually(lambda: not status(orphan), 15), f"never reaped: {status(orphan)}"  # zombies are listed
    finally:
        supervisor.send_signal(signal.SIGTERM)
        _, log = supervisor.communicate(timeout=60)
        shutil.rmtree(reading, ignore_errors=True)
    assert f"reaped 1 orphaned process(es) of dead workers: pid [{orphan}]" in log, log
    assert "removed 1 upload folders left by killed workers" in log, log
    assert supervisor.returncode == 0


def gone_pid() -> int:
    """The pid of a process that has ended and been reaped."""
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout)


def test_only_the_folders_of_processes_that_are_gone_are_removed(tmp_path):
    namespace = folder_prefix(UPLOAD_FOLDERS).split("-")[2]
    gone = gone_pid()
    names = {
        "gone": f"{UPLOAD_FOLDERS}{namespace}-{gone}-x1",
        "this process's": f"{folder_prefix(UPLOAD_FOLDERS)}x2",
        "alive": f"{UPLOAD_FOLDERS}{namespace}-1-x3",  # PID 1 of this namespace
        "another namespace's": f"{UPLOAD_FOLDERS}00000000-{gone}-x4",
        "named before pids were": f"{UPLOAD_FOLDERS}k3j4h5x5",
        "of another kind": f"{METRICS_FOLDERS}{namespace}-{gone}-x6",
        "no pid": f"{UPLOAD_FOLDERS}{namespace}-{'9' * 30}-x7",  # os.kill would overflow on it
    }
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "0-paper.pdf").write_bytes(b"%PDF-")
    (tmp_path / f"{UPLOAD_FOLDERS}{namespace}-{gone}-file").write_text("a file, not a folder")

    assert remove_abandoned(UPLOAD_FOLDERS, str(tmp_path)) == 1

    left = {path.name for path in tmp_path.iterdir()}
    assert names["gone"] not in left
    assert {name for what, name in names.items() if what != "gone"} <= left


async def test_a_server_removes_the_uploads_its_killed_predecessor_left(tmp_path, start_server):
    namespace = folder_prefix(UPLOAD_FOLDERS).split("-")[2]
    left = Path(tempfile.mkdtemp(prefix=f"{UPLOAD_FOLDERS}{namespace}-{gone_pid()}-"))
    (left / "0-paper.pdf").write_bytes(b"%PDF-" + b"0" * 1000)
    try:
        await start_server(make_settings(tmp_path))
        assert not left.exists()
    finally:
        shutil.rmtree(left, ignore_errors=True)
