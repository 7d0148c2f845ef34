"""How a server process stops, as its tasks see it: from the first signal on it takes no new task,
and the running ones may go on to their reports until a deadline, which a later signal may bring
forward but never push back (which signal gives how long: `fedresearch/serve/signals.py`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable

from fedresearch.core.settings import Settings

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


def stop_limits(settings: Settings) -> tuple[float, float]:
    """How long a stopping process's tasks may run on, and a retiring worker's."""
    return settings.shutdown_grace_s, retire_s(settings.shutdown_grace_s, settings.task_timeout_s)
