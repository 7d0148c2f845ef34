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
(`serve_until_stopped`, process.py): aiohttp's own shutdown stops reading every connection before its
`on_shutdown` hooks run, so a drain there answered no ping, and a client's keepalive (the websockets
library's: a ping every 20 s, 20 s for its pong) or aiohttp's own heartbeat dropped the socket of a
task still finishing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Literal

from fedresearch.jobs.stopping import Stopping

log = logging.getLogger("fedresearch")


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
