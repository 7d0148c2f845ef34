"""The JobStore in Redis (jobs.py's protocol), so that a job started on one worker can be resumed,
listed or read on any other worker or host.

A job is a JSON value (its metadata) and a stream of its frames: frame i has the entry id 0-(i+1),
so reading from an index is one XRANGE and waiting for the next frame is one XREAD BLOCK. Finishing
a job adds one last entry with no frame in it, which wakes every waiter; a Lua script refuses any
frame after it. Owners' job lists are sorted sets scored by creation time. A finished job's saved
report (its JSON record) is a value beside it: Redis is where reports are kept, and a host writes one
to its reports directory only when it is asked for there (a job's files are inodes allocated and,
at retention, freed: on ext4 without a journal each allocation skips one by one the inodes freed in
the last minute, and a `discard` mount trims at each deletion), or when Redis fails to take it. Deleted
jobs are remembered for a day in a sorted set scored by the time of deletion, so that hosts drop
their files of them (web/reports.py).

The jobs a process runs are mirrored in its memory (a LocalJobStore), so its own sockets follow them
without a Redis round trip per frame; other workers read them from Redis. While Redis fails (said
once in the log), the jobs run here go on here alone (resumable on this worker only), jobs elsewhere
cannot be read (SharedDown says why), and nothing waits without end: every command has a 1 s
timeout, and a wait blocks under a second at a time.

A worker that dies (SIGKILL, its host lost) cannot end its jobs, and whoever followed one would wait
for ever. So a worker holds a key that lapses unless it renews it (`runner_lease_s`; renewed four
times a lease, from before its first job), each job names its worker (and, on Linux, its machine's
boot, PID namespace and pid), and a worker reading a running job of a worker whose process is gone
(same machine and namespace) or whose key has lapsed ends it, failed, with frames that say why.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar, cast

from fedresearch.core.errors import FailureKind
from fedresearch.core.lineage import process_space
from fedresearch.core.redis import PREFIX, SharedDown, SharedRedis, cancelled, failures
from fedresearch.jobs.frames import Frame, PathFrame, ReportFrame, decode, error_frames
from fedresearch.jobs.local_store import LocalJobStore
from fedresearch.jobs.store import Job, JobStatus, died_here, runner_id
from fedresearch.report.store import record_bytes, report_files, save_report

T = TypeVar("T")
log = logging.getLogger("fedresearch")
_WAIT_MS = 800  # under the client's 1 s socket timeout: a blocked read must not look like a dead Redis

_APPEND = """
if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
local next = redis.call('XLEN', KEYS[1]) + 1
redis.call('XADD', KEYS[1], '0-' .. next, 'f', ARGV[1])
return next - 1
"""

# a batch written behind: frames at the end of the stream (ARGV[5]...), then the latest metadata
# (ARGV[1], or ''), the saved report's record (ARGV[3], or ''), then, when ARGV[2] names the job's
# final status, the end of its stream; -1: the job is finished already, -2: it was deleted meanwhile
# (nothing is written: no stream without its job). ARGV[4] '1': the frames are all the job's, of
# which the stream holds the first (the end of a job whose writes Redis failed midway: it holds a
# prefix, batches being scripts, one at a time), so only those it lacks are added
_WRITE_BEHIND = """
if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
if redis.call('EXISTS', KEYS[3]) == 0 then return -2 end
local n = redis.call('XLEN', KEYS[1])
local first = 5
if ARGV[4] == '1' then first = 5 + n end
for i = first, #ARGV do
    n = n + 1
    redis.call('XADD', KEYS[1], '0-' .. n, 'f', ARGV[i])
end
if ARGV[1] ~= '' then redis.call('SET', KEYS[3], ARGV[1], 'XX') end
if ARGV[3] ~= '' then redis.call('SET', KEYS[4], ARGV[3]) end
if ARGV[2] ~= '' then
    redis.call('SET', KEYS[2], ARGV[2])
    redis.call('XADD', KEYS[1], '0-' .. (n + 1), 'end', ARGV[2])
end
return n
"""

# a job's new metadata (ARGV[1]) and, when ARGV[2] names its final status, the end of its stream;
# -1: no such job
_SAVE = """
if redis.call('SET', KEYS[3], ARGV[1], 'XX') == false then return -1 end
if ARGV[2] == '' or redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('XADD', KEYS[1], '0-' .. (redis.call('XLEN', KEYS[1]) + 1), 'end', ARGV[2])
return 1
"""

# a new job: its metadata, unless the id is taken (0), and its places in the owner's and everyone's lists
_CREATE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX') == false then return 0 end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[3])
return 1
"""

# frames a running job sends within this long go to Redis together: one script call for several
# frames (other workers' followers see them this much later; this worker's own follow its memory);
# finishing the job ends the wait, and its last batch carries the final state and the stream's end
_GATHER_S = 0.05


class _JobKeys:
    """A job's four keys. On a cluster the job's id is their hash tag, so that the scripts reading
    and writing them run on one node; on a single Redis their names stay those of the jobs
    stored before clusters were supported, which would otherwise drop out of every listing."""

    def __init__(self, tagged: bool) -> None:
        self.tagged = tagged

    def meta(self, research_id: str) -> str:
        return f"{PREFIX}job:{{{research_id}}}" if self.tagged else f"{PREFIX}job:{research_id}"

    def frames(self, research_id: str) -> str:
        return self.meta(research_id) + ":frames"

    def ended(self, research_id: str) -> str:
        return self.meta(research_id) + ":ended"

    def record(self, research_id: str) -> str:
        return self.meta(research_id) + ":report"

    def all(self, research_id: str) -> list[str]:
        """Frames, end, metadata, the report's record: the KEYS of the scripts that write a job."""
        meta = self.meta(research_id)
        return [meta + ":frames", meta + ":ended", meta, meta + ":report"]


def _owned_by(owner: str | None) -> str:
    who = hashlib.sha256(b"\0" if owner is None else owner.encode()).hexdigest()[:32]
    return f"{PREFIX}jobs:owner:{who}"


_EVERY_JOB = f"{PREFIX}jobs:all"
_RUNNER_CHECKED_S = 1.0  # a worker found alive is trusted that long: followers poll its jobs


def _runner_key(runner: str) -> str:
    return f"{PREFIX}runner:{runner}"


_STRANDED = "the worker running this task stopped before it ended (killed, or its host lost): start it again"
# research id -> when it was deleted, for a day and at most the newest 100,000: a host away longer
# (or behind by more) keeps the files of those it missed, served to their owners as before
_DELETED = f"{PREFIX}jobs:deleted"
KEEP_DELETED_S = 86400.0
_KEEP_DELETED = 100_000


class RedisJobStore:
    """Jobs in Redis, and those this process runs mirrored here: its own sockets follow them without
    a round trip to Redis per frame (the usual case); any other worker reads them from Redis. A
    finished job's saved report (its JSON record) is kept beside it; `reports_dir` is where a job
    run here keeps its record should Redis fail to take it."""

    shares_reports = True

    def __init__(
        self,
        shared: SharedRedis,
        keep_finished_s: float = 60.0,
        reports_dir: Path | None = None,
        runner_lease_s: float = 20.0,
        on_stranded: Callable[[Job], None] | None = None,
        longest_job_s: float | None = None,
    ) -> None:
        self.shared = shared
        self.redis = shared.client
        self._space = process_space()
        self.runner = runner_id(self._space)  # this worker, as its jobs name it
        self._runner_lease_ms = max(1, int(runner_lease_s * 1000))
        self._renewing: asyncio.Task[None] | None = None
        self._starting = asyncio.Lock()
        self._alive_until: dict[str, float] = {}  # other workers found alive, until when (monotonic)
        # a job naming no worker (started by a version before workers were named) still running
        # this long after its start cannot be (TASK_TIMEOUT_S bounds every task): its worker died
        self._unnamed_dead_after_s = None if longest_job_s is None else longest_job_s + runner_lease_s
        # told of each job of a dead worker this worker ends (one worker does), to announce it
        self.on_stranded = on_stranded
        self._keys = _JobKeys(tagged=shared.cluster)
        self.keep_finished_s = keep_finished_s  # how long a finished job's mirror serves late readers
        self.here = LocalJobStore(None)  # the jobs run here, and those created while Redis failed
        self._only_here: set[str] = set()  # of those, the ones Redis does not have (whole)
        # of those, the ones that ended here, by their report's record: their end is written to Redis
        # (with the frames it lacks) as soon as it answers, or they would look running there for ever
        self._ends_owed: dict[str, bytes] = {}
        # of those, the ones created while Redis failed: all of them is owed, once they end
        self._never_in_redis: set[str] = set()
        self._retrying: asyncio.Task[None] | None = None  # owed, with no renewals yet to pay it
        self._forgetting: set[asyncio.Task[bool]] = set()
        # written behind: a running job's new frames and latest metadata go to Redis in one pipeline
        # per batch (one round trip, not one per frame); finishing or deleting a job waits for it
        self._frames_due: dict[str, list[str]] = {}
        self._meta_due: dict[str, Job] = {}
        self._ending_due: set[str] = set()  # finished: the next batch ends the job's stream
        self._record_due: dict[str, bytes] = {}  # the saved report, written with the end
        # the reports of jobs run here, from their announcement until their end is written: read here
        # at once (a client fetches the files the moment `path` arrives)
        self._reports_here: dict[str, bytes] = {}
        self.reports_dir = reports_dir
        self._writing: dict[str, asyncio.Task[None]] = {}
        self._gathering: dict[str, asyncio.Future[None]] = {}  # a writer's wait, cut short by finish
        self._append: Any = self.redis.register_script(_APPEND)
        self._save_script: Any = self.redis.register_script(_SAVE)
        self._create_script: Any = self.redis.register_script(_CREATE)
        self._write_behind_script: Any = self.redis.register_script(_WRITE_BEHIND)

    async def _mirror(self, research_id: str, what: str, operation: Callable[[], Awaitable[object]]) -> None:
        """Write a job run here through to Redis; should Redis fail, the job goes on here alone."""
        if research_id in self._only_here:
            return
        try:
            await self.shared.attempt(what, operation)
        except SharedDown:
            self._only_here.add(research_id)

    async def create(self, job: Job) -> None:
        job = job.evolve(runner=self.runner)
        try:
            await self.shared.attempt("creating a job", lambda: self._create(job))
        except SharedDown:
            self._only_here.add(job.research_id)
            self._never_in_redis.add(job.research_id)
        await self.here.create(job)

    async def _create(self, job: Job) -> None:
        if self._renewing is None or self._renewing.done():
            await self._hold_runner_key()
        meta, listed = self._keys.meta(job.research_id), {job.research_id: job.created_at}
        if not self.shared.cluster:
            keys = [meta, _owned_by(job.owner), _EVERY_JOB]
            if not await self._create_script(keys=keys, args=[_dumps(job.to_json()), job.created_at, job.research_id]):
                raise ValueError(f"job {job.research_id} exists")
            return
        # the lists sit in other slots, out of the job's script: the job first, so that an id
        # already taken is refused before its owner's list could gain it
        if not await self.redis.set(meta, _dumps(job.to_json()), nx=True):
            raise ValueError(f"job {job.research_id} exists")
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zadd(_owned_by(job.owner), listed)
            pipe.zadd(_EVERY_JOB, listed)
            await pipe.execute()

    async def _hold_runner_key(self) -> None:
        """This worker's key, in Redis before its first job is, then renewed while it lives."""
        async with self._starting:
            if self._renewing is None or self._renewing.done():
                await self._renew_runner_key()
                self._renewing = asyncio.create_task(self._renew_runner_key_while_alive())

    async def _renew_runner_key(self) -> None:
        await self.redis.set(_runner_key(self.runner), b"1", px=self._runner_lease_ms)

    async def _renew_runner_key_while_alive(self) -> None:
        """Renew this worker's key, and write the ends Redis missed, four times a lease: straight to
        Redis, not held back by the rest that follows a failure (`SharedRedis.attempt`), which
        would let the key lapse after a blip and other workers end this worker's running jobs."""
        while True:
            await asyncio.sleep(self._runner_lease_ms / 4000)
            try:
                await self._renew_runner_key()
                for research_id in list(self._ends_owed):
                    await self._pay_end(research_id)
            except failures():
                pass  # said in the log by the commands that failed; tried again next time
            except Exception:
                # a lapsed key would have other workers end this worker's running jobs: keep renewing
                log.exception("could not renew this worker's lease on its jobs")

    async def close(self) -> None:
        """Stop renewing this worker's key, write the ends Redis missed if it answers, and drop the
        key: a job of this worker's still running there is another worker's to end."""
        held = self._renewing is not None
        await cancelled(self._retrying, self._renewing)
        self._retrying = self._renewing = None
        if not held and not self._ends_owed:
            return
        for research_id in list(self._ends_owed):
            with contextlib.suppress(*failures()):
                await self._pay_end(research_id)
        await cancelled(self._renewing)  # started again by writing a job Redis never had
        self._renewing = None
        drop = lambda: self.redis.delete(_runner_key(self.runner))  # noqa: E731
        with contextlib.suppress(SharedDown):
            await self.shared.attempt("dropping this worker's lease", drop)

    async def _settled(self, jobs: builtins.list[Job]) -> builtins.list[Job]:
        """`jobs` as they stand, those running on a worker that died (its process gone, on this
        machine; its key lapsed, anywhere; a job naming no worker, longer than any task runs) ended
        now, failed (a job deleted meanwhile is left out)."""
        unfinished = [job for job in jobs if not job.status.finished and job.runner != self.runner]
        if not unfinished:
            return jobs
        cutoff = -1.0 if self._unnamed_dead_after_s is None else time.time() - self._unnamed_dead_after_s
        unnamed_dead = {job.research_id for job in unfinished if job.runner is None and job.created_at < cutoff}
        running = {job.runner for job in unfinished if job.runner is not None}
        now = time.monotonic()
        gone = {runner for runner in running if died_here(runner, self._space)}
        unsure = [runner for runner in running if runner not in gone and self._alive_until.get(runner, 0.0) < now]
        if unsure:
            keys = await self._mget([_runner_key(runner) for runner in unsure])
            if len(self._alive_until) > 4096:  # one entry a worker ever seen: restarts add more
                self._alive_until.clear()
            for runner, key in zip(unsure, keys, strict=True):
                if key is None:
                    gone.add(runner)
                else:
                    self._alive_until[runner] = now + _RUNNER_CHECKED_S
        if not gone and not unnamed_dead:
            return jobs
        ended: dict[str, Job | None] = {}
        ended_here: builtins.list[str] = []
        try:
            for job in unfinished:
                if job.runner in gone or job.research_id in unnamed_dead:
                    ended[job.research_id], here = await self._end_stranded(job)
                    if here:
                        ended_here.append(job.research_id)
        finally:
            if ended_here:  # one line however many: a worker that dies may have run hundreds
                more = f" and {len(ended_here) - 10} more" if len(ended_here) > 10 else ""
                log.warning(
                    "%d job(s) whose worker stopped before they ended were ended here, failed: %s%s",
                    len(ended_here),
                    ", ".join(ended_here[:10]),
                    more,
                )
        settled = [ended.get(job.research_id, job) for job in jobs]
        return [job for job in settled if job is not None]

    async def _end_stranded(self, job: Job) -> tuple[Job | None, bool]:
        """End, failed, a job whose worker died, with frames saying why as a cancelled job's do;
        unless it ended meanwhile. Returns it as it stands after, and whether it was ended here."""
        # it ends as a task that could not run does: the error, a short report saying why, `path`
        # (GPT-Researcher's clients wait for `path`; one resuming it was left waiting for ever)
        files = {kind: f"reports/{name}" for kind, name in report_files(job.research_id).items()}
        failed = job.evolve(status=JobStatus.failed, error=_STRANDED, updated_at=time.time(), files=files)
        markdown = f"# {job.task}\n\nThis research stopped before it ended: {_STRANDED}\n"
        record = record_bytes(
            markdown, {"owner": job.owner, "id": job.research_id, "question": job.task, "error": _STRANDED}
        )
        frames = [
            *error_frames(_STRANDED, {"research_id": job.research_id, "then": "report", "kind": FailureKind.internal}),
            ReportFrame(output=markdown),
            PathFrame(output=files),
        ]
        args = [_dumps(failed.to_json()), JobStatus.failed.value, record, "", *(f.text for f in frames)]
        ended_here = int(await self._write_behind_script(keys=self._keys.all(job.research_id), args=args)) >= 0
        now = await self._get(job.research_id)
        if ended_here and now is not None and self.on_stranded is not None:
            self.on_stranded(now)
        return now, ended_here

    async def save(self, job: Job) -> None:
        if job.research_id in self.here:
            await self.here.save(job)
            if not job.status.finished:
                if job.research_id not in self._only_here:
                    self._meta_due[job.research_id] = job.evolve(updated_at=time.time())
                    self._write_behind(job.research_id)
                return
            await self._written(job.research_id)
            await self._mirror(job.research_id, "saving a job", lambda: self._save(job))
        else:
            await self.shared.attempt("saving a job", lambda: self._save(job))

    async def _save(self, job: Job) -> None:
        job = job.evolve(updated_at=time.time())
        keys = self._keys.all(job.research_id)
        ending = job.status.value if job.status.finished else ""
        if int(await self._save_script(keys=keys, args=[_dumps(job.to_json()), ending])) < 0:
            raise KeyError(job.research_id)

    async def append(self, research_id: str, frame: Frame) -> int:
        if research_id not in self.here:
            return await self.shared.attempt("adding a frame", lambda: self._append_one(research_id, frame))
        index = await self.here.append(research_id, frame)
        if research_id not in self._only_here:
            self._frames_due.setdefault(research_id, []).append(frame.text)
            self._write_behind(research_id)
        return index

    def _write_behind(self, research_id: str) -> None:
        if research_id not in self._only_here and research_id not in self._writing:
            loop = asyncio.get_running_loop()
            gathering = self._gathering[research_id] = loop.create_future()
            timer = loop.call_later(_GATHER_S, _resolve, gathering)
            self._writing[research_id] = loop.create_task(self._write_due(research_id, gathering, timer))

    async def _write_due(self, research_id: str, gathering: asyncio.Future[None], timer: asyncio.TimerHandle) -> None:
        try:
            await gathering
            while research_id in self._frames_due or research_id in self._meta_due:
                frames, job = self._frames_due.pop(research_id, []), self._meta_due.pop(research_id, None)
                ending = research_id in self._ending_due  # no frame can follow: this batch is the last
                record = self._record_due.pop(research_id, b"") if ending else b""
                write = functools.partial(self._write, research_id, frames, job, ending, record)
                await self._mirror(research_id, "adding frames", write)
                if ending:
                    if research_id in self._only_here:
                        self._ends_owed[research_id] = record
                    await self._report_settled(research_id, record)
        finally:
            timer.cancel()
            del self._writing[research_id], self._gathering[research_id]
            self._ending_due.discard(research_id)
            self._record_due.pop(research_id, None)

    async def _write(
        self, research_id: str, frames: builtins.list[str], job: Job | None, ending: bool, record: bytes = b""
    ) -> None:
        """One batch in one round trip (a script, not a pipeline: redis-py checks a pipeline's scripts
        with an extra SCRIPT EXISTS each time)."""
        meta = "" if job is None else _dumps(job.to_json())
        status = job.status.value if ending and job is not None else ""
        keys = self._keys.all(research_id)
        await self._write_behind_script(keys=keys, args=[meta, status, record, "", *frames])

    async def _written(self, research_id: str) -> None:
        """Wait until every frame and save of a job run here has reached Redis (or Redis failed)."""
        while (writing := self._writing.get(research_id)) is not None:
            await asyncio.shield(writing)

    async def _append_one(self, research_id: str, frame: Frame) -> int:
        index = int(await self._append(keys=self._keys.all(research_id)[:2], args=[frame.text]))
        if index < 0:
            raise ValueError(f"job {research_id} is finished: no frame may follow")
        return index

    async def frames(self, research_id: str, start: int = 0) -> builtins.list[Frame]:
        if research_id in self.here:
            return await self.here.frames(research_id, start)
        entries = await self.shared.attempt("reading frames", lambda: self._entries_from(research_id, start))
        # each as it was stored, so it is sent again as it was first sent
        return [decode(fields[b"f"].decode()) for _, fields in entries if b"f" in fields]

    async def _entries_from(self, research_id: str, start: int) -> builtins.list[tuple[bytes, dict[bytes, bytes]]]:
        entries = await self.redis.xrange(self._keys.frames(research_id), min=f"0-{start + 1}")
        return cast(builtins.list[tuple[bytes, dict[bytes, bytes]]], entries)

    async def wait(self, research_id: str, seen: int) -> bool:
        if research_id in self.here:
            return await self.here.wait(research_id, seen)
        while True:
            job = await self.get(research_id)
            if job is None:
                return False
            if job.status.finished:
                return True
            # entries after 0-seen: frame number `seen` or the end
            more = lambda: self.redis.xread({self._keys.frames(research_id): f"0-{seen}"}, count=1, block=_WAIT_MS)  # noqa: E731
            if await self.shared.attempt("waiting for a frame", more):
                return True

    async def finish(
        self,
        research_id: str,
        status: JobStatus,
        error: str | None = None,
        files: dict[str, str] | None = None,
        record: bytes | None = None,
    ) -> Job | None:
        if research_id in self.here:
            return await self._finish_here(
                research_id, status, error, files, record or self._reports_here.get(research_id)
            )
        found = await self.get(research_id)
        if found is None:
            return None
        if record:
            await self.shared.attempt("saving a report", lambda: self.redis.set(self._keys.record(research_id), record))
        progress = 1.0 if status is JobStatus.completed else found.progress
        await self.save(replace(found, status=status, error=error, files=files or found.files, progress=progress))
        return await self.get(research_id)

    async def _finish_here(
        self, research_id: str, status: JobStatus, error: str | None, files: dict[str, str] | None, record: bytes | None
    ) -> Job | None:
        job = await self.here.finish(research_id, status, error, files)
        if job is not None and research_id not in self._only_here:
            # the frames still gathering, the final state, the report and the stream's end: one
            # round trip, now
            self._meta_due[research_id] = job
            self._ending_due.add(research_id)
            if record:
                self._record_due[research_id] = record
            self._write_behind(research_id)
            _resolve(self._gathering[research_id])  # no more frames to wait for
        elif job is not None:  # Redis failed it, from its start or midway
            await self._written(research_id)
            # owed before anything a cancellation could cut short: a client closing its socket on
            # `path`, as GPT-Researcher's do, cancels the task finishing its job
            self._ends_owed[research_id] = record or b""
            self._retry_until_answered()
            await asyncio.shield(self._report_settled(research_id, record or b""))
            with contextlib.suppress(SharedDown):  # else the renewals of this worker's key try again
                await self.shared.attempt("writing a job's end", lambda: self._pay_end(research_id))
        await self._written(research_id)
        if job is not None and research_id not in self._only_here:
            asyncio.get_running_loop().call_later(self.keep_finished_s, self._forget, research_id)
        return job

    async def _pay_end(self, research_id: str) -> None:
        """Write to Redis what it missed of a job that ended here (its writes failed midway): the
        frames it lacks, the final state, the report, the end; for a job created while Redis failed,
        the job itself first (as running: should this worker die before its end follows, another
        ends it, as any job of a dead worker), so every worker lists it, resumes it, deletes it."""
        record = self._ends_owed.get(research_id)
        job = await self.here.get(research_id)
        if record is None or job is None:
            self._ends_owed.pop(research_id, None)
            return
        if research_id in self._never_in_redis:
            with contextlib.suppress(ValueError):  # there already: a research id is a fresh UUID
                await self._create(job.evolve(status=JobStatus.running))
            self._never_in_redis.discard(research_id)
        frames = [frame.text for frame in await self.here.frames(research_id)]
        args = [_dumps(job.evolve(updated_at=time.time()).to_json()), job.status.value, record, "1", *frames]
        keys = self._keys.all(research_id)
        written = int(await self._write_behind_script(keys=keys, args=args))
        if self._ends_owed.pop(research_id, None) is None:
            return  # deleted here meanwhile
        if written >= 0:
            log.info("job %s: its end, missed while Redis failed, is written", research_id)
        # Redis has the truth now: the job whole, or ended by another worker (-1), or deleted (-2)
        self._only_here.discard(research_id)
        asyncio.get_running_loop().call_later(self.keep_finished_s, self._forget, research_id)

    async def _report_settled(self, research_id: str, record: bytes) -> None:
        """The job's end was written, with its report, or Redis failed it: then the record goes where
        this host reads reports. Run by the writer (shielded) once the last batch is out, since a
        client closing its socket cancels the task that finishes the job while the batch is on its
        way; by `finish` itself for a job Redis had failed before its end (no batch to wait for)."""
        if research_id in self._only_here and record and self.reports_dir is not None:
            await asyncio.to_thread(save_report, self.reports_dir, research_id, record)
        self._reports_here.pop(research_id, None)

    async def keep_report(self, research_id: str, record: bytes) -> None:
        if research_id in self.here:
            self._reports_here[research_id] = record

    def _retry_until_answered(self) -> None:
        """Owed ends are paid with the renewals of this worker's key, which start with its first job
        in Redis: a worker that Redis failed from its first job on tries, a quarter lease apart,
        until Redis answers, then pays them and leaves the rest to those renewals."""
        if not self._ends_owed or (self._renewing is not None and not self._renewing.done()):
            return
        if self._retrying is not None and not self._retrying.done():
            return

        async def retry() -> None:
            while self._ends_owed and (self._renewing is None or self._renewing.done()):
                await asyncio.sleep(self._runner_lease_ms / 4000)
                with contextlib.suppress(*failures()):
                    await self._hold_runner_key()
                    for research_id in list(self._ends_owed):
                        await self._pay_end(research_id)

        self._retrying = asyncio.get_running_loop().create_task(retry())

    def _forget(self, research_id: str) -> None:
        """Drop a finished job's mirror (Redis has it all); readers still on it finish from Redis."""
        task = asyncio.get_running_loop().create_task(self.here.delete(research_id))
        self._forgetting.add(task)
        task.add_done_callback(self._forgetting.discard)

    async def records(self, research_ids: Sequence[str]) -> dict[str, bytes]:
        """The saved reports' records that Redis keeps, by research id (one MGET, or one per slot)."""
        here = {i: self._reports_here[i] for i in research_ids if i in self._reports_here}
        elsewhere = [i for i in research_ids if i not in here]
        if not elsewhere:
            return here
        stored = await self.shared.attempt(
            "reading reports", lambda: self._mget([self._keys.record(research_id) for research_id in elsewhere])
        )
        return here | {research_id: value for research_id, value in zip(elsewhere, stored, strict=True) if value}

    async def was_deleted(self, research_id: str) -> bool:
        when = await self.shared.attempt("reading deletions", lambda: self.redis.zscore(_DELETED, research_id))
        return when is not None

    async def deleted_since(self, since: float, skip: int = 0, limit: int = 10_000) -> builtins.list[tuple[str, float]]:
        """Jobs deleted at `since` or later (by the deleting worker's clock), oldest first, from the
        `skip`th on: (id, when)."""
        found = cast(
            builtins.list[tuple[bytes, float]],
            await self.shared.attempt(
                "reading deletions",
                lambda: self.redis.zrangebyscore(_DELETED, since, "+inf", start=skip, num=limit, withscores=True),
            ),
        )
        return [(member.decode(), float(score)) for member, score in found]

    def _fresher_here(self, job: Job) -> bool:
        """Whether this worker's mirror of a job it ran is newer than Redis's: while it runs, while
        its writes are on their way, and when Redis never had it. Once finished and written, Redis
        has the truth, which another worker may have changed since (a client's fields saved, the job
        deleted) while the mirror serves late followers."""
        research_id = job.research_id
        return not job.status.finished or research_id in self._only_here or research_id in self._writing

    async def get(self, research_id: str) -> Job | None:
        if research_id in self.here:
            job = await self.here.get(research_id)
            if job is None or self._fresher_here(job):
                return job
            with contextlib.suppress(SharedDown):
                return await self.shared.attempt("reading a job", lambda: self._get(research_id))
            return job
        return await self.shared.attempt("reading a job", lambda: self._get_settled(research_id))

    async def _get(self, research_id: str) -> Job | None:
        stored = await self.redis.get(self._keys.meta(research_id))
        return None if stored is None else Job.from_json(json.loads(stored))

    async def _get_settled(self, research_id: str) -> Job | None:
        job = await self._get(research_id)
        settled = await self._settled([job]) if job is not None else []
        return settled[0] if settled else None

    async def list(self, owner: str | None, everyone: bool = False, skip: int = 0) -> builtins.list[Job]:
        here = await self.here.list(owner, everyone)
        try:
            shared = await self.shared.attempt("listing jobs", lambda: self._list(owner, everyone, skip))
        except SharedDown:
            return here[skip:]
        jobs = {job.research_id: job for job in shared}
        # after the newest `skip`, this process's jobs only update those Redis listed: it cannot say
        # where among the newest a job it alone holds would fall
        jobs.update(
            (job.research_id, job) for job in here if self._fresher_here(job) and (not skip or job.research_id in jobs)
        )
        return sorted(jobs.values(), key=lambda job: job.created_at, reverse=True)

    async def _list(self, owner: str | None, everyone: bool, skip: int = 0) -> builtins.list[Job]:
        ids = cast(
            builtins.list[bytes], await self.redis.zrevrange(_EVERY_JOB if everyone else _owned_by(owner), skip, -1)
        )
        if not ids:
            return []
        stored = await self._mget([self._keys.meta(i.decode()) for i in ids])
        return await self._settled([Job.from_json(json.loads(value)) for value in stored if value is not None])

    async def delete(self, research_id: str) -> bool:
        return bool(await self.delete_many([research_id]))

    async def delete_many(self, research_ids: Sequence[str]) -> builtins.list[str]:
        """Jobs run here are deleted here whether or not Redis answers (as they were created);
        should Redis fail, any other job's deletion raises SharedDown, after those."""
        mine = [research_id for research_id in research_ids if research_id in self.here]
        for research_id in mine:
            await self._written(research_id)  # written behind: its pending writes go first
        in_redis = [research_id for research_id in research_ids if research_id not in self._only_here]
        deleted: builtins.list[str] = []
        try:
            if in_redis:
                deleted = await self.shared.attempt("deleting jobs", lambda: self._delete_many(in_redis))
        except SharedDown:
            if len(mine) < len(research_ids):
                raise
        finally:
            self._only_here.difference_update(mine)
            self._never_in_redis.difference_update(mine)
            for research_id in mine:
                self._ends_owed.pop(research_id, None)
            for research_id in mine:
                self._reports_here.pop(research_id, None)
            deleted += await self.here.delete_many(mine)
        return list(dict.fromkeys(deleted))

    async def _delete_many(self, research_ids: Sequence[str]) -> builtins.list[str]:
        """Two round trips whatever the count: retention deletes a busy user's jobs by the dozen, and
        at 140 tasks/s the oldest of 200 were still mirrored here and deleted one by one (one round
        trip a task)."""
        stored = await self._mget([self._keys.meta(research_id) for research_id in research_ids])
        found = [Job.from_json(json.loads(value)) for value in stored if value is not None]
        if not found:
            return []
        # on a cluster the jobs and lists sit in many slots, which no transaction spans: each DEL
        # (one job's keys, one slot) and ZREM is atomic on its own
        async with self.redis.pipeline(transaction=not self.shared.cluster) as pipe:
            for job in found:
                pipe.delete(*self._keys.all(job.research_id))
                pipe.zrem(_owned_by(job.owner), job.research_id)
            pipe.zrem(_EVERY_JOB, *(job.research_id for job in found))
            # remembered a while, so that every host drops the files it keeps of them (web/reports.py)
            now = time.time()
            pipe.zadd(_DELETED, {job.research_id: now for job in found})
            pipe.zremrangebyscore(_DELETED, "-inf", now - KEEP_DELETED_S)
            pipe.zremrangebyrank(_DELETED, 0, -_KEEP_DELETED - 1)
            await pipe.execute()
        return [job.research_id for job in found]

    async def _mget(self, keys: builtins.list[str]) -> builtins.list[bytes | None]:
        """The values of `keys`, in their order: one MGET, or on a cluster one per slot."""
        if self.shared.cluster:
            return cast(builtins.list[bytes | None], await self.redis.mget_nonatomic(keys))  # type: ignore[attr-defined]
        return cast(builtins.list[bytes | None], await self.redis.mget(keys))


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)
