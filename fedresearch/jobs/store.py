"""Research jobs: every task, WebSocket or REST, is a job with a `research_id`, an owner, a status,
its progress and the ordered list of frames it sent, so a client can leave and come back for them.

The state lives behind `JobStore`, a small async protocol, so it can be kept in this process
(`LocalJobStore`, local_store.py) or shared by several workers (`RedisJobStore`, redis_store.py):

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
  asked for (reports.py). `keep_report(id, record)`, awaited before the report is announced,
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

import builtins
import hashlib
import logging
import os
import re
import time
import uuid
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from fedresearch.core.auth import Principal
from fedresearch.core.lineage import alive
from fedresearch.jobs.frames import Frame

log = logging.getLogger("fedresearch")

JOB_ID = re.compile(r"[\w.:-]{1,128}")  # a file name too: no slash, so never outside the jobs folder


def client_entry_id(owner: str, client_id: str) -> str:
    """The id a report entry whose id its client chose (GPT-Researcher's page saves its history
    under ids such as `temp_id`) is kept under: one namespace per owner, so that one user's id never
    locks another out of the same id, and a 404 never tells whether another user holds it."""
    return "client-" + hashlib.sha256(f"{owner}\0{client_id}".encode()).hexdigest()[:32]


def shown_id(job: Job) -> str:
    """The id a client knows a job by: the one it chose for its own entries, else the research id."""
    chosen = job.client.get("id") if job.origin == "client" else None
    return chosen if isinstance(chosen, str) else job.research_id


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


def may_see(principal: Principal, job: Job | None) -> bool:
    """Admins see every job; a caller bound to a user sees that user's jobs only."""
    return job is not None and (principal.admin or (job.owner is not None and job.owner == principal.user_id))


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
