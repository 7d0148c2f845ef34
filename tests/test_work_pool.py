"""The report-writing threads: few of them, apart from asyncio's default pool, with the caller's context."""

import asyncio
import contextvars
import threading
import time

from fedresearch.core.work import WorkPool, run_on

REQUEST = contextvars.ContextVar("request", default="none")


def _where(pause: float) -> tuple[str, str]:
    time.sleep(pause)  # holds its thread, so parallel calls need distinct threads
    return threading.current_thread().name, REQUEST.get()


async def test_work_runs_on_its_own_few_threads_with_the_callers_context() -> None:
    pool = WorkPool(2)
    try:
        REQUEST.set("task 7")
        done = await asyncio.gather(*(pool.run(_where, 0.02) for _ in range(8)))
        names = {name for name, _ in done}
        assert len(names) <= 2 and all(name.startswith("fedresearch-work") for name in names)
        assert {seen for _, seen in done} == {"task 7"}
        default_name, _ = await run_on(None, _where, 0)  # no pool: asyncio's default one
        assert not default_name.startswith("fedresearch-work")
    finally:
        pool.close()
