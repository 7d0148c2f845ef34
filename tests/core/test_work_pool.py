"""The report-writing threads: few of them, apart from asyncio's default pool, with the caller's context."""

import asyncio
import contextvars
import threading
import time

import pytest

from fedresearch.core.work import QuickWrites, WorkPool, run_on, work_threads
from fedresearch.web.keys import RUNTIME
from tests.conftest import make_settings

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


def _write(pause: float = 0.0) -> str:
    time.sleep(pause)  # a disk that holds the write this long
    return threading.current_thread().name


async def test_quick_writes_stay_on_the_loop_and_slow_ones_go_to_threads_a_while(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pool = WorkPool(1)
    try:
        here = threading.current_thread().name
        writes = QuickWrites(pool, slow_s=0.005, in_a_row=3, stall_s=0.2, threads_for_s=0.3)
        assert [await writes.run(_write) for _ in range(20)] == [here] * 20
        # one slow write, then a quick one: a preempted process looks the same, so nothing moves
        assert [await writes.run(_write, pause) for pause in (0.01, 0, 0.01, 0.01, 0)] == [here] * 5
        # three in a row: the next writes wait on a thread, and come back after threads_for_s
        assert [await writes.run(_write, 0.01) for _ in range(3)] == [here] * 3
        assert "file writes are slow" in caplog.text
        moved = [await writes.run(_write) for _ in range(3)]
        assert all(name.startswith("fedresearch-work") for name in moved)
        await asyncio.sleep(0.35)
        assert await writes.run(_write) == here
        # one write that stalls the loop past stall_s moves them at once
        assert await writes.run(_write, 0.25) == here
        assert (await writes.run(_write)).startswith("fedresearch-work")
    finally:
        pool.close()


async def test_a_failed_write_on_the_loop_raises_to_its_caller() -> None:
    def full() -> None:
        raise OSError(28, "No space left on device")

    writes = QuickWrites(None)
    with pytest.raises(OSError, match="No space left"):
        await writes.run(full)
    assert writes.on_loop


async def test_one_work_thread_without_the_embedding_model_two_with_it_or_as_set(tmp_path, start_server) -> None:
    # two threads of GIL-bound Python only hand the GIL back and forth; the model's inference lets go
    # of it, and there a second thread writes meanwhile
    assert (work_threads(None, with_model=False), work_threads(None, with_model=True)) == (1, 2)
    assert work_threads(3, with_model=False) == 3
    server = await start_server(make_settings(tmp_path, embeddings=False))
    assert server.app[RUNTIME].deps.work.threads == 1
    server = await start_server(make_settings(tmp_path / "set", embeddings=False, work_threads=3))
    assert server.app[RUNTIME].deps.work.threads == 3
