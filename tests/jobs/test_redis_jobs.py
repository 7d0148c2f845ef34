"""The JobStore in a real Redis: the protocol's promises (every frame once, in order; nothing after
the end; waiting; listing and deleting), and a job started on one worker resumed on another."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time

import aiohttp
import pytest
import websockets
from pydantic import SecretStr

from fedresearch.core.events import ProgressStep
from fedresearch.core.lineage import process_space
from fedresearch.core.redis import SharedDown, SharedRedis, cancelled, connect
from fedresearch.jobs.frames import Frame, LogsFrame, PathFrame
from fedresearch.jobs.redis_store import RedisJobStore
from fedresearch.jobs.store import Job, JobStatus, died_here, follow, runner_id
from fedresearch.web.keys import RUNTIME
from tests.conftest import make_settings, report_of
from tests.jobs.numbered import job_id, number_of, numbered
from tests.redis_server import start_redis
from tests.tcp_proxy import TcpProxy
from tests.web.test_jobs_api import ALICE, BOB, KEYS, TASK, WebhookReceiver


def _step(output: str, step: ProgressStep = ProgressStep.fetching) -> LogsFrame:
    return LogsFrame(content=step, output=output)


async def _opened(redis_target):
    shared = redis_target.shared()
    jobs = RedisJobStore(shared)
    yield jobs
    await jobs.close()
    await shared.close()


@pytest.fixture
async def store(redis_target):
    async for jobs in _opened(redis_target):
        yield jobs


@pytest.fixture
async def elsewhere(redis_target):
    """The same store as another worker sees it: only through Redis."""
    async for jobs in _opened(redis_target):
        yield jobs


async def test_a_follower_that_joins_late_gets_every_frame_once_in_order(store, elsewhere) -> None:
    await store.create(Job(job_id(1), "alice", "q", status=JobStatus.running))

    async def produce() -> None:
        for n in range(50):
            await store.append(job_id(1), numbered(n))
            if n % 7 == 0:
                await asyncio.sleep(0.01)
        await store.finish(job_id(1), JobStatus.completed, files={"md": "reports/x.md"})

    for n in range(5):
        assert await store.append(job_id(1), numbered(-5 + n)) == n
    producer = asyncio.create_task(produce())
    early = asyncio.create_task(_numbers(follow(elsewhere, job_id(1))))  # through Redis, while it is written
    here = [number_of(frame) async for frame in follow(store, job_id(1), start=3)]  # the worker's own mirror
    await producer
    assert await early == list(range(-5, 50)) and here == list(range(-2, 50))
    assert [number_of(frame) async for frame in follow(elsewhere, job_id(1), start=3)] == here
    last = (await elsewhere.frames(job_id(1), 54))[0]
    assert last == numbered(49) and last.text == numbered(49).text  # sent again as it was first sent
    job = await elsewhere.get(job_id(1))
    assert job is not None and job.status is JobStatus.completed and job.progress == 1.0
    assert job.files == {"md": "reports/x.md"}
    for writer in (store, elsewhere):
        with pytest.raises(ValueError, match="no frame may follow"):
            await writer.append(job_id(1), numbered(50))
    assert len(await elsewhere.frames(job_id(1))) == 55  # the end marker is no frame


async def test_finishing_writes_the_last_frames_state_and_end_in_one_round_trip(store, elsewhere) -> None:
    """The frames still gathering go with the final state and the end, at once, not after the
    write-behind's wait and then a round trip of their own."""
    await store.create(Job(job_id(2), "alice", "q", status=JobStatus.running))
    before = await _scripts_run(store)
    for n in range(3):
        await store.append(job_id(2), numbered(n))
    await store.finish(job_id(2), JobStatus.completed)
    assert await _scripts_run(store) == before + 1
    assert [number_of(frame) async for frame in follow(elsewhere, job_id(2))] == [0, 1, 2]
    job = await elsewhere.get(job_id(2))
    assert job is not None and job.status is JobStatus.completed


async def _scripts_run(store: RedisJobStore) -> int:
    """EVALSHA calls so far, on every node of a cluster."""
    if not store.shared.cluster:
        return int((await store.redis.info("commandstats")).get("cmdstat_evalsha", {}).get("calls", 0))
    nodes = await store.redis.info("commandstats", target_nodes="primaries")  # type: ignore[call-arg]
    return sum(int(stats.get("cmdstat_evalsha", {}).get("calls", 0)) for stats in nodes.values())


async def test_frames_of_a_job_deleted_elsewhere_do_not_bring_it_back(store, elsewhere) -> None:
    await store.create(Job(job_id(3), "alice", "q", status=JobStatus.running))
    assert await elsewhere.delete(job_id(3))
    await store.append(job_id(3), numbered(0))
    await store.finish(job_id(3), JobStatus.completed)
    assert await store.redis.exists(f"fedresearch:job:{job_id(3)}:frames", f"fedresearch:job:{job_id(3)}:ended") == 0


async def _numbers(frames) -> list[int]:
    return [number_of(frame) async for frame in frames]


async def test_jobs_are_listed_by_owner_newest_first_and_deleted(store, elsewhere) -> None:
    for n, owner in enumerate(("alice", "bob", "alice", None)):
        await store.create(Job(job_id(n), owner, f"q{n}", created_at=1000.0 + n))
    with pytest.raises(ValueError, match="exists"):
        await store.create(Job(job_id(0), "alice", "again"))
    for reader in (store, elsewhere):
        assert [job.research_id for job in await reader.list("alice")] == [job_id(2), job_id(0)]
        assert [job.research_id for job in await reader.list(None)] == [job_id(3)]
        assert len(await reader.list(None, everyone=True)) == 4
        assert [job.research_id for job in await reader.list("alice", skip=1)] == [job_id(0)]  # after the newest
        assert [job.research_id for job in await reader.list(None, everyone=True, skip=2)] == [job_id(1), job_id(0)]
        assert await reader.list("alice", skip=2) == []
    waiting = asyncio.create_task(elsewhere.wait(job_id(2), 0))
    await asyncio.sleep(0.1)
    assert await store.delete(job_id(2)) and not await store.delete(job_id(2))
    assert await asyncio.wait_for(waiting, 5) is False  # a deleted job's waiter is told, not left waiting
    assert [job.research_id for job in await elsewhere.list("alice")] == [job_id(0)]
    with pytest.raises(KeyError):
        await elsewhere.save(Job(job_id(2), "alice", "gone"))


async def test_many_jobs_of_several_owners_are_deleted_at_once(store, elsewhere) -> None:
    for n, owner in enumerate(("alice", "bob", "alice", None, "bob")):
        await store.create(Job(job_id(n), owner, f"q{n}", created_at=1000.0 + n))
    await store.finish(job_id(0), JobStatus.completed)
    # the first one is this worker's own (mirrored here), the others only in Redis for `elsewhere`
    deleted = await elsewhere.delete_many([job_id(0), job_id(1), job_id(3), job_id(9)])
    assert sorted(deleted) == [job_id(0), job_id(1), job_id(3)]  # an unknown id is no error, and not reported
    assert [job.research_id for job in await elsewhere.list(None, everyone=True)] == [job_id(4), job_id(2)]
    assert [job.research_id for job in await elsewhere.list("bob")] == [job_id(4)]
    assert await elsewhere.frames(job_id(1)) == [] and await elsewhere.get(job_id(3)) is None
    assert await store.delete_many([job_id(2)]) == [job_id(2)]  # a job run here: its mirror goes too
    assert await store.get(job_id(2)) is None and [job.research_id for job in await elsewhere.list("alice")] == []


async def test_with_redis_gone_a_workers_own_jobs_are_still_deleted_and_others_say_why() -> None:
    server_of_redis = start_redis()
    shared = SharedRedis(connect(server_of_redis.url), server_of_redis.url)
    try:
        store, other = RedisJobStore(shared), RedisJobStore(shared)
        for n in range(3):
            await store.create(Job(job_id(n), "alice", f"q{n}", status=JobStatus.running))
        await other.create(Job(job_id(7), "bob", "elsewhere", status=JobStatus.running))
        server_of_redis.stop()
        assert await store.delete_many([job_id(0)]) == [job_id(0)]  # its own: deleted here as created here
        with pytest.raises(SharedDown):
            await store.delete_many([job_id(1), job_id(7)])  # bob's job lives in Redis alone: that must be said
        assert [job.research_id for job in await store.list("alice")] == [
            job_id(2)
        ]  # what it holds while Redis is away
    finally:
        server_of_redis.stop()
        await shared.close()


async def test_a_report_is_kept_in_redis_read_here_from_its_announcement_and_on_disk_only_if_redis_fails(
    tmp_path, redis_target
) -> None:
    shared = redis_target.shared()
    store, elsewhere = RedisJobStore(shared, reports_dir=tmp_path), RedisJobStore(shared)
    record = json.dumps({"owner": "alice", "report": "# 文献\n"}).encode()
    try:
        await store.create(Job(job_id(1), "alice", "q", status=JobStatus.running))
        await store.keep_report(job_id(1), record)  # announced (`path`), not yet finished
        assert await store.records([job_id(1), job_id(2)]) == {job_id(1): record}
        assert await elsewhere.records([job_id(1)]) == {}
        await store.finish(job_id(1), JobStatus.completed, record=record)
        assert await elsewhere.records([job_id(1)]) == {job_id(1): record} == await store.records([job_id(1)])
        assert not list(tmp_path.iterdir())  # no file: Redis keeps it, a host writes it when asked
    finally:
        await shared.close()

    server_of_redis = start_redis()
    shared = SharedRedis(connect(server_of_redis.url), server_of_redis.url)
    try:
        store = RedisJobStore(shared, reports_dir=tmp_path)
        await store.create(Job(job_id(3), "alice", "q", status=JobStatus.running))
        await store.append(job_id(3), numbered(0))
        await store.keep_report(job_id(3), record)
        server_of_redis.stop()  # the job's end, its report with it, cannot reach Redis
        job = await store.finish(job_id(3), JobStatus.completed, record=record)
        assert job is not None and job.status is JobStatus.completed
        assert (tmp_path / f"{job_id(3)}.json").read_bytes() == record  # kept where this host reads
    finally:
        server_of_redis.stop()
        await shared.close()


async def test_a_report_stays_readable_here_when_the_task_finishing_its_job_is_cancelled(redis_url) -> None:
    """A client closing its socket right after `path` cancels the task that finishes the job while
    its last batch, the report with it, is on its way to Redis: the report must stay readable."""
    shared = SharedRedis(connect(redis_url), redis_url)
    store = RedisJobStore(shared)
    record = json.dumps({"owner": "alice", "report": "# q\n"}).encode()
    try:
        await store.create(Job(job_id(1), "alice", "q", status=JobStatus.running))
        await store.keep_report(job_id(1), record)
        await shared.client.execute_command("CLIENT", "PAUSE", 5000, "WRITE")  # the last batch waits
        finishing = asyncio.create_task(store.finish(job_id(1), JobStatus.completed, record=record))
        await asyncio.sleep(0.2)
        finishing.cancel()
        await asyncio.gather(finishing, return_exceptions=True)
        assert await store.records([job_id(1)]) == {job_id(1): record}  # Redis has it not yet: memory does
        await shared.client.execute_command("CLIENT", "UNPAUSE")
        for _ in range(100):
            if job_id(1) not in store._reports_here:
                break
            await asyncio.sleep(0.02)
        assert await RedisJobStore(shared).records([job_id(1)]) == {job_id(1): record}  # written, as any worker reads
    finally:
        await shared.client.execute_command("CLIENT", "UNPAUSE")
        await shared.close()


async def test_a_running_job_whose_worker_died_is_ended_failed_by_the_next_reader(redis_target) -> None:
    """A worker killed mid-job cannot end it, and whoever follows the job would wait for ever: the
    worker's key lapses, and the first worker to read the job ends it, failed, saying why."""
    shared = redis_target.shared()
    dying, living = RedisJobStore(shared, runner_lease_s=0.5), RedisJobStore(shared)
    try:
        for number in (1, 2):
            await dying.create(Job(job_id(number), "alice", f"q{number}", status=JobStatus.running))
        await dying.append(job_id(1), _step("starting", ProgressStep.starting_research))
        await dying._written(job_id(1))
        await asyncio.sleep(1.0)  # twice the lease: renewed meanwhile
        job = await living.get(job_id(1))
        assert job is not None and job.status is JobStatus.running and job.runner == dying.runner

        async def frames_followed() -> list[Frame]:
            return [frame async for frame in follow(living, job_id(1))]

        followed = asyncio.create_task(frames_followed())
        await dying.finish(job_id(2), JobStatus.completed)  # what it ended before dying stays so
        assert dying._renewing is not None
        await cancelled(dying._renewing)  # killed: no renewal, nothing cleaned up
        frames = await asyncio.wait_for(followed, 10)
        assert frames[0] == _step("starting", ProgressStep.starting_research)
        # it ends as a task that could not run: the error, a short report, then `path`, which
        # GPT-Researcher's clients wait for (one resuming it was left waiting for ever)
        assert [frame.type for frame in frames[1:]] == ["error", "logs", "report", "path"]
        assert isinstance(frames[2], LogsFrame) and "stopped before it ended" in frames[2].output
        assert isinstance(frames[-1], PathFrame) and frames[-1].output["md"] == f"reports/{job_id(1)}.md"
        assert (
            b"stopped before it ended" in (await living.records([job_id(1)]))[job_id(1)]
        )  # the short report, readable
        job = await living.get(job_id(1))
        assert job is not None and job.status is JobStatus.failed and "stopped before it ended" in (job.error or "")
        assert {job.research_id: job.status for job in await RedisJobStore(shared).list("alice")} == {
            job_id(1): JobStatus.failed,
            job_id(2): JobStatus.completed,
        }
        await dying.finish(job_id(1), JobStatus.completed)  # a worker thought dead, late: the end stands
        job = await living.get(job_id(1))
        assert job is not None and job.status is JobStatus.failed
        assert len(await living.frames(job_id(1))) == 5  # its end as ended here: no frame of the late worker
    finally:
        await dying.close()
        await shared.close()


async def test_a_dead_workers_job_ended_by_a_server_is_announced_by_webhook_once(
    tmp_path, fakes, start_server, redis_url
) -> None:
    receiver = await WebhookReceiver().start()
    shared = SharedRedis(connect(redis_url), redis_url)
    dying = RedisJobStore(shared, runner_lease_s=0.5)
    try:
        await dying.create(Job(job_id(1), "alice", "q", status=JobStatus.running))
        settings = make_settings(
            tmp_path, fakes, api_keys=SecretStr(KEYS), redis_url=SecretStr(redis_url), webhook_url=receiver.url
        )
        server = await start_server(settings)
        assert dying._renewing is not None
        await cancelled(dying._renewing)  # killed
        async with aiohttp.ClientSession(headers=ALICE) as session:
            for _ in range(100):  # the lease lapses; what the server found at start is trusted a second
                async with session.get(f"{server.url}/api/jobs/{job_id(1)}") as response:
                    job = await response.json()
                if job["status"] != "running":
                    break
                await asyncio.sleep(0.05)
            assert job["status"] == "failed" and "stopped before it ended" in job["error"]
            async with session.get(f"{server.url}/api/reports") as response:  # read again: ended once
                assert [entry["id"] for entry in (await response.json())["reports"]] == [job_id(1)]
        hook = await receiver.next()
        assert hook["research_id"] == job_id(1) and hook["status"] == "failed" and hook["user_id"] == "alice"
        assert "stopped before it ended" in hook["error"]
        await asyncio.sleep(0.3)
        assert len(receiver.calls) == 1
    finally:
        await dying.close()
        await shared.close()
        assert receiver.runner is not None
        await receiver.runner.cleanup()


async def test_a_job_whose_writes_redis_failed_midway_is_written_whole_with_its_end_once_it_answers(
    redis_url,
) -> None:
    """Redis failing for a moment (a failover, a blip) while jobs run: each goes on here alone, and
    was left running in Redis for ever, its followers on other workers waiting without end. Its end
    is now written once Redis answers, with every frame the stream lacks, in order."""
    path = TcpProxy(redis_url.removeprefix("unix://"))
    path.up()
    through = SharedRedis(connect(f"redis://127.0.0.1:{path.port}"), "the proxy")
    direct = SharedRedis(connect(redis_url), redis_url)
    store, elsewhere = RedisJobStore(through, runner_lease_s=1.0), RedisJobStore(direct)
    record = json.dumps({"owner": "alice", "report": "# q\n"}).encode()
    try:
        await store.create(Job(job_id(1), "alice", "q", status=JobStatus.running))
        await store.append(job_id(1), _step("starting", ProgressStep.starting_research))
        await store._written(job_id(1))
        path.down()  # mid-job
        for number in range(3):
            await store.append(job_id(1), _step(f"step {number}"))
        await store._written(job_id(1))
        path.up()
        await store.keep_report(job_id(1), record)
        await store.finish(job_id(1), JobStatus.completed, files={"md": "reports/x.md"}, record=record)
        frames = await asyncio.wait_for(_all_frames(elsewhere, job_id(1)), 10)  # paid by the worker's upkeep
        assert frames == [_step("starting", ProgressStep.starting_research)] + [_step(f"step {n}") for n in range(3)]
        job = await elsewhere.get(job_id(1))
        assert job is not None and job.status is JobStatus.completed and job.files == {"md": "reports/x.md"}
        assert await elsewhere.records([job_id(1)]) == {job_id(1): record}
        for _ in range(50):  # the worker reads Redis for it again
            if job_id(1) not in store._only_here:
                break
            await asyncio.sleep(0.1)
        assert job_id(1) not in store._only_here and not store._ends_owed
    finally:
        path.down()
        await store.close()
        await through.close()
        await direct.close()


async def test_a_job_run_while_redis_failed_is_written_whole_once_it_answers(redis_url, tmp_path) -> None:
    """A job created while Redis failed ran on in its worker alone, and stayed there: no other
    worker listed, resumed or deleted it, and its worker kept its frames for good. Once Redis
    answers it is written there whole (created, every frame, its end, its report), and forgotten
    here; by a worker whose every job so far Redis had failed (no renewals running to pay it), and
    though the task finishing it was cancelled (its client closed the socket on `path`)."""
    path = TcpProxy(redis_url.removeprefix("unix://"))
    path.up()
    path.down()  # its port kept, refusing
    through = SharedRedis(connect(f"redis://127.0.0.1:{path.port}"), "the proxy")
    direct = SharedRedis(connect(redis_url), redis_url)
    store = RedisJobStore(through, runner_lease_s=1.0, keep_finished_s=0.1, reports_dir=tmp_path)
    elsewhere = RedisJobStore(direct)
    record = json.dumps({"owner": "alice", "report": "# q\n"}).encode()
    try:
        await store.create(Job(job_id(1), "alice", "q", status=JobStatus.running))  # Redis away
        for number in range(3):
            await store.append(job_id(1), _step(f"step {number}"))
        await store.keep_report(job_id(1), record)
        finishing = asyncio.create_task(
            store.finish(job_id(1), JobStatus.completed, files={"md": "reports/x.md"}, record=record)
        )
        while job_id(1) not in store._ends_owed:
            await asyncio.sleep(0)
        finishing.cancel()
        await asyncio.gather(finishing, return_exceptions=True)
        assert await elsewhere.get(job_id(1)) is None
        for _ in range(50):  # saved where this host reads reports, should Redis not come back
            if (tmp_path / f"{job_id(1)}.json").is_file():
                break
            await asyncio.sleep(0.1)
        assert (tmp_path / f"{job_id(1)}.json").read_bytes() == record
        path.up()
        for _ in range(100):
            if not store._ends_owed and job_id(1) not in store.here:
                break
            await asyncio.sleep(0.1)
        assert not store._ends_owed and not store._never_in_redis and job_id(1) not in store.here  # forgotten
        frames = await asyncio.wait_for(_all_frames(elsewhere, job_id(1)), 10)
        assert frames == [_step(f"step {n}") for n in range(3)]
        assert [job.research_id for job in await elsewhere.list("alice")] == [job_id(1)]
        job = await elsewhere.get(job_id(1))
        assert job is not None and job.status is JobStatus.completed and job.files == {"md": "reports/x.md"}
        assert await elsewhere.records([job_id(1)]) == {job_id(1): record}
    finally:
        path.down()
        await store.close()
        await elsewhere.close()
        await through.close()
        await direct.close()


async def _all_frames(store: RedisJobStore, research_id: str) -> list[Frame]:
    return [frame async for frame in follow(store, research_id)]


def test_a_worker_on_this_machine_is_known_dead_by_its_pid() -> None:
    space = process_space()
    assert space, "Linux gives a boot id and a PID namespace"
    gone = subprocess.Popen(["true"])
    gone.wait()  # a process that was, and is reaped
    assert died_here(f"{'a' * 32}@{space}:{gone.pid}", space)
    assert not died_here(runner_id(space), space)  # this process
    assert not died_here(f"{'a' * 32}@another-machine/pid:[1]:{gone.pid}", space)  # elsewhere: its key decides
    assert not died_here("a" * 32, space) and not died_here(f"{'a' * 32}@{space}:{gone.pid}", "")


async def test_a_job_naming_no_worker_is_ended_once_no_task_could_still_run(redis_target) -> None:
    """Jobs started by a version before workers were named carry no worker: one still running longer
    than TASK_TIMEOUT_S (plus a lease) after its start is ended, failed; a younger one is left."""
    shared = redis_target.shared()
    earlier, unbounded, living = RedisJobStore(shared), RedisJobStore(shared), RedisJobStore(shared, longest_job_s=60)
    try:
        for number, age in ((1, 3600), (2, 10)):
            await earlier.create(
                Job(job_id(number), "alice", "q", status=JobStatus.running, created_at=time.time() - age)
            )
            key = earlier._keys.meta(job_id(number))
            meta = json.loads(await shared.client.get(key))
            del meta["runner"]  # as the earlier version wrote it
            await shared.client.set(key, json.dumps(meta))
        assert [job.status for job in await unbounded.list("alice")] == [JobStatus.running] * 2
        listed = {job.research_id: job for job in await living.list("alice")}
        assert listed[job_id(1)].status is JobStatus.failed and listed[job_id(2)].status is JobStatus.running
        assert [frame.type for frame in await _all_frames(living, job_id(1))][-4:] == [
            "error",
            "logs",
            "report",
            "path",
        ]
    finally:
        for store in (earlier, unbounded, living):
            await store.close()
        await shared.close()


async def test_a_workers_key_goes_when_it_closes_and_its_unended_jobs_with_it(redis_target) -> None:
    shared = redis_target.shared()
    closing, living = RedisJobStore(shared), RedisJobStore(shared)
    try:
        await closing.create(Job(job_id(1), "alice", "q", status=JobStatus.running))
        job = await living.get(job_id(1))
        assert job is not None and job.status is JobStatus.running
        await closing.close()  # stopped with its job unended (its end could not be written)
        await asyncio.sleep(1.1)  # what `living` knew of it is trusted a second
        job = await living.get(job_id(1))
        assert job is not None and job.status is JobStatus.failed
    finally:
        await shared.close()


async def test_a_dead_workers_many_jobs_are_ended_by_one_listing_and_said_in_one_line(redis_url, caplog) -> None:
    shared = SharedRedis(connect(redis_url, False), redis_url)
    dying, living = RedisJobStore(shared), RedisJobStore(shared)
    try:
        for number in range(12):
            await dying.create(Job(job_id(number), "alice", "q", status=JobStatus.running))
        await dying.close()
        with caplog.at_level("WARNING", logger="fedresearch"):
            jobs = await living.list("alice")
        assert [job.status for job in jobs] == [JobStatus.failed] * 12
        (said,) = [record.getMessage() for record in caplog.records if "stopped before" in record.getMessage()]
        assert said.startswith("12 job(s)") and said.endswith("and 2 more") and job_id(11) in said
    finally:
        await living.close()
        await shared.close()


async def test_a_job_started_on_one_worker_is_resumed_on_another(tmp_path, fakes, start_server, redis_target):
    fakes["tavily"].behaviour.delay_s = 0.8
    # two workers of one host: one data folder (the reports), the jobs in Redis
    settings = make_settings(
        tmp_path, fakes, api_keys=SecretStr(KEYS), upstream_cache_ttl_s=0, **redis_target.settings()
    )
    first, second = await start_server(settings), await start_server(settings)
    task = {**TASK, "headers": {"retrievers": "internal_biblio,tavily"}, "detach": True}
    async with websockets.connect(first.ws_url, additional_headers=ALICE) as ws:
        await ws.send("start " + json.dumps(task))
        before = [json.loads(await ws.recv()) for _ in range(3)]  # then the socket goes away mid-task
    research_id = before[0]["metadata"]["research_id"]
    async with websockets.connect(second.ws_url, additional_headers=ALICE) as ws:
        await ws.send("resume " + json.dumps({"research_id": research_id}))
        resumed = []
        while not resumed or resumed[-1]["type"] != "path":
            resumed.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
        # the chat session lives in the first worker's memory: this one makes it from the saved report
        await ws.send("chat " + json.dumps({"message": "rank fusion"}))
        answer = json.loads(await asyncio.wait_for(ws.recv(), 30))
        # a question the report does not cover is searched again with the task's retrievers, here
        # too (the defaults, the library alone, would not ask Tavily)
        await ws.send("chat " + json.dumps({"message": "zebra migration patterns in the serengeti"}))
        searched = json.loads(await asyncio.wait_for(ws.recv(), 30))
    assert answer["type"] == "chat" and "[1]" in answer["content"], answer
    assert searched["metadata"]["searched"] is True, searched
    assert fakes["tavily"].requests[-1]["body"]["query"] == "zebra migration patterns in the serengeti"
    assert resumed[:3] == before
    assert "tavily" in report_of(resumed) and not any(frame["type"] == "error" for frame in resumed)
    status_url = f"{second.url}/api/jobs/{research_id}"
    async with aiohttp.ClientSession() as session, session.get(status_url, headers=ALICE) as response:
        job = await response.json()
    assert job["status"] == "completed" and job["report"] == report_of(resumed)


async def test_the_next_task_sent_the_moment_path_arrives_is_not_refused(tmp_path, fakes, start_server, redis_url):
    """GPT-Researcher's clients send their next task as soon as they read `path`. A socket that
    resumed a job run by another worker follows it through Redis, here 20 ms away: once `path` is
    sent there is nothing left to ask Redis, so the socket is free for the next task at once."""
    far = TcpProxy(redis_url.removeprefix("unix://"), answer_delay_s=0.02)
    far.up()
    try:
        near = make_settings(tmp_path, fakes, api_keys=SecretStr(KEYS), redis_url=SecretStr(redis_url))
        first = await start_server(near)
        far_url = SecretStr(f"redis://127.0.0.1:{far.port}")
        second = await start_server(near.model_copy(update={"redis_url": far_url}))
        task = {**TASK, "headers": {"retrievers": "tavily"}, "detach": True}
        async with websockets.connect(first.ws_url, additional_headers=ALICE) as ws:
            await ws.send("start " + json.dumps(task))
            research_id = json.loads(await ws.recv())["metadata"]["research_id"]
            while json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] != "path":
                pass
        async with websockets.connect(second.ws_url, additional_headers=ALICE) as ws:
            for command in ("resume " + json.dumps({"research_id": research_id}), "start " + json.dumps(task)):
                await ws.send(command)
                frames = [json.loads(await asyncio.wait_for(ws.recv(), 30))]
                while frames[-1]["type"] not in ("path", "error") and frames[-1].get("content") != "warning":
                    frames.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
                assert frames[-1]["type"] == "path", frames[-1]
    finally:
        far.down()


async def test_a_report_asked_of_another_worker_the_moment_path_arrives_is_served(
    tmp_path, fakes, start_server, redis_url
):
    """GPT-Researcher's page fetches a report's files the moment `path` arrives, and on a port that
    several workers share the request lands on any of them; the job's end, with the report, reaches
    Redis after `path` (written behind; here about 1 s later, every request of the first worker delayed
    0.15 s). The other worker waits for it rather than answering 404."""
    far = TcpProxy(redis_url.removeprefix("unix://"), request_delay_s=0.15)
    far.up()
    try:
        near = make_settings(tmp_path, fakes, api_keys=SecretStr(KEYS), redis_url=SecretStr(redis_url))
        first = await start_server(near.model_copy(update={"redis_url": SecretStr(f"redis://127.0.0.1:{far.port}")}))
        second = await start_server(near)
        async with websockets.connect(first.ws_url, additional_headers=ALICE) as ws:
            await ws.send("start " + json.dumps({**TASK, "headers": {"retrievers": "tavily"}}))
            frames = [json.loads(await asyncio.wait_for(ws.recv(), 30))]
            while frames[-1]["type"] != "path":
                frames.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
            research_id = frames[0]["metadata"]["research_id"]
            async with aiohttp.ClientSession(headers=ALICE) as session:
                status_url = f"{second.url}/api/jobs/{research_id}"
                async with session.get(status_url) as response:
                    assert (await response.json())["status"] == "running"  # the end is on its way
                async with session.get(f"{second.url}/reports/{research_id}.md") as response:
                    assert response.status == 200 and await response.text() == report_of(frames)
                async with session.get(f"{second.url}/report/{research_id}") as response:
                    assert response.status == 200 and (await response.read()).startswith(b"PK")
                started = time.monotonic()
                async with session.get(f"{second.url}/reports/{'0' * 32}.md") as response:
                    assert response.status == 404 and time.monotonic() - started < 1  # no job: no wait
    finally:
        far.down()


async def test_a_finished_jobs_mirror_is_dropped_and_redis_serves_it_after(redis_target) -> None:
    shared = redis_target.shared()
    store = RedisJobStore(shared, keep_finished_s=0.1)
    await store.create(Job(job_id(7), "alice", "q", status=JobStatus.running))
    for n in range(3):
        await store.append(job_id(7), numbered(n))
    await store.finish(job_id(7), JobStatus.completed)
    assert job_id(7) in store.here
    await asyncio.sleep(0.5)
    assert job_id(7) not in store.here  # memory holds only recent jobs
    assert [number_of(frame) async for frame in follow(store, job_id(7))] == [0, 1, 2]
    job = await store.get(job_id(7))
    assert job is not None and job.status is JobStatus.completed
    await shared.close()


async def test_a_report_written_on_one_host_is_read_deleted_and_gone_on_another(
    tmp_path, fakes, start_server, redis_target
):
    """Two hosts: their own data folders, the jobs in one Redis. The report a worker on the first
    wrote (to Redis, not to its disk) is read there the moment `path` arrives, and whole on the
    second (REST, files, exports, listing, chat), only by its owner; once deleted there, the first
    host serves it no more and drops its files (when asked for it, or at its sweep)."""
    near = make_settings(tmp_path / "a", fakes, api_keys=SecretStr(KEYS), **redis_target.settings())
    first = await start_server(near)
    second = await start_server(near.model_copy(update={"data_dir": tmp_path / "b" / "data"}))
    here, there = tmp_path / "a" / "data" / "reports", tmp_path / "b" / "data" / "reports"

    async def research() -> tuple[str, str]:
        async with websockets.connect(first.ws_url, additional_headers=ALICE) as ws:
            await ws.send("start " + json.dumps({**TASK, "headers": {"retrievers": "tavily"}}))
            frames = [json.loads(await asyncio.wait_for(ws.recv(), 30))]
            while frames[-1]["type"] != "path":
                frames.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
        return frames[0]["metadata"]["research_id"], report_of(frames)

    async def get(server, path: str, who: dict[str, str]) -> tuple[int, bytes]:
        async with aiohttp.ClientSession() as session, session.get(server.url + path, headers=who) as response:
            return response.status, await response.read()

    async def delete(server, research_id: str) -> None:
        url = f"{server.url}/api/reports/{research_id}"
        async with aiohttp.ClientSession() as session, session.delete(url, headers=ALICE) as response:
            assert response.status == 200

    research_id, report = await research()
    assert "tavily" in report and not (here / f"{research_id}.json").exists() and not there.exists()
    status, body = await get(first, f"/reports/{research_id}.md", ALICE)  # as a page does on `path`
    assert status == 200 and body.decode() == report and (here / f"{research_id}.json").is_file()
    # `path` goes out before the job's end reaches Redis (written behind, within 50 ms)
    for _ in range(100):
        status, body = await get(second, f"/api/jobs/{research_id}", ALICE)
        if json.loads(body)["status"] == "completed":
            break
        await asyncio.sleep(0.05)
    assert status == 200 and json.loads(body)["report"] == report
    for who, seen in ((BOB, 404), (ALICE, 200)):  # bob learns nothing, not even that it exists
        assert (await get(second, f"/reports/{research_id}.md", who))[0] == seen
    assert (await get(second, f"/reports/{research_id}.md", ALICE))[1].decode() == report
    status, body = await get(second, f"/reports/{research_id}.json", ALICE)
    assert status == 200 and json.loads(body)["owner"] == "alice" and json.loads(body)["report"] == report
    status, body = await get(second, f"/reports/{research_id}.pdf", ALICE)
    assert status == 200 and body.startswith(b"%PDF")
    status, body = await get(second, f"/report/{research_id}", ALICE)
    assert status == 200 and body.startswith(b"PK")  # the DOCX, GPT-Researcher's route
    status, body = await get(second, "/api/reports", ALICE)
    assert [entry["answer"] for entry in json.loads(body)["reports"]] == [report]
    chat = {"research_id": research_id, "messages": [{"role": "user", "content": "rank fusion"}]}
    chat_url = f"{second.url}/api/chat"
    async with aiohttp.ClientSession() as session, session.post(chat_url, json=chat, headers=ALICE) as response:
        assert response.status == 200 and "[1]" in (await response.json())["response"]["content"]
    chat = {"research_id": research_id, "messages": [{"role": "user", "content": "zebra migration in kenya"}]}
    async with aiohttp.ClientSession() as session, session.post(chat_url, json=chat, headers=ALICE) as response:
        assert (await response.json())["response"]["metadata"]["searched"] is True
    assert fakes["tavily"].requests[-1]["body"]["query"] == "zebra migration in kenya"  # the task's retriever

    await delete(second, research_id)
    assert not list(there.iterdir())  # what the second host kept went with the job
    assert await first.app[RUNTIME].jobs.records([research_id]) == {}  # and Redis's copy
    assert (await get(first, f"/api/jobs/{research_id}", ALICE))[0] == 404  # the first's mirror is not the truth
    assert json.loads((await get(first, "/api/reports", ALICE))[1]) == {"reports": []}
    assert (await get(first, f"/reports/{research_id}.md", ALICE))[0] == 404  # asked for: its files go at once
    assert not list(here.iterdir())

    kept, _ = await research()
    gone, _ = await research()
    for read in (kept, gone):
        assert (await get(first, f"/reports/{read}.json", ALICE))[0] == 200
    await delete(second, gone)
    swept, latest = await first.app[RUNTIME].reports().sweep(time.time() - 60)
    assert swept == 1 and latest > 0 and [path.name for path in here.iterdir()] == [f"{kept}.json"]
    assert (await first.app[RUNTIME].reports().sweep(time.time() - 60))[0] == 0  # read again: nothing left to drop
    shared = redis_target.shared()
    await shared.client.flushall()  # Redis lost everything: what the hosts saved stays, served to its owner
    await shared.close()
    assert (await get(first, f"/reports/{kept}.md", ALICE))[0] == 200
    assert (await first.app[RUNTIME].reports().sweep(0.0))[0] == 0 and (here / f"{kept}.json").is_file()
