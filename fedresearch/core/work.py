"""The threads a server process writes reports and saves files on, apart from asyncio's default pool.

Writing a report is Python holding the GIL: threads beyond a couple add no throughput, only
contention, and every one of them fights the event loop for the GIL. asyncio's default pool has
cores + 4 threads (20 on a 16-core machine), so with hundreds of tasks composing at once the loop
waited its turn behind a crowd of writers: on 16 cores, capping that work at 2 threads took one
worker's steady-load p99 from 217 to 20 ms and, with Redis, its CPU per task from 10.3 to 6.5 ms.
The default pool stays for what may block without using the CPU (DNS lookups by aiohttp's
threaded resolver, a PDF page read by a child process), so a slow name server never holds up a
report; the library's calls have threads of their own (Library.threads), so a slow or locked
database never holds up the name server's answers.

One thread, unless the embedding model runs: reading pages' text (trafilatura, lxml) and writing
from them on two threads, the two handed the GIL back and forth (lxml lets go of it at every XPath
query), and a seventh of the process's CPU went to futex wake-ups and context switches; with one,
on 2 cores, a task with pages took 16% less CPU and the process ran 14% more of them. The model's
inference runs without the GIL, and there a second thread writes meanwhile (1.8 against 1.5 tasks
a second with one).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")
log = logging.getLogger("fedresearch")


class WorkPool:
    """`await pool.run(f, *args)`: `f` on one of `threads` threads, with the caller's context (as
    asyncio.to_thread does); None as a pool means asyncio's default one."""

    def __init__(self, threads: int, name: str = "fedresearch-work") -> None:
        self.threads = threads
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix=name)

    async def run(self, function: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        call = functools.partial(contextvars.copy_context().run, function, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def work_threads(setting: int | None, with_model: bool) -> int:
    """WORK_THREADS if set, else 1, or 2 where the embedding model runs (the module's docstring)."""
    if setting is not None:
        return setting
    return 2 if with_model else 1


async def run_on(pool: WorkPool | None, function: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`function` on `pool`'s threads, or on asyncio's default pool without one (tests, scripts)."""
    if pool is None:
        return await asyncio.to_thread(function, *args, **kwargs)
    return await pool.run(function, *args, **kwargs)


class QuickWrites:
    """Where a small file write (a job's few kilobytes appended) runs: on the event loop itself while
    the disk is quick, on `pool`'s threads for `threads_for_s` once it is not, then on the loop again.

    A page cache takes such a write in tens of microseconds (19 µs at the median, 82 at p99 on this
    project's VMs); handing it to a thread and back costs more CPU than the write, and while the
    thread wants the GIL each system call of the loop hands it over (a futex wake and a context
    switch each). A network file system or a saturated disk may hold every write for milliseconds,
    and the loop with it: `in_a_row` writes over `slow_s`, or one over `stall_s`, send the next ones
    to threads. One slow write alone does not: the process preempted mid-write looks the same.
    """

    def __init__(
        self,
        pool: WorkPool | None,
        slow_s: float = 0.002,
        in_a_row: int = 3,
        stall_s: float = 0.05,
        threads_for_s: float = 30.0,
    ) -> None:
        self.pool = pool
        self.slow_s, self.in_a_row, self.stall_s = slow_s, in_a_row, stall_s
        self.threads_for_s = threads_for_s
        self._slow = 0  # slow writes in a row
        self._threads_until = 0.0

    @property
    def on_loop(self) -> bool:
        return time.monotonic() >= self._threads_until

    async def run(self, function: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        if not self.on_loop:
            return await run_on(self.pool, function, *args, **kwargs)
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            self._took(time.perf_counter() - started)

    def _took(self, seconds: float) -> None:
        self._slow = self._slow + 1 if seconds > self.slow_s else 0
        if self._slow >= self.in_a_row or seconds > self.stall_s:
            self._slow = 0
            self._threads_until = time.monotonic() + self.threads_for_s
            log.warning(
                "file writes are slow (the last took %.1f ms on the event loop): the next %.0f s of them go to threads",
                seconds * 1000,
                self.threads_for_s,
            )
