"""The job store: frames read by index (none lost, none repeated), waiting, restart, retention."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fedresearch.core.events import ProgressStep
from fedresearch.core.lineage import process_space
from fedresearch.core.work import WorkPool
from fedresearch.jobs import local_store as jobs_module
from fedresearch.jobs.frames import LogsFrame, PathFrame, ReportFrame
from fedresearch.jobs.local_store import LocalJobStore
from fedresearch.jobs.retention import RetentionPace, enforce_retention
from fedresearch.jobs.store import Job, JobStatus, follow
from fedresearch.report.store import export, record_bytes, save_report
from tests.jobs.numbered import job_id, number_of, numbered


async def test_a_follower_that_joins_late_gets_every_frame_once_in_order(tmp_path: Path) -> None:
    store = LocalJobStore(tmp_path)
    await store.create(Job(job_id(1), "alice", "q", status=JobStatus.running))

    async def produce() -> None:
        for n in range(50):
            await store.append(job_id(1), numbered(n))
            if n % 7 == 0:
                await asyncio.sleep(0)
        await store.finish(job_id(1), JobStatus.completed)

    for n in range(5):
        await store.append(job_id(1), numbered(-5 + n))
    producer = asyncio.create_task(produce())
    early = [number_of(frame) async for frame in follow(store, job_id(1))]
    late = [number_of(frame) async for frame in follow(store, job_id(1), start=3)]
    await producer
    assert early == list(range(-5, 50))
    assert late == list(range(-2, 50))
    job = await store.get(job_id(1))
    assert job is not None and job.status is JobStatus.completed and job.progress == 1.0


async def test_finished_jobs_survive_a_restart_and_running_ones_are_marked_failed(tmp_path: Path) -> None:
    store = LocalJobStore(tmp_path)
    await store.create(Job(job_id(1), "alice", "done", status=JobStatus.running))
    await store.append(job_id(1), numbered(1))
    await store.finish(job_id(1), JobStatus.completed, files={"md": "reports/x.md"})
    await store.create(Job(job_id(2), "alice", "cut short", status=JobStatus.running))
    await store.append(job_id(2), numbered(2))

    again = LocalJobStore(tmp_path)
    assert await again.load() == 2
    done, cut = await again.get(job_id(1)), await again.get(job_id(2))
    assert done is not None and done.status is JobStatus.completed and done.files == {"md": "reports/x.md"}
    assert await again.frames(job_id(1)) == [numbered(1)]
    assert cut is not None and cut.status is JobStatus.failed and cut.error
    assert [job.research_id for job in await again.list("alice")] == [job_id(2), job_id(1)]
    assert await again.list("bob") == []
    assert await again.wait("nope", 0) is False


async def test_a_job_running_in_a_live_sibling_worker_is_left_to_it_at_load(tmp_path: Path) -> None:
    """`serve --workers N` without Redis: the workers share the jobs folder, and a worker replaced
    (a crash, a reload) marked its siblings' running jobs failed, in their files, while they ran on.
    Now a running job whose worker is alive on this machine is left to it; one whose worker is gone,
    or ran elsewhere, is failed as before."""
    sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    space = process_space()
    try:
        first = LocalJobStore(tmp_path)
        await first.create(
            Job(job_id(1), "alice", "runs on", status=JobStatus.running, runner=f"{'a' * 32}@{space}:{sibling.pid}")
        )
        await first.create(
            Job(
                job_id(2),
                "alice",
                "elsewhere",
                status=JobStatus.running,
                runner=f"{'b' * 32}@other/pid:[1]:{sibling.pid}",
            )
        )
        await first.create(
            Job(job_id(3), "alice", "mine, earlier", status=JobStatus.running)
        )  # this pid: an earlier process's
        assert (await first.get(job_id(3))).runner == first.runner  # type: ignore[union-attr]

        replaced = LocalJobStore(tmp_path)
        assert await replaced.load() == 3
        assert await replaced.get(job_id(1)) is None  # its worker lists and ends it
        assert (await replaced.get(job_id(2))).status is JobStatus.failed  # type: ignore[union-attr]
        assert (await replaced.get(job_id(3))).status is JobStatus.failed  # type: ignore[union-attr]
        states = [
            json.loads(line)["job"]["status"]
            for line in Path(f"{tmp_path}/{job_id(1)}.job.jsonl").read_text().splitlines()
        ]
        assert states == ["running"]  # its file untouched (before: "failed" appended)
    finally:
        sibling.kill()
        sibling.wait()
    later = LocalJobStore(tmp_path)
    await later.load()
    assert (await later.get(job_id(1))).status is JobStatus.failed  # type: ignore[union-attr]  # its worker is gone


async def test_retention_deletes_old_and_surplus_jobs_with_their_reports(tmp_path: Path) -> None:
    store, reports = LocalJobStore(tmp_path / "jobs"), tmp_path / "reports"
    now = time.time()
    ages = {1: 40, 2: 3, 3: 2, 4: 1}  # days
    for n, days in ages.items():
        await store.create(Job(job_id(n), "alice", f"q{n}", created_at=now - days * 86400, status=JobStatus.running))
        await store.finish(job_id(n), JobStatus.completed)
        save_report(reports, job_id(n), record_bytes("# q\n", {"owner": "alice"}))
    await store.create(Job(job_id(9), "alice", "running", created_at=now - 90 * 86400, status=JobStatus.running))
    await store.create(Job(job_id(8), "bob", "bob's", status=JobStatus.running))
    await store.finish(job_id(8), JobStatus.completed)

    assert export(reports, job_id(1), "md") == reports / f"{job_id(1)}.md"  # rendered when first fetched

    deleted = await enforce_retention(store, reports, retention_days=30, max_per_user=2)
    assert sorted(deleted) == [job_id(1), job_id(2)]
    left = {job.research_id for job in await store.list(None, everyone=True)}
    assert left == {job_id(3), job_id(4), job_id(8), job_id(9)}  # a running job is never deleted
    assert not (reports / f"{job_id(1)}.md").exists() and not (reports / f"{job_id(1)}.json").exists()
    assert not (reports / f"{job_id(2)}.json").exists()
    assert (reports / f"{job_id(3)}.json").exists()
    assert not (tmp_path / "jobs" / f"{job_id(1)}.job.jsonl").exists()
    assert not (tmp_path / "jobs" / f"{job_id(2)}.job.jsonl").exists()  # all in one trip to a thread
    again = LocalJobStore(tmp_path / "jobs")
    assert await again.load() == 4 and {job.research_id for job in await again.list(None, everyone=True)} == left


async def test_a_deletion_killed_midway_never_leaves_a_deleted_reports_file_behind(tmp_path: Path) -> None:
    """Killed once the jobs are gone: their files went first. Before, the jobs went first and a
    kill left a deleted report's file, which its owner could read for ever."""

    class KilledAfterDeleting(LocalJobStore):
        async def delete_many(self, research_ids: Any) -> list[str]:
            await super().delete_many(research_ids)
            raise KeyboardInterrupt  # the process dies here

    store, reports = KilledAfterDeleting(tmp_path / "jobs"), tmp_path / "reports"
    await store.create(Job(job_id(1), "alice", "q", created_at=time.time() - 40 * 86400, status=JobStatus.running))
    await store.finish(job_id(1), JobStatus.completed, record=record_bytes("# q\n", {"owner": "alice"}))
    save_report(reports, job_id(1), (await store.records([job_id(1)]))[job_id(1)])  # fetched when first asked for
    assert export(reports, job_id(1), "md") is not None
    with pytest.raises(KeyboardInterrupt):
        await enforce_retention(store, reports, retention_days=30, max_per_user=0)
    assert not list(reports.iterdir())
    assert not (tmp_path / "jobs" / f"{job_id(1)}.job.jsonl").exists()


async def test_saving_client_fields_keeps_the_frames(tmp_path: Path) -> None:
    store = LocalJobStore(tmp_path)
    await store.create(Job(job_id(1), None, "q", status=JobStatus.running))
    await store.append(job_id(1), numbered(1))
    job = await store.get(job_id(1))
    assert job is not None
    await store.save(replace(job, progress=0.5, client={"chatMessages": []}))
    assert await store.frames(job_id(1)) == [numbered(1)]
    saved = await store.get(job_id(1))
    assert saved is not None and saved.progress == 0.5 and saved.client == {"chatMessages": []}


async def test_a_job_cut_short_is_saved_as_failed_and_a_deleted_one_stays_deleted(tmp_path: Path) -> None:
    store = LocalJobStore(tmp_path)
    await store.create(Job(job_id(1), "alice", "cut short", status=JobStatus.running))
    await LocalJobStore(tmp_path).load()
    third = LocalJobStore(tmp_path)
    await third.load()
    job = await third.get(job_id(1))
    assert job is not None and job.status is JobStatus.failed  # written by the second load, read by the third
    await asyncio.gather(third.save(replace(job, client={"x": 1})), third.delete(job_id(1)))
    assert not (tmp_path / f"{job_id(1)}.job.jsonl").exists()


async def test_retention_runs_when_the_count_limit_may_be_passed_and_keeps_a_tenth_less(tmp_path: Path) -> None:
    store, reports = LocalJobStore(tmp_path / "jobs"), tmp_path / "reports"
    pace = RetentionPace(max_per_user=20)
    passes = 0
    for n in range(1, 61):
        await store.create(Job(job_id(n), "alice", f"q{n}", created_at=time.time() + n, status=JobStatus.running))
        await store.finish(job_id(n), JobStatus.completed)
        if pace.due("alice"):
            passes += 1
            await enforce_retention(store, reports, 0, 20, owner="alice", keep=pace.keep, kept_out=pace.counts)
            pace.done("alice")
        assert len(await store.list("alice")) <= 20  # never more than the limit
    assert passes == 1 + (60 - 18) // 3  # the first job, then every third: 18 kept, a pass at 21
    assert {job.research_id for job in await store.list("alice")} >= {job_id(n) for n in range(58, 61)}


async def test_jobs_finishing_while_a_retention_pass_runs_start_no_second_pass(tmp_path: Path) -> None:
    store, reports = LocalJobStore(tmp_path / "jobs"), tmp_path / "reports"
    pace = RetentionPace(max_per_user=20)
    for n in range(1, 31):
        await store.create(Job(job_id(n), "alice", f"q{n}", created_at=time.time() + n, status=JobStatus.running))
        await store.finish(job_id(n), JobStatus.completed)
    assert pace.due("alice")  # never counted: a pass starts
    assert not any(pace.due("alice") for _ in range(50))  # 50 more finish while it runs: none starts
    await enforce_retention(store, reports, 0, 20, owner="alice", keep=pace.keep, kept_out=pace.counts)
    assert len(await store.list("alice")) == 18
    assert pace.due("bob")  # another owner is not held up by alice's pass
    pace.done("alice")
    pace.done("bob")
    assert pace.counts["alice"] == 18
    assert pace.due("alice") is False and pace.counts["alice"] == 19


async def test_a_finished_jobs_pass_reads_only_the_jobs_after_the_newest_kept(tmp_path: Path) -> None:
    store, reports = LocalJobStore(tmp_path / "jobs"), tmp_path / "reports"
    for n in range(1, 31):
        await store.create(Job(job_id(n), "alice", f"q{n}", created_at=time.time() + n, status=JobStatus.running))
        if n != 29:  # one of the newest still runs
            await store.finish(job_id(n), JobStatus.completed)
    await store.create(Job(job_id(99), "bob", "bob's", created_at=time.time(), status=JobStatus.running))
    await store.finish(job_id(99), JobStatus.completed)
    seen: list[tuple[str | None, int]] = []
    listing = store.list

    async def counted(owner: str | None, everyone: bool = False, skip: int = 0) -> list[Job]:
        seen.append((owner, skip))
        return await listing(owner, everyone, skip)

    store.list = counted  # type: ignore[method-assign]
    counts: dict[str | None, int] = {}
    deleted = await enforce_retention(store, reports, 30, 20, owner="alice", keep=18, kept_out=counts)
    assert seen == [("alice", 18)]  # not the whole list
    assert sorted(deleted) == [job_id(n) for n in range(1, 13)]  # the newest 18 kept, the running one among them
    assert [job.research_id for job in await listing("alice")] == [job_id(n) for n in range(30, 12, -1)]
    assert counts == {"alice": 18} and len(await listing("bob")) == 1
    assert await enforce_retention(store, reports, 30, 20, owner="alice", keep=18, kept_out=counts) == []


async def test_a_job_is_one_file_appended_to_and_read_back_after_a_restart(tmp_path: Path) -> None:
    store = LocalJobStore(tmp_path)
    await store.create(Job(job_id(1), "alice", "q", status=JobStatus.running))
    inode = (tmp_path / f"{job_id(1)}.job.jsonl").stat().st_ino
    # U+2028 and U+0085 end lines for str.splitlines: a finished job holding one could not be replayed
    frames = [LogsFrame(content=ProgressStep.fetching, output="a\u2028b\u0085c\nd"), ReportFrame(output="x")]
    for frame in frames:
        await store.append(job_id(1), frame)
    await store.finish(job_id(1), JobStatus.completed, files={"md": "reports/a.md"})
    assert [path.name for path in tmp_path.iterdir()] == [f"{job_id(1)}.job.jsonl"]
    assert (tmp_path / f"{job_id(1)}.job.jsonl").stat().st_ino == inode  # appended, never replaced
    again = LocalJobStore(tmp_path)
    assert await again.load() == 1
    job = await again.get(job_id(1))
    assert job is not None and job.status is JobStatus.completed and job.files == {"md": "reports/a.md"}
    assert await again.frames(job_id(1)) == frames
    assert await again.frames(job_id(1), start=1) == frames[1:]
    assert [frame.text for frame in await again.frames(job_id(1))] == [frame.text for frame in frames]


async def test_a_write_torn_by_a_crash_leaves_the_state_before_it(tmp_path: Path) -> None:
    store = LocalJobStore(tmp_path)
    await store.create(Job(job_id(1), "alice", "q", status=JobStatus.running))
    await store.append(job_id(1), ReportFrame(output="one"))
    await store.finish(job_id(1), JobStatus.completed)
    path = tmp_path / f"{job_id(1)}.job.jsonl"
    whole = path.read_bytes()
    path.write_bytes(whole[:-20])  # the final state line cut short, as by a kill mid-write
    second = LocalJobStore(tmp_path)
    await second.load()
    job = await second.get(job_id(1))
    assert job is not None and job.status is JobStatus.failed  # the last whole state said running
    assert await second.frames(job_id(1)) == [ReportFrame(output="one")]
    third = LocalJobStore(tmp_path)  # the failed state was written on a line of its own
    await third.load()
    job = await third.get(job_id(1))
    assert job is not None and job.status is JobStatus.failed and job.error is not None


async def test_the_state_of_a_job_with_large_frames_is_read_from_its_end(tmp_path: Path) -> None:
    store = LocalJobStore(tmp_path)
    await store.create(Job(job_id(1), "alice", "q", status=JobStatus.running))
    for n in range(40):
        await store.append(job_id(1), ReportFrame(output=f"{n} " + "word " * 1000))
    await store.finish(job_id(1), JobStatus.completed)
    big_states = {2: 100_000, 3: 10_000}  # state lines longer than the ends that are read first
    for n, size in big_states.items():
        await store.create(Job(job_id(n), "bob", "q", status=JobStatus.running, client={"orderedData": ["x" * size]}))
        await store.finish(job_id(n), JobStatus.completed)
    again = LocalJobStore(tmp_path)
    await again.load()
    first = await again.get(job_id(1))
    assert first is not None and first.status is JobStatus.completed
    for n, size in big_states.items():
        job = await again.get(job_id(n))
        assert job is not None and job.status is JobStatus.completed and job.client == {"orderedData": ["x" * size]}
    assert len(await again.frames(job_id(1))) == 40


async def test_records_of_earlier_versions_are_converted_at_load(tmp_path: Path) -> None:
    import json

    finished = Job(job_id(1), "alice", "q", status=JobStatus.completed).to_json()
    (tmp_path / f"{job_id(1)}.json").write_text(json.dumps(finished))
    # U+0085 (NEL, common in text taken from PDFs) ends a line for str.splitlines, not for JSON Lines
    earlier = '{"type": "logs", "content": "warning", "output": "a\u0085b"}\n{"type": "path", "output": {"md": "x"}}\n'
    (tmp_path / f"{job_id(1)}.frames.jsonl").write_text(earlier)
    frames = [LogsFrame(content=ProgressStep.warning, output="a\u0085b"), PathFrame(output={"md": "x"})]
    running = Job(job_id(2), "bob", "q", status=JobStatus.running).to_json()
    (tmp_path / f"{job_id(2)}.json").write_text(json.dumps(running))
    (tmp_path / f"{job_id(3)}.json").write_text("{not json")
    store = LocalJobStore(tmp_path)
    assert await store.load() == 2
    assert await store.frames(job_id(1)) == frames
    second = await store.get(job_id(2))
    assert second is not None and second.status is JobStatus.failed
    names = sorted(path.name for path in tmp_path.iterdir())
    assert names == [f"{job_id(1)}.job.jsonl", f"{job_id(2)}.job.jsonl", f"{job_id(3)}.json"]  # the unreadable one left
    again = LocalJobStore(tmp_path)
    assert await again.load() == 2
    assert await again.frames(job_id(1)) == frames


def test_an_evolved_job_is_a_new_frozen_job_with_only_known_fields_changed() -> None:
    job = Job(job_id(1), "alice", "q", status=JobStatus.running, files={"md": "reports/x.md"})
    later = job.evolve(progress=0.5, status=JobStatus.completed)
    assert later == replace(job, progress=0.5, status=JobStatus.completed) and job.progress == 0.0
    assert later.status.finished and not job.status.finished
    with pytest.raises(TypeError, match="no field progres"):
        job.evolve(progres=1.0)
    with pytest.raises(AttributeError):
        later.progress = 1.0  # type: ignore[misc]


async def test_a_frame_encoded_once_is_stored_as_any_frame_would_be(tmp_path: Path) -> None:
    store = LocalJobStore(tmp_path)
    await store.create(Job(job_id(1), "alice", "q", status=JobStatus.running))
    plain = {"type": "logs", "content": "warning", "output": "文献 \u2028 ✓", "metadata": {"n": [1, 2.5, None]}}
    encoded = LogsFrame(content=ProgressStep.warning, output="文献 \u2028 ✓", metadata={"n": [1, 2.5, None]})
    assert encoded.text == json.dumps(plain, ensure_ascii=False) and encoded.text is encoded.text  # made once
    await store.append(job_id(1), encoded)
    await store.append(job_id(1), LogsFrame.model_validate(plain))
    await store.finish(job_id(1), JobStatus.completed)
    lines = (tmp_path / f"{job_id(1)}.job.jsonl").read_text(encoding="utf-8").split("\n")
    assert lines[1] == lines[2] == json.dumps({"frame": plain}, ensure_ascii=False)
    again = LocalJobStore(tmp_path)
    await again.load()
    read = await again.frames(job_id(1))
    assert read == [encoded, encoded] and [frame.text for frame in read] == [encoded.text] * 2


async def test_a_jobs_appends_run_on_the_event_loop_not_on_the_work_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each trip to a thread cost more CPU than the write: a sixth of a process's CPU per task."""
    threads: list[str] = []
    append = jobs_module._append

    def seen(*args: Any) -> None:
        threads.append(threading.current_thread().name)
        append(*args)

    monkeypatch.setattr(jobs_module, "_append", seen)
    pool = WorkPool(1)
    try:
        store = LocalJobStore(tmp_path, pool)
        await store.create(Job(job_id(1), "alice", "q", status=JobStatus.running))
        await store.append(job_id(1), ReportFrame(output="one"))
        await store.finish(job_id(1), JobStatus.completed)
    finally:
        pool.close()
    assert threads == [threading.current_thread().name] * 2
    again = LocalJobStore(tmp_path)
    assert await again.load() == 1
    assert await again.frames(job_id(1)) == [ReportFrame(output="one")]
    job = await again.get(job_id(1))
    assert job is not None and job.status is JobStatus.completed


async def test_a_follower_behind_when_its_job_ends_catches_up_from_memory_not_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    read_back: list[Path] = []
    read_frames = jobs_module._read_frames

    def seen(path: Path) -> list[Any]:
        read_back.append(path)
        return read_frames(path)

    monkeypatch.setattr(jobs_module, "_read_frames", seen)
    store = LocalJobStore(tmp_path)
    store.frames_kept_s = 0.2
    await store.create(Job(job_id(1), "alice", "q", status=JobStatus.running))
    follower = follow(store, job_id(1))
    await store.append(job_id(1), numbered(0))
    assert await anext(follower) == numbered(0)
    for n in range(1, 4):  # the job ends before its follower runs again
        await store.append(job_id(1), numbered(n))
    await store.finish(job_id(1), JobStatus.completed)
    assert [number_of(frame) async for frame in follower] == [1, 2, 3]
    assert read_back == []
    await asyncio.sleep(0.3)  # then memory lets them go: the file has them
    assert [number_of(frame) for frame in await store.frames(job_id(1), 1)] == [1, 2, 3]
    assert len(read_back) == 1
    await store.finish(job_id(1), JobStatus.completed)  # a second end writes no frame twice
    assert [number_of(frame) for frame in await store.frames(job_id(1))] == [0, 1, 2, 3]


async def test_a_jobs_report_is_kept_in_its_file_and_read_back_by_any_store_of_the_folder(tmp_path: Path) -> None:
    store = LocalJobStore(tmp_path)
    record = record_bytes("# q\n\nline\u2028one\n", {"owner": "alice", "id": job_id(1)})
    await store.create(Job(job_id(1), "alice", "q", status=JobStatus.running))
    await store.append(job_id(1), ReportFrame(output="# q"))
    await store.keep_report(job_id(1), record)  # announced (`path`), not yet finished
    sibling = LocalJobStore(tmp_path)  # another worker of the host: nothing of the job in memory
    assert await sibling.records([job_id(1), job_id(2), "../x"]) == {job_id(1): record}
    await store.finish(job_id(1), JobStatus.completed, record=record)
    assert (tmp_path / f"{job_id(1)}.job.jsonl").read_bytes().count(b'{"report": ') == 1  # not again at the end
    assert await store.records([job_id(1)]) == {job_id(1): record}

    # cancelled between its report's writing and its announcement: the end keeps the report
    await store.create(Job(job_id(2), "alice", "q", status=JobStatus.running))
    await store.finish(job_id(2), JobStatus.cancelled, record=record)
    # a crash mid-write tore its report's line: no report, the job's state before it stands
    await store.create(Job(job_id(3), "alice", "q", status=JobStatus.running))
    with (tmp_path / f"{job_id(3)}.job.jsonl").open("ab") as file:
        file.write(b'{"report": ' + record[:40])
    again = LocalJobStore(tmp_path)
    assert await again.load() == 3
    assert await again.records([job_id(1), job_id(2), job_id(3)]) == {job_id(1): record, job_id(2): record}
    assert await again.frames(job_id(1)) == [ReportFrame(output="# q")]
    await again.delete(job_id(1))
    assert await again.records([job_id(1)]) == {}


async def test_a_store_in_memory_alone_keeps_its_jobs_reports_in_memory() -> None:
    """An app given a job store without a folder: no file is written for a report, and its record is
    still there to read, as its frames are."""
    store = LocalJobStore(None)
    record = record_bytes("# q\n", {"owner": "alice"})
    for n in (1, 2):
        await store.create(Job(job_id(n), "alice", "q", status=JobStatus.running))
    await store.keep_report(job_id(1), record)
    await store.finish(job_id(1), JobStatus.completed, record=record)
    await store.finish(job_id(2), JobStatus.cancelled, record=record)  # never announced
    assert await store.records([job_id(1), job_id(2), job_id(3)]) == {job_id(1): record, job_id(2): record}


async def test_a_webhook_never_follows_a_redirect(tmp_path) -> None:
    """A receiver answering 307 elsewhere used to get the key, and the whole report, sent on there."""
    from aiohttp import web

    from fedresearch.jobs.webhooks import notify
    from tests.conftest import make_settings

    elsewhere: list[dict[str, str]] = []

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(str(request.url.with_path("/elsewhere")))

    async def landed(request: web.Request) -> web.Response:
        elsewhere.append(dict(request.headers))
        return web.json_response({"received": True})

    app = web.Application()
    app.router.add_post("/hook", redirect)
    app.router.add_post("/elsewhere", landed)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/hook"  # type: ignore[union-attr]
    settings = make_settings(
        tmp_path, webhook_url=url, webhook_api_key="hook-secret", webhook_attempts=2, webhook_backoff_s=0.01
    )
    try:
        async with aiohttp.ClientSession() as session:
            delivered = await notify(session, settings, {"research_id": "r1", "status": "completed"})
    finally:
        await runner.cleanup()
    assert delivered is False and elsewhere == []


async def test_each_chat_message_costs_its_own_size_on_disk_and_survives_a_restart(tmp_path: Path) -> None:
    """Round three: each message appended to a saved report's chat rewrote the whole state into its
    append-only file, 150 messages of 60 KB made 680 MB. A message is now a line of its own."""
    store = LocalJobStore(tmp_path)
    entry = Job("client-1", "alice", "q?", origin="client", status=JobStatus.completed)
    await store.create(replace(entry, client={"answer": "a" * 60_000, "orderedData": [{"x": "y" * 60_000}]}))
    started = (tmp_path / "client-1.job.jsonl").stat().st_size
    sent = []
    for number in range(150):
        job = await store.get("client-1")
        assert job is not None
        sent = [*job.client.get("chatMessages", []), {"role": "user", "content": f"{number} " + "词" * 20_000}]
        await store.save(replace(job, client={**job.client, "chatMessages": sent, "timestamp": number}))
    grown = (tmp_path / "client-1.job.jsonl").stat().st_size - started
    assert grown < 1.1 * len(json.dumps(sent, ensure_ascii=False).encode())  # each message once, and little else

    again = LocalJobStore(tmp_path)
    await again.load()
    job = await again.get("client-1")
    assert job is not None and job.client["chatMessages"] == sent and job.client["timestamp"] == 149
    assert job.client["answer"] == "a" * 60_000
    # the history replaced (GPT-Researcher's PUT sends it whole), then added to, after the restart
    replaced = [{"role": "user", "content": "only this"}]
    await again.save(replace(job, client={**job.client, "chatMessages": replaced}))
    job = await again.get("client-1")
    assert job is not None
    await again.save(replace(job, client={**job.client, "chatMessages": [*replaced, {"role": "assistant"}]}))
    third = LocalJobStore(tmp_path)
    await third.load()
    job = await third.get("client-1")
    assert job is not None and job.client["chatMessages"] == [*replaced, {"role": "assistant"}]


async def test_a_chat_written_with_the_state_by_an_earlier_version_is_kept(tmp_path: Path) -> None:
    old = {"job": {**Job("client-2", "alice", "q?", origin="client").to_json(), "status": "completed"}}
    old["job"]["client"] = {"chatMessages": [{"role": "user", "content": "before"}]}
    (tmp_path / "client-2.job.jsonl").write_text(json.dumps(old) + "\n")
    store = LocalJobStore(tmp_path)
    await store.load()
    job = await store.get("client-2")
    assert job is not None
    messages = [*job.client["chatMessages"], {"role": "user", "content": "after"}]
    await store.save(replace(job, client={**job.client, "chatMessages": messages}))
    again = LocalJobStore(tmp_path)
    await again.load()
    job = await again.get("client-2")
    assert job is not None and [m["content"] for m in job.client["chatMessages"]] == ["before", "after"]
