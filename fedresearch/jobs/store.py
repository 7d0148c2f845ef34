"""Research jobs: every task, WebSocket or REST, is a job with a `research_id`, an owner, a status,
its progress and the ordered list of frames it sent, so a client can leave and come back for them.

The state lives behind `JobStore`, a small async protocol, so it can be kept in this process
(`LocalJobStore`, here) or shared by several workers (a Redis store implements the same methods):

- `create(job)`: register a new job (its frames start empty).
- `save(job)`: replace a job's metadata (status, progress, files, client fields); the frames are
  not touched. Saving a job in a finished status wakes its waiters, as `finish` does.
- `append(research_id, frame) -> int`: add one frame at the end; returns its index (0-based).
- `frames(research_id, start=0) -> list[Frame]`: the frames from index `start` on, in order.
- `wait(research_id, seen) -> bool`: return once the job has more than `seen` frames or is
  finished (at once if either is already true); False when there is no such job.
- `finish(research_id, status, error=None, files=None, record=None) -> Job | None`: the job ends in
  `status` (completed, failed or cancelled); waiters wake, and no frame is appended after it.
  `record` is its saved report's JSON, which the store keeps with the job: `records(ids)` reads it
  back, deleting the job deletes it, and the reports directory gets it only when the report is
  asked for (web/reports.py). `keep_report(id, record)`, awaited before the report is announced,
  makes it readable through `records` at once, before `finish` has written the job's end. A store
  shared by several hosts (`shares_reports`) remembers deletions for a day (`was_deleted(id)`,
  `deleted_since(t)`), so that every host drops the files it kept of them.
- `get(research_id) -> Job | None`, `list(owner, everyone=False, skip=0) -> list[Job]` (newest
  first; the jobs of `owner`, or every job when `everyone`; after the newest `skip`),
  `delete(research_id) -> bool`.

A reader that wants every frame exactly once reads by index: `follow` below is that loop
(replay from an index, then wait for more, until the job is finished and fully read).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import logging
import os
import re
import time
import uuid
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from fedresearch.core.lineage import alive, process_space
from fedresearch.core.work import QuickWrites, WorkPool, run_on
from fedresearch.report.store import drop_reports, write_atomic

log = logging.getLogger("fedresearch")

Frame = dict[str, Any]


class EncodedFrame(dict[str, Any]):
    """A frame that carries its JSON text, encoded once when it is emitted: sockets send that text
    and the job's file or Redis stores it, where each encoded the frame again (the job file's copy
    alone was 1.6% of the server's GIL samples under bench load). A frame is never changed once emitted."""

    __slots__ = ("text",)

    def __init__(self, frame: Frame) -> None:
        super().__init__(frame)
        self.text = json.dumps(frame, ensure_ascii=False)


def error_frames(message: str, metadata: dict[str, Any] | None = None) -> list[Frame]:
    """An error as a job's frames say it: GPT-Researcher's page shows only logs frames, so both ways."""
    return [
        {"type": "error", "content": "error", "output": message},
        {"type": "logs", "content": "error", "output": message, "metadata": metadata},
    ]


def frame_text(frame: Frame) -> str:
    return frame.text if isinstance(frame, EncodedFrame) else json.dumps(frame, ensure_ascii=False)


JOB_ID = re.compile(r"[\w.:-]{1,128}")  # a file name too: no slash, so never outside the jobs folder


class JobStatus(StrEnum):
    queued = "queued"
    running = "running"
    completed = "completed"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def finished(self) -> bool:
        return self in _FINISHED  # a set: the tuple compared members one by one (0.9 µs, ~50 calls a task)


_FINISHED = frozenset({JobStatus.completed, JobStatus.failed, JobStatus.cancelled})


@dataclass(frozen=True)
class Job:
    """What is known about one task besides its frames. `research_id` is also its report's id."""

    research_id: str
    owner: str | None  # the user whose key asked (None: no user, readable by admins only)
    task: str
    report_type: str = "research_report"
    origin: str = "websocket"  # websocket | rest | client (a report a client saved through /api/reports)
    detached: bool = False
    status: JobStatus = JobStatus.queued
    progress: float = 0.0  # 0..1
    created_at: float = field(default_factory=time.time)  # Unix seconds
    updated_at: float = field(default_factory=time.time)
    error: str | None = None
    files: dict[str, str] = field(default_factory=dict)  # format -> URL path, as in the `path` frame
    client: dict[str, Any] = field(default_factory=dict)  # GPT-Researcher's orderedData, chatMessages...
    runner: str | None = None  # the worker running it, in a store several share (redis_jobs.py)
    # what a chat about its report searches again, wherever it is asked (planning.scope_of: no keys)
    scope: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        # not asdict: it deep-copies every value (49 µs a job, against 1.6 µs); the dicts are
        # replaced, never changed in place, so a copy of each is enough
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["files"], data["client"], data["scope"] = dict(self.files), dict(self.client), dict(self.scope)
        return data

    def evolve(self, **changes: Any) -> Job:
        """A copy with `changes`, as `dataclasses.replace` makes one but without running `__init__`
        again: 2 µs against 8 µs, and a job was copied 14 times a task (each progress step twice)."""
        unknown = changes.keys() - self.__dataclass_fields__.keys()
        if unknown:
            raise TypeError(f"Job has no field {', '.join(sorted(unknown))}")
        copy = object.__new__(type(self))
        copy.__dict__.update(self.__dict__, **changes)  # frozen: its __setattr__ refuses, its dict does not
        return copy

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Job:
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        return cls(**{**known, "status": JobStatus(known.get("status", "queued"))})


class JobStore(Protocol):
    """Where jobs and their frames live (module docstring: what each method promises)."""

    async def create(self, job: Job) -> None: ...

    async def save(self, job: Job) -> None: ...

    async def append(self, research_id: str, frame: Frame) -> int: ...

    async def frames(self, research_id: str, start: int = 0) -> builtins.list[Frame]: ...

    async def wait(self, research_id: str, seen: int) -> bool: ...

    shares_reports: bool

    async def finish(
        self,
        research_id: str,
        status: JobStatus,
        error: str | None = None,
        files: dict[str, str] | None = None,
        record: bytes | None = None,
    ) -> Job | None: ...

    async def keep_report(self, research_id: str, record: bytes) -> None: ...

    async def records(self, research_ids: Sequence[str]) -> dict[str, bytes]: ...

    async def was_deleted(self, research_id: str) -> bool: ...

    async def deleted_since(
        self, since: float, skip: int = 0, limit: int = 10_000
    ) -> builtins.list[tuple[str, float]]: ...

    async def get(self, research_id: str) -> Job | None: ...

    async def list(self, owner: str | None, everyone: bool = False, skip: int = 0) -> builtins.list[Job]: ...

    async def delete(self, research_id: str) -> bool: ...

    async def delete_many(self, research_ids: Sequence[str]) -> builtins.list[str]:
        """Delete these jobs, in one trip to wherever they are kept; returns the ids that existed."""
        ...


async def follow(store: JobStore, research_id: str, start: int = 0) -> AsyncGenerator[Frame, None]:
    """Every frame of a job from index `start`, each once and in order: first those already sent,
    then the new ones as they come, until the job is finished and all its frames are read."""
    seen = start
    while True:
        batch = await store.frames(research_id, seen)
        for frame in batch:
            yield frame
        seen += len(batch)
        if batch:
            continue
        job = await store.get(research_id)
        if job is None or job.status.finished:
            for frame in await store.frames(research_id, seen):  # appended between the read and the check
                yield frame
            return
        await store.wait(research_id, seen)


def runner_id(space: str) -> str:
    """A worker as the jobs it runs name it: a token, and where `space` (core/lineage.py) allows,
    its space and pid, so that a worker of the same space tells a dead one by its pid at once (the
    supervisor replaces a killed worker within a second)."""
    token = uuid.uuid4().hex
    return f"{token}@{space}:{os.getpid()}" if space else token


def _pid_in(runner: str | None, space: str) -> int | None:
    """The pid of the worker `runner` names, when it ran in `space` (else no pid of ours)."""
    where, _, pid = (runner or "").partition("@")[2].rpartition(":")
    return int(pid) if space and where == space and pid.isdigit() else None


def died_here(runner: str, space: str) -> bool:
    """Whether the worker `runner` names ran in `space` and its process is gone (a pid reused since
    reads as alive)."""
    pid = _pid_in(runner, space)
    return pid is not None and not alive(pid)


def sibling_runs(runner: str | None, space: str) -> bool:
    """Whether `runner` names another process of `space` that is alive (this process's own pid in it
    names an earlier process that had the pid: a server restarted as a container's PID 1)."""
    pid = _pid_in(runner, space)
    return pid is not None and pid != os.getpid() and alive(pid)


@dataclass
class _Entry:
    job: Job
    frames: list[Frame] | None  # None: a finished job's frames, on disk only (LocalJobStore.frames_kept_s)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    frames_saved: bool = False  # its frames are in its file (and kept in memory a moment longer)
    report: bytes | None = None  # its saved report's record, while its frames are in memory too
    report_saved: bool = False  # the record is in its file

    def wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def forget_frames(self) -> None:
        if self.frames_saved:
            self.frames = None
            if self.report_saved:
                self.report = None


class LocalJobStore:
    """Jobs in this process, each written to one file in `directory`, `<id>.job.jsonl`: a line with
    the job's state when it is created, its saved report's record before the report is announced,
    and when it finishes its frames and its final state appended in one write (a line is
    `{"job": state}`, `{"report": record}` or `{"frame": frame}`; the last state line wins), so
    listing, replaying and reading its report survive a restart. A job that was running when the
    process died is found failed at `load`. The workers of `serve --workers N` without Redis share
    the folder, so each reads the others' reports from it.

    One file a job, only ever appended to, its report in it: every file created is an inode
    allocated and every file replaced or deleted one freed, and ext4 without a journal skips each
    inode freed in the last minute one by one when it allocates the next. Written as a state file
    replaced at the end plus a frames file, a job cost three allocations and a free; with the
    report's two files and retention deleting them all, inode allocation took a fifth of the
    server's CPU in one profiled run (README); with the report's record in a file of its own, 13%.
    The reports directory gets the record when the report is first asked for (web/reports.py).
    Directories written by earlier versions (`<id>.json` and `<id>.frames.jsonl`) are converted at
    `load`."""

    shares_reports = False  # its workers share one host, and so the jobs and reports directories

    def __init__(self, directory: Path | None, work: WorkPool | None = None) -> None:
        self.directory = directory
        self.work = work  # the threads its files are removed on (None: asyncio's default pool)
        self._appends = QuickWrites(work)  # on the loop while the disk is quick
        # how long a finished job's frames stay in memory as well: its followers, often a few frames
        # behind when it ends, catch up from there and not by reading its file back on a thread
        self.frames_kept_s = 2.0
        self._entries: dict[str, _Entry] = {}
        self._writing = asyncio.Lock()  # one write at a time, so an older state never lands last
        self._space = process_space()
        self.runner = runner_id(self._space)  # this process, as the jobs it runs name it

    def __contains__(self, research_id: object) -> bool:
        return research_id in self._entries

    async def load(self) -> int:
        """Read the jobs saved by earlier runs; returns how many. A job still running in another
        live worker of this machine (`serve --workers N` without Redis, whose workers share the
        folder) is left to it: a worker replaced or reloaded marked its siblings' running jobs
        failed, in their files, while they ran on."""
        if self.directory is None:
            return 0
        found = await asyncio.to_thread(_read_saved, self.directory)
        for job in found:
            if not job.status.finished and sibling_runs(job.runner, self._space):
                continue  # another worker's (serve --workers N without Redis), running: it ends it
            cut_short = not job.status.finished
            if cut_short:
                job = replace(job, status=JobStatus.failed, error="the server stopped while this job ran")
            self._entries.setdefault(job.research_id, _Entry(job, None))
            if cut_short:  # its last write may have been cut mid-line: the state starts a line of its own
                await self._write_meta(job, fresh_line=True)
        return len(found)

    async def create(self, job: Job) -> None:
        if job.research_id in self._entries:
            raise ValueError(f"job {job.research_id} exists")
        if job.runner is None:
            job = job.evolve(runner=self.runner)
        self._entries[job.research_id] = _Entry(job, [])
        await self._write_meta(job)

    async def save(self, job: Job) -> None:
        entry = self._entries.get(job.research_id)
        if entry is None:
            raise KeyError(job.research_id)
        entry.job = job.evolve(updated_at=time.time())
        if job.status.finished or job.origin == "client":
            await self._write_meta(entry.job)
        if job.status.finished:
            entry.wake()

    async def append(self, research_id: str, frame: Frame) -> int:
        entry = self._entries[research_id]
        if entry.job.status.finished:
            raise ValueError(f"job {research_id} is finished: no frame may follow")
        assert entry.frames is not None  # an unfinished job keeps its frames in memory
        entry.frames.append(frame)
        entry.wake()
        return len(entry.frames) - 1

    async def frames(self, research_id: str, start: int = 0) -> list[Frame]:
        entry = self._entries.get(research_id)
        if entry is None:
            return []
        if entry.frames is None:
            if self.directory is None:
                return []
            return (await asyncio.to_thread(_read_frames, Path(_job_path(self.directory, research_id))))[start:]
        return entry.frames[start:]

    async def wait(self, research_id: str, seen: int) -> bool:
        entry = self._entries.get(research_id)
        if entry is None:
            return False
        if entry.job.status.finished or entry.frames is None or len(entry.frames) > seen:
            return True
        await entry.changed.wait()
        return True

    async def finish(
        self,
        research_id: str,
        status: JobStatus,
        error: str | None = None,
        files: dict[str, str] | None = None,
        record: bytes | None = None,
    ) -> Job | None:
        entry = self._entries.get(research_id)
        if entry is None:
            return None
        progress = 1.0 if status is JobStatus.completed else entry.job.progress
        files = files or entry.job.files
        entry.job = entry.job.evolve(status=status, error=error, files=files, progress=progress, updated_at=time.time())
        if record and entry.report is None:
            entry.report = record  # a report never announced (its job cancelled meanwhile) is kept all the same
        if self.directory is not None and entry.frames is not None and not entry.frames_saved:
            report = entry.report if not entry.report_saved else None
            await self._write_meta(entry.job, entry.frames, report=report)
            entry.frames_saved = True
            # on disk now; memory holds running jobs' frames and those of jobs that just finished
            asyncio.get_running_loop().call_later(self.frames_kept_s, entry.forget_frames)
        else:
            await self._write_meta(entry.job)
        entry.wake()
        return entry.job

    async def keep_report(self, research_id: str, record: bytes) -> None:
        """The record goes into the job's file before the report is announced: a client that reads
        `path` may ask any worker of this host for it at once."""
        entry = self._entries.get(research_id)
        if entry is None:
            return
        entry.report = record
        if self.directory is None:
            return  # in memory alone, as its frames are
        async with self._writing:
            if self._entries.get(research_id) is not entry:
                return  # deleted meanwhile: writing it now would bring it back
            await self._appends.run(_append, self.directory, research_id, _report_line(record))
        entry.report_saved = True

    async def records(self, research_ids: Sequence[str]) -> dict[str, bytes]:
        """The records of these jobs' reports: from memory for a job that just ended here, else
        from the jobs' files (this worker's or another's of this host), in one trip to a thread."""
        found: dict[str, bytes] = {}
        unread = []
        for research_id in research_ids:
            entry = self._entries.get(research_id)
            if entry is not None and entry.report is not None:
                found[research_id] = entry.report
            elif JOB_ID.fullmatch(research_id):
                unread.append(research_id)
        if unread and self.directory is not None:
            found |= await asyncio.to_thread(_read_reports, self.directory, unread)
        return found

    async def was_deleted(self, research_id: str) -> bool:
        return False  # its reports are deleted with it, here

    async def deleted_since(self, since: float, skip: int = 0, limit: int = 10_000) -> builtins.list[tuple[str, float]]:
        return []

    async def get(self, research_id: str) -> Job | None:
        entry = self._entries.get(research_id)
        return entry.job if entry is not None else None

    async def list(self, owner: str | None, everyone: bool = False, skip: int = 0) -> list[Job]:
        jobs = [e.job for e in self._entries.values() if everyone or e.job.owner == owner]
        return sorted(jobs, key=lambda job: job.created_at, reverse=True)[skip:]

    async def delete(self, research_id: str) -> bool:
        return bool(await self.delete_many([research_id]))

    async def delete_many(self, research_ids: Sequence[str]) -> builtins.list[str]:
        gone = []
        for research_id in research_ids:
            entry = self._entries.pop(research_id, None)
            if entry is not None:
                entry.wake()
                gone.append(research_id)
        if gone and self.directory is not None:
            async with self._writing:
                await run_on(self.work, _remove, self.directory, gone)
        return gone

    async def _write_meta(
        self,
        job: Job,
        frames: builtins.list[Frame] | None = None,
        *,
        report: bytes | None = None,
        fresh_line: bool = False,
    ) -> None:
        """Append the job's latest state, and with `frames` its frames before it, and with `report`
        its report's record before them (one write)."""
        if self.directory is None:
            return
        async with self._writing:
            entry = self._entries.get(job.research_id)
            if entry is None:
                return  # deleted meanwhile: writing it now would bring it back
            lines = _record_lines(entry.job.to_json(), frames).encode()
            data = (b"\n" if fresh_line else b"") + (_report_line(report) if report else b"") + lines
            await self._appends.run(_append, self.directory, job.research_id, data)
            if report is not None:
                entry.report, entry.report_saved = report, True


_JOB_SUFFIX = ".job.jsonl"
_STATE_LINE = b'{"job":'
_REPORT_LINE = b'{"report": '
# where a job's latest state is looked for: its file's last 4 KiB (a state line is about 600 bytes),
# then 64 KiB, then all of it; a finished job's frames come before it and are not read at start-up
_TAILS = (4 * 1024, 64 * 1024)


def _job_path(directory: Path, research_id: str) -> str:
    # a string: building a Path and turning it back into one cost 5 µs, a few times a task
    return f"{directory}/{research_id}{_JOB_SUFFIX}"


def _report_line(record: bytes) -> bytes:
    # the record's JSON as it is: json.dumps escapes newlines, so it is one line
    return b"%s%s}\n" % (_REPORT_LINE, record)


def _record_lines(meta: dict[str, Any], frames: list[Frame] | None) -> str:
    # frames before the state that says the job finished, which promises them
    lines = [f'{{"frame": {frame_text(frame)}}}' for frame in frames or ()]
    lines.append(json.dumps({"job": meta}, ensure_ascii=False))
    return "\n".join(lines) + "\n"


def _append(directory: Path, research_id: str, data: bytes) -> None:
    path, flags = _job_path(directory, research_id), os.O_WRONLY | os.O_APPEND | os.O_CREAT
    try:
        descriptor = os.open(path, flags, 0o644)
    except FileNotFoundError:  # no folder yet: made on the first write, not checked at every one
        directory.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, flags, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(descriptor, view) :]
    finally:
        os.close(descriptor)


def _latest_state(data: bytes) -> dict[str, Any] | None:
    """The last state line in `data` that reads whole (a write cut short by a crash leaves a torn
    last line, and the state before it stands)."""
    for line in reversed(data.split(b"\n")):
        if line.startswith(_STATE_LINE):
            try:
                state = json.loads(line)["job"]
            except ValueError:
                continue
            if isinstance(state, dict):
                return state
    return None


def _read_job(path: Path) -> Job | None:
    with open(path, "rb") as file:
        size = file.seek(0, os.SEEK_END)
        for tail in (*_TAILS, size):
            start = max(0, size - tail)
            file.seek(start)
            state = _latest_state(file.read())
            if state is not None or start == 0:
                break
    return Job.from_json(state) if state is not None else None


def _read_saved(directory: Path) -> list[Job]:
    if not directory.is_dir():
        return []
    _convert_earlier_records(directory)
    jobs = []
    for path in directory.glob(f"*{_JOB_SUFFIX}"):
        try:
            job = _read_job(path)
        except (OSError, ValueError, TypeError, AttributeError) as error:
            log.warning("job record %s is unreadable and was skipped: %s", path.name, error)
            continue
        if job is None:
            log.warning("job record %s holds no readable state and was skipped", path.name)
            continue
        if job.research_id == path.name[: -len(_JOB_SUFFIX)] and JOB_ID.fullmatch(job.research_id):
            jobs.append(job)
    return jobs


def _convert_earlier_records(directory: Path) -> None:
    """Earlier versions kept `<id>.json` (the state, replaced on every change) and, once finished,
    `<id>.frames.jsonl`: each pair becomes one `<id>.job.jsonl`, written whole before the pair is
    removed (a crash in between leaves both, and the next start removes the pair)."""
    for path in directory.glob("*.json"):
        research_id = path.stem
        frames_path = directory / f"{research_id}.frames.jsonl"
        target = Path(_job_path(directory, research_id))
        if not target.exists():
            try:
                meta = json.loads(path.read_text(encoding="utf-8"))
                if not isinstance(meta, dict) or meta.get("research_id") != research_id:
                    raise TypeError("not the state of a job by this name")
                frames = _read_earlier_frames(frames_path)
            except (OSError, ValueError, TypeError) as error:
                log.warning("job record %s is unreadable and was left as it is: %s", path.name, error)
                continue
            write_atomic(target, _record_lines(meta, frames).encode())
        for done in (frames_path, path):
            with contextlib.suppress(FileNotFoundError):
                done.unlink()


def _read_earlier_frames(path: Path) -> list[Frame]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.split("\n") if line]  # not splitlines: U+2028 is in lines


def _read_frames(path: Path) -> list[Frame]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    frames = []
    for line in data.split(b"\n"):
        if line.startswith(b'{"frame":'):
            try:
                frames.append(json.loads(line)["frame"])
            except ValueError:
                continue  # torn by a crash mid-write: the frames before it stand
    return frames


def _read_reports(directory: Path, research_ids: Sequence[str]) -> dict[str, bytes]:
    found = {}
    for research_id in research_ids:
        try:
            data = Path(_job_path(directory, research_id)).read_bytes()
        except FileNotFoundError:
            continue
        for line in data.split(b"\n"):
            if line.startswith(_REPORT_LINE):
                record = line[len(_REPORT_LINE) : -1]
                try:
                    json.loads(record)
                except ValueError:
                    continue  # torn by a crash mid-write
                found[research_id] = record
                break
    return found


def _remove(directory: Path, research_ids: Sequence[str]) -> None:
    for research_id in research_ids:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_job_path(directory, research_id))


async def enforce_retention(
    store: JobStore,
    reports_dir: Path,
    retention_days: float,
    max_per_user: int,
    owner: str | None = None,
    keep: int | None = None,
    kept_out: dict[str | None, int] | None = None,
) -> list[str]:
    """Delete finished jobs (and their report files) older than `retention_days` (0: no age limit),
    and beyond the newest `max_per_user` of each owner (0: no count limit; `keep`, when given, is
    kept instead); running jobs are kept. With `owner`, only that owner's jobs are looked at.
    Returns the deleted research ids; `kept_out` receives each owner's finished jobs left.

    With `keep` (a finished job's pass over its owner's jobs, `RetentionPace`; the owner None on a
    server without keys), only the jobs after the owner's newest `keep` are read, running ones
    counted among those kept, and those of them that are finished go; their age is the hourly
    sweep's to check. Reading all of a busy user's jobs at each pass (221 in Redis: 12.8 against 7.9
    ms of CPU a pass, the 41 deletions included) held the event loop while it parsed them, and the
    list grows with every worker's jobs between one worker's passes."""
    if keep is not None and max_per_user > 0:
        beyond = await store.list(owner, skip=keep)
        doomed = [job.research_id for job in beyond if job.status.finished]
        if kept_out is not None:
            kept_out[owner] = keep if beyond else min(keep, len(await store.list(owner)))
        return await _delete(store, reports_dir, doomed)
    jobs = await store.list(owner, everyone=owner is None)
    cutoff = time.time() - retention_days * 86400 if retention_days > 0 else None
    kept: dict[str | None, int] = {}
    doomed = []
    for job in jobs:  # newest first
        if not job.status.finished:
            continue
        kept[job.owner] = kept.get(job.owner, 0) + 1
        too_old = cutoff is not None and job.created_at < cutoff
        if too_old or (max_per_user > 0 and kept[job.owner] > max_per_user):
            doomed.append(job.research_id)
    if kept_out is not None:  # before deleting: jobs that finish meanwhile are counted on top
        kept_out.update({who: min(count, max_per_user) if max_per_user > 0 else count for who, count in kept.items()})
    return await _delete(store, reports_dir, doomed)


async def _delete(store: JobStore, reports_dir: Path, doomed: list[str]) -> list[str]:
    if doomed:
        await delete_with_reports(store, reports_dir, doomed)
        log.info("retention: deleted %d finished jobs and their reports", len(doomed))
    return doomed


async def delete_with_reports(store: JobStore, reports_dir: Path, research_ids: list[str]) -> None:
    """Delete jobs and their reports' files here: the files, the jobs, then the files again. A
    process killed between the jobs and their files left a deleted report readable from its file
    for ever (no job says it is gone); killed now, the jobs are still there, to be deleted again,
    their records read back from them. The second pass drops a record fetched from a job in the
    meantime."""
    await asyncio.to_thread(drop_reports, reports_dir, research_ids)
    await store.delete_many(research_ids)
    await asyncio.to_thread(drop_reports, reports_dir, research_ids)


class RetentionPace:
    """When a finished job runs its owner's retention pass. The pass lists every job of the owner,
    so running it after every job cost a sixth of the server's CPU for a busy user: it runs when
    the owner may have passed REPORT_MAX_PER_USER, and then keeps a tenth less (never more than the
    limit), so a busy user's next pass comes that many jobs later. Age limits are the hourly sweep's.
    Counts are this process's: another worker's jobs are seen at this one's next pass."""

    def __init__(self, max_per_user: int) -> None:
        self.max_per_user = max_per_user
        self.keep = max_per_user - max_per_user // 10
        self.counts: dict[str | None, int] = {}
        # one pass per owner at a time: passes started while one ran listed and deleted the same
        # jobs again, 7 passes per finished job under load (7 ms of CPU per task)
        self.running: set[str | None] = set()

    def due(self, owner: str | None) -> bool:
        """Whether a pass for `owner` should start now; if so, call `done` when it ends."""
        if self.max_per_user <= 0:
            return False
        if owner in self.counts:
            self.counts[owner] += 1
        if owner in self.running:
            return False
        if owner not in self.counts or self.counts[owner] > self.max_per_user:
            self.running.add(owner)
            return True
        return False

    def done(self, owner: str | None) -> None:
        self.running.discard(owner)
