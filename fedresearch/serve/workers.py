"""`fedresearch serve --workers N`: a supervisor and N worker processes sharing one port.

The supervisor binds the port once (port 0 picks a free one) and starts each worker as a fresh
interpreter (`fedresearch serve --as-worker`, nothing inherited but the socket). Two ways to share
the port, measured in bench/scaling.py: `reuseport` (the default) gives each worker its own
listening socket on the port (SO_REUSEPORT) and the kernel spreads connections across them;
`shared` hands every worker the one listening socket bound here, and the workers race to accept.

A worker that dies (a crash, or SIGKILL) is replaced at once, or after a backoff that doubles
while replacements keep dying young. SIGTERM or SIGINT to the supervisor stops the workers
gracefully (each lets its running tasks finish, for SHUTDOWN_GRACE_S at most, and tells its clients,
as one server does) and SIGKILLs any still running after that and the time to close; a second
signal stops them at once. SIGHUP replaces the workers one at a time with fresh processes (new code,
`.env` read again), each old one retired (SIGHUP: it takes nothing new and lets every running task
reach its end, TASK_TIMEOUT_S at most, serve/signals.py) once its successor listens, which it tells
the supervisor through a pipe. Workers watch the supervisor and stop if it dies. The supervisor
adopts and reaps its workers' orphans (core/lineage.py), as a container's PID 1 must.
Each of these events is logged. Workers share state only through Redis (FEDRESEARCH_REDIS_URL).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Literal

from prometheus_client.multiprocess import mark_process_dead

from fedresearch.core.lineage import (
    METRICS_FOLDERS,
    UPLOAD_FOLDERS,
    adopt_orphans,
    folder_prefix,
    reap_orphans,
    remove_abandoned,
)
from fedresearch.core.metrics import MULTIPROCESS_DIR, count_worker_death, fold_dead_worker

log = logging.getLogger("fedresearch")

Balance = Literal["reuseport", "shared"]
BALANCES: tuple[Balance, ...] = ("reuseport", "shared")
_YOUNG_S = 10.0  # a worker that dies younger than this counts toward the backoff
_BACKOFF_S = (0.5, 30.0)  # first and longest wait before replacing a worker that died young
_CLOSING_S = 15.0  # after a worker's tasks: aiohttp's shutdown_timeout (10 s), closing the library
_TICK_S = 0.1
_READY_S = 120.0  # how long a worker's successor (SIGHUP) may take to listen: its library opens first


def bind(host: str, port: int, balance: Balance) -> socket.socket:
    """The port, held by the supervisor: listening (`shared`) or only reserved (`reuseport`)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if balance == "reuseport":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    if balance == "shared":
        sock.listen(4096)
        sock.set_inheritable(True)
    return sock


@dataclass
class _Worker:
    number: int
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    young_deaths: int = 0
    restart_at: float | None = 0.0


@dataclass
class _Successor:
    """A fresh process started to take a worker's place (SIGHUP); the worker's own stops once it
    listens."""

    worker: _Worker
    process: subprocess.Popen[bytes]
    ready: int  # the read end of the pipe it writes a byte to once it listens
    started: float


@dataclass
class _Retiring:
    """A replaced worker's process, finishing its tasks."""

    number: int
    process: subprocess.Popen[bytes]
    since: float


@dataclass
class Supervisor:
    command: list[str]
    count: int
    pass_fds: tuple[int, ...] = ()
    grace_s: float = 25.0  # SHUTDOWN_GRACE_S: how long a stopping worker's tasks may run on
    retire_s: float = 65.0  # and a replaced one's: until any of them could end (serve/signals.py)
    # both as the environment and `.env` say at a reload (None: invalid there), which the workers
    # started then read: a raised TASK_TIMEOUT_S must not have their tasks killed at the next one
    read_limits: Callable[[], tuple[float, float] | None] | None = None
    # where the workers keep their metrics, summed by whichever one a scrape reaches (core/metrics.py)
    metrics_dir: str | None = None
    workers: list[_Worker] = field(default_factory=list)
    stopping: int = 0  # signals received
    reload_asked: bool = False
    to_replace: list[_Worker] = field(default_factory=list)
    successor: _Successor | None = None
    retiring: list[_Retiring] = field(default_factory=list)

    def run(self) -> int:
        """Keep `count` workers running until a signal says stop; then stop them. The exit status."""
        self.workers = [_Worker(number) for number in range(1, self.count + 1)]
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGHUP, self._on_reload)
        adopt_orphans()
        while not self.stopping:
            now = time.monotonic()
            for worker in self.workers:
                if self.successor is None or worker is not self.successor.worker:
                    self._tend(worker, now)
            self._replace_next(now)
            self._reap_retiring(now)
            self._reap_orphans()
            time.sleep(_TICK_S)
        return self._stop_all()

    @property
    def stop_allowed_s(self) -> float:
        """How long a stopping worker may take before it is killed: its tasks' grace, then closing."""
        return self.grace_s + _CLOSING_S

    @property
    def retire_allowed_s(self) -> float:
        """The same for a worker replaced in a reload (SIGHUP), whose tasks may all run to their end."""
        return self.retire_s + _CLOSING_S

    def _on_signal(self, number: int, _: FrameType | None) -> None:
        self.stopping += 1
        name = signal.Signals(number).name
        if self.stopping == 1:
            log.info("supervisor: %s received, stopping %d workers gracefully", name, self.count)
        else:
            log.warning("supervisor: %s received again, killing the workers now", name)
            self._signal_all(signal.SIGKILL)

    def _on_reload(self, number: int, _: FrameType | None) -> None:
        self.reload_asked = True

    def _tend(self, worker: _Worker, now: float) -> None:
        process = worker.process
        if process is not None and process.poll() is not None:
            lived = now - worker.started
            worker.young_deaths = worker.young_deaths + 1 if lived < _YOUNG_S else 0
            delay = min(_BACKOFF_S[1], _BACKOFF_S[0] * 2 ** (worker.young_deaths - 1)) if worker.young_deaths else 0.0
            log.warning(
                "supervisor: worker %d (pid %d) %s after %.1f s; replacing it in %.1f s",
                worker.number,
                process.pid,
                _how_it_ended(process.returncode),
                lived,
                delay,
            )
            self._reaped(process, death=_death(process.returncode))
            worker.process, worker.restart_at = None, now + delay
        if worker.process is None and worker.restart_at is not None and now >= worker.restart_at:
            worker.process = subprocess.Popen(self.command, pass_fds=self.pass_fds, process_group=0, env=self._env())
            worker.started, worker.restart_at = now, None
            log.info("supervisor: worker %d started (pid %d)", worker.number, worker.process.pid)

    def _replace_next(self, now: float) -> None:
        """SIGHUP: one worker at a time, a fresh process (the code and `.env` as they are now) takes
        its place, and the old one stops gracefully only once the new one listens, so the port
        always has its workers and no running task is cut; a successor that dies or does not listen
        in time stops the reload, the running workers staying."""
        if self.reload_asked:
            self.reload_asked = False
            limits = self.read_limits() if self.read_limits is not None else None
            if limits is not None:  # the longest any worker may have been told: old ones still run
                self.grace_s, self.retire_s = max(self.grace_s, limits[0]), max(self.retire_s, limits[1])
            self.to_replace = list(self.workers)  # a second SIGHUP starts over: the code changed again
            log.info("supervisor: SIGHUP received, replacing the %d workers one at a time", self.count)
        successor = self.successor
        if successor is None:
            if self.to_replace:
                self._start_successor(self.to_replace.pop(0), now)
            return
        worker, process = successor.worker, successor.process
        try:
            ready = os.read(successor.ready, 1)
        except BlockingIOError:
            ready = None
        old = worker.process
        if ready:
            if old is not None and old.poll() is None:
                old.send_signal(signal.SIGHUP)  # retire: take nothing new, let every task end
                self.retiring.append(_Retiring(worker.number, old, now))
                done = f"pid {old.pid} retires once its tasks end"
            else:  # it died meanwhile: its successor is its replacement
                if old is not None:
                    self._reaped(old)
                done = f"pid {old.pid} {_how_it_ended(old.returncode)}" if old is not None else "it had none running"
            log.info("supervisor: worker %d replaced: pid %d listens, %s", worker.number, process.pid, done)
            worker.process, worker.started, worker.young_deaths, worker.restart_at = process, now, 0, None
        elif ready == b"" or process.poll() is not None or now - successor.started > _READY_S:
            alive = process.poll() is None
            if alive:
                process.kill()
            process.wait()
            self._reaped(process)
            waited = now - successor.started
            why = (
                f"did not listen in {waited:.0f} s"
                if alive
                else f"{_how_it_ended(process.returncode)} before it listened"
            )
            log.error(
                "supervisor: reload stopped: worker %d's successor (pid %d) %s; the running workers stay",
                worker.number,
                process.pid,
                why,
            )
            self.to_replace.clear()
        else:
            return
        os.close(successor.ready)
        self.successor = None

    def _start_successor(self, worker: _Worker, now: float) -> None:
        ready, told = os.pipe()
        os.set_blocking(ready, False)
        try:
            command = [*self.command, "--ready-fd", str(told)]
            process = subprocess.Popen(command, pass_fds=(*self.pass_fds, told), process_group=0, env=self._env())
        except BaseException:
            os.close(ready)
            raise
        finally:
            os.close(told)
        self.successor = _Successor(worker, process, ready, now)
        log.info("supervisor: worker %d's successor started (pid %d)", worker.number, process.pid)

    def _reap_retiring(self, now: float) -> None:
        allowed = self.retire_allowed_s
        for old in list(self.retiring):
            if old.process.poll() is None and now - old.since > allowed:
                log.warning(
                    "supervisor: replaced worker %d (pid %d) still running after %g s: killed",
                    old.number,
                    old.process.pid,
                    allowed,
                )
                old.process.kill()
                old.process.wait()
            if old.process.poll() is not None:
                self._reaped(old.process)
                log.info(
                    "supervisor: replaced worker %d (pid %d) %s",
                    old.number,
                    old.process.pid,
                    _how_it_ended(old.process.returncode),
                )
                self.retiring.remove(old)

    def _reap_orphans(self) -> None:
        """Processes a dead worker left behind (a PDF reader) come to the supervisor when they end."""
        reaped = reap_orphans({process.pid for _, process in self._processes()})
        if reaped:
            log.info("supervisor: reaped %d orphaned process(es) of dead workers: pid %s", len(reaped), reaped)

    def _env(self) -> dict[str, str] | None:
        if self.metrics_dir is None:
            return None
        return {**os.environ, MULTIPROCESS_DIR: self.metrics_dir}

    def _reaped(self, process: subprocess.Popen[bytes], death: str | None = None) -> None:
        """A worker's process ended (`death`: how, when it died rather than stopped as asked): its
        gauges leave the sums, its counts stay in them (in the folder's files of the dead), and the
        folders of uploads it was reading go, if it was killed with them."""
        if self.metrics_dir is not None:
            try:
                if death is not None:
                    count_worker_death(self.metrics_dir, death)
                mark_process_dead(process.pid, self.metrics_dir)
                fold_dead_worker(self.metrics_dir, process.pid)
            except Exception as error:  # the metrics folder failing (a full disk) is never the supervisor's end
                log.warning("supervisor: the metrics of worker pid %d were not folded: %r", process.pid, error)
        if removed := remove_abandoned(UPLOAD_FOLDERS):
            log.info("supervisor: removed %d upload folders left by killed workers", removed)

    def _processes(self) -> list[tuple[int, subprocess.Popen[bytes]]]:
        """Every process started and not yet reaped: the workers, a successor, replaced ones."""
        running = [(worker.number, worker.process) for worker in self.workers if worker.process is not None]
        if self.successor is not None:
            running.append((self.successor.worker.number, self.successor.process))
        return running + [(old.number, old.process) for old in self.retiring]

    def _signal_all(self, sig: signal.Signals) -> None:
        for _, process in self._processes():
            if process.poll() is None:
                process.send_signal(sig)

    def _stop_all(self) -> int:
        self._signal_all(signal.SIGTERM)
        allowed = self.stop_allowed_s
        deadline = time.monotonic() + allowed
        for number, process in self._processes():
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning(
                    "supervisor: worker %d (pid %d) still running after %g s: killed", number, process.pid, allowed
                )
                process.kill()
                process.wait()
            log.info("supervisor: worker %d (pid %d) %s", number, process.pid, _how_it_ended(process.returncode))
        if self.successor is not None:
            os.close(self.successor.ready)
        log.info("supervisor: stopped")
        return 0


def _death(status: int | None) -> str:
    """How a worker ended, as a metric's label: its signal's name, or its exit status."""
    return _signal_name(-status) if status is not None and status < 0 else f"status {status}"


def _how_it_ended(status: int | None) -> str:
    if status is None:
        return "is running"
    if status < 0:
        return f"was killed by {_signal_name(-status)}"
    return f"exited with status {status}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal (SIGRTMIN+n) has no name of its own
        return f"signal {number}"


def worker_command(host: str, port: int, balance: Balance, listen_fd: int | None) -> list[str]:
    command = [sys.executable, "-m", "fedresearch", "serve", "--as-worker", str(os.getpid())]
    command += ["--host", host, "--port", str(port)]
    if balance == "shared" and listen_fd is not None:
        command += ["--listen-fd", str(listen_fd)]
    return command


def supervise(
    host: str,
    port: int,
    count: int,
    balance: Balance,
    limits: tuple[float, float],
    read_limits: Callable[[], tuple[float, float] | None] | None = None,
) -> int:
    """Bind the port, run `count` workers on it until told to stop; the exit status. `limits`: how long
    a stopping and a retiring worker's tasks may run on, as the workers started now are told;
    `read_limits` reads them again at a reload."""
    listener = bind(host, port, balance)
    port = listener.getsockname()[1]
    log.info("supervisor (pid %d): %d workers on http://%s:%d, balanced by %s", os.getpid(), count, host, port, balance)
    fds = (listener.fileno(),) if balance == "shared" else ()
    remove_abandoned(METRICS_FOLDERS)  # a supervisor killed before, which could not remove its own
    metrics_dir = tempfile.mkdtemp(prefix=folder_prefix(METRICS_FOLDERS))
    try:
        command = worker_command(host, port, balance, listener.fileno())
        return Supervisor(command, count, fds, *limits, read_limits=read_limits, metrics_dir=metrics_dir).run()
    finally:
        listener.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
