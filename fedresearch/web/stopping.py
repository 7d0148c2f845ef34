"""How a server process stops: from the first signal on it takes no new task, and the running ones
may go on to their reports until a deadline, which a later signal may bring forward but never push
back.

- SIGTERM (a deploy, a restart) and SIGINT: `SHUTDOWN_GRACE_S`, which an orchestrator's own grace
  (Kubernetes' 30 s) must hold.
- SIGHUP to a worker, sent by its supervisor once a successor listens (a reload): the worker retires
  and every running task may reach its end (`TASK_TIMEOUT_S`, then its last frames), since no one
  waits on the old process; a SIGTERM meanwhile (the whole service stopping) brings the deadline to
  `SHUTDOWN_GRACE_S` from then. SIGHUP to one process alone stops it as SIGTERM does.
- SIGTERM again changes nothing: systemd's default `KillMode=control-group` and `pkill` send it to
  the supervisor and every worker at once, and the supervisor sends its own, so each worker gets two;
  the second, read as aiohttp reads it, ended the process mid-drain, every task cut without a word to
  its client. SIGINT again (a second Ctrl-C) stops the running tasks at once, their clients told.

The running tasks are waited for with the listeners closed but every connection still read
(`app.serve_until_stopped`): aiohttp's own shutdown stops reading every connection before its
`on_shutdown` hooks run, so a drain there answered no ping, and a client's keepalive (the websockets
library's: a ping every 20 s, 20 s for its pong) or aiohttp's own heartbeat dropped the socket of a
task still finishing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable
from typing import Literal

log = logging.getLogger("fedresearch")

# after TASK_TIMEOUT_S a task still sends its error, its `path` and its job's end
_LAST_FRAMES_S = 5.0


def retire_s(grace_s: float, task_timeout_s: float) -> float:
    """How long a retiring worker's tasks may run on: long enough for any of them to end."""
    return max(grace_s, task_timeout_s + _LAST_FRAMES_S)


class Stopping:
    """A process's stop: whether it has begun, and until when its running tasks may go on."""

    def __init__(self, grace_s: float, retire_s: float) -> None:
        self.grace_s = grace_s
        self.retire_s = retire_s
        self.retiring = False
        self.deadline: float | None = None  # time.monotonic(): the running tasks are cut then
        self.waiting = False  # the running tasks are waited for (or were)
        self.asked = asyncio.Event()  # set by the first signal
        self._moved = asyncio.Event()

    @property
    def begun(self) -> bool:
        return self.asked.is_set()

    def begin(self, retiring: bool = False) -> None:
        if not self.begun:
            self.retiring = retiring
            self.asked.set()

    def start_clock(self) -> float:
        """The running tasks are waited for from now: the grace they get."""
        self.begin()
        self.waiting = True
        grace = self.retire_s if self.retiring else self.grace_s
        end = time.monotonic() + grace
        self.deadline = end if self.deadline is None else min(self.deadline, end)  # hurried already
        return grace

    def hurry(self, within_s: float) -> None:
        """The running tasks may go on for `within_s` more at most."""
        if self.deadline is None or time.monotonic() + within_s < self.deadline:
            self.deadline = time.monotonic() + within_s
            self._moved.set()

    async def wait(self, work: Awaitable[object]) -> None:
        """Wait for `work` until the deadline, as it moves; cancel it then."""
        finishing = asyncio.ensure_future(work)
        while not finishing.done():
            remaining = (self.deadline or time.monotonic()) - time.monotonic()
            if remaining <= 0:
                break
            self._moved.clear()
            moved = asyncio.ensure_future(self._moved.wait())
            await asyncio.wait({finishing, moved}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            moved.cancel()
        if not finishing.done():
            finishing.cancel()
            await asyncio.gather(finishing, return_exceptions=True)


# Windows has no SIGHUP, and its loop takes no signal handlers: Ctrl-C ends the process there
_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name))


def handle_signals(stopping: Stopping, hangup: Literal["stop", "retire"]) -> None:
    """SIGTERM, SIGINT and SIGHUP begin `stopping` and move its deadline, on the running loop, in
    place of aiohttp's handlers (which end the process at every SIGTERM and SIGINT, the second one
    mid-drain). `hangup`: what SIGHUP does."""

    def on_signal(number: int) -> None:
        name = signal.Signals(number).name
        if not stopping.begun:
            if number == signal.SIGHUP and hangup == "stop":
                log.warning("SIGHUP received: one process cannot replace itself (serve --workers 2 can): stopping")
            stopping.begin(retiring=number == signal.SIGHUP and hangup == "retire")
        elif number == signal.SIGINT:
            log.warning("SIGINT again: stopping the running tasks now")
            stopping.hurry(0.0)
        elif number == signal.SIGTERM and stopping.retiring:
            log.info("SIGTERM while retiring: the running tasks may finish for %g s at most", stopping.grace_s)
            stopping.hurry(stopping.grace_s)
        else:
            log.info("%s again: already stopping", name)

    loop = asyncio.get_running_loop()
    for number in _SIGNALS:
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(number, on_signal, number)


def ignore_signals() -> None:
    """Once stopped: the loop closing would put back the default actions, and a SIGTERM arriving
    while the interpreter exits (the supervisor's, sent as the last task ended) killed the process
    that was exiting cleanly, logged as killed."""
    loop = asyncio.get_running_loop()
    for number in _SIGNALS:
        with contextlib.suppress(NotImplementedError):
            loop.remove_signal_handler(number)
            signal.signal(number, signal.SIG_IGN)
