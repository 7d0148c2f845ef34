"""The threads a server process writes reports and saves files on, apart from asyncio's default pool.

Writing a report is Python holding the GIL: threads beyond a couple add no throughput, only
contention, and every one of them fights the event loop for the GIL. asyncio's default pool has
cores + 4 threads (20 on a 16-core machine), so with hundreds of tasks composing at once the loop
waited its turn behind a crowd of writers: on 16 cores, capping that work at 2 threads took one
worker's steady-load p99 from 217 to 20 ms and, with Redis, its CPU per task from 10.3 to 6.5 ms.
The default pool stays for what may block without using the CPU (DNS lookups by aiohttp's
threaded resolver, reading pages), so a slow name server never holds up a report; the library's
calls have threads of their own (Library.threads), so a slow or locked database never holds up
the name server's answers.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


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


async def run_on(pool: WorkPool | None, function: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`function` on `pool`'s threads, or on asyncio's default pool without one (tests, scripts)."""
    if pool is None:
        return await asyncio.to_thread(function, *args, **kwargs)
    return await pool.run(function, *args, **kwargs)
