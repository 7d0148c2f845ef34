"""Saved reports, as the jobs that wrote them keep them: each readable by its owner and by admins only;
exports are rendered on first request (web/reports.py serves them under /reports/).

A report's JSON record is kept with its job by the job store: in the job's file (the workers of
one host share the jobs directory) or in Redis (several workers or hosts). A host fetches it into
its own reports directory when first asked for it and renders exports from it there; records
written there by earlier versions are read as they are. With Redis, the worker running a job
sends `path` before the job's end, the record with it, reaches Redis, and the client asks at once,
often another worker: a report asked for while its job runs on is waited for a moment. A job
deleted on one host (by its owner, or by retention) takes its report from every host: the store
remembers deletions for a day, and each host drops the files it keeps of them within a minute (at
once should one be asked for).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from fedresearch.core.auth import Principal
from fedresearch.core.redis import SharedDown, cancelled
from fedresearch.jobs.redis_store import KEEP_DELETED_S
from fedresearch.jobs.store import Job, JobStore, may_see
from fedresearch.report.exports import EXPORT_FORMATS
from fedresearch.report.render import ExportLimits
from fedresearch.report.store import delete_report, drop_reports, export, report_markdown, write_atomic

_SWEEP_EVERY_S = 60.0
_SWEEP_PAGE = 10_000
_CLOCK_SKEW_S = 60.0
# how long a report asked for while its job runs on is waited for (about 3 s in all): long enough for
# a job's end written behind under load, short for a client asking before the job is near its end
_END_PAUSES_S = (0.02, 0.05, 0.1, 0.2, 0.4, 0.8, 0.8, 0.8)

log = logging.getLogger("fedresearch")


class ExportGate:
    """The PDF and DOCX files one process makes at once: `processes` in all (EXPORT_PROCESSES), and
    one at a time for each user, so that a user asking for many waits for their own and never delays
    another's; each within `limits`."""

    def __init__(self, processes: int = 2, limits: ExportLimits | None = None) -> None:
        self.limits = limits or ExportLimits()
        self._all = asyncio.Semaphore(processes)
        self._users: dict[str, tuple[asyncio.Lock, list[int]]] = {}  # a user's lock, and how many want it

    @contextlib.asynccontextmanager
    async def slot(self, user: str) -> AsyncIterator[None]:
        lock, wanting = self._users.setdefault(user, (asyncio.Lock(), [0]))
        wanting[0] += 1
        try:
            async with lock, self._all:
                yield
        finally:
            wanting[0] -= 1
            if not wanting[0]:
                del self._users[user]


class SavedReports:
    """The saved reports of `jobs`, whichever host wrote them, read through `directory`; PDF and DOCX
    made through `gate` (a process's own: see Runtime)."""

    def __init__(self, directory: Path, jobs: JobStore, page: str = "A4", gate: ExportGate | None = None) -> None:
        self.directory = directory
        self.jobs = jobs
        self.page = page  # PDF and DOCX exports' page size (REPORT_PAGE_SIZE)
        self.gate = gate or ExportGate()

    async def fetch(self, research_ids: Sequence[str], reader: Principal | None = None) -> list[str]:
        """Copy into this host's directory the records it lacks that the job store keeps (one trip
        to Redis, or to a thread for the jobs' files, for them all); while Redis fails, what this
        host has is what there is. With `reader`, only those it may read: a refused request writes
        nothing. Returns the ids it still lacks."""
        if not research_ids:
            return []
        missing = await asyncio.to_thread(self._missing, research_ids)
        if not missing:
            return []
        try:
            records = await self.jobs.records(missing)
        except SharedDown:
            return missing
        if records:
            await asyncio.to_thread(self._keep, records, reader)
        return [research_id for research_id in missing if research_id not in records]

    async def fetch_of(self, job: Job) -> None:
        """`fetch` the report of a job the caller may see; one not there while the job runs on is
        waited for, up to about 3 s, until the job ends (with its report, or without)."""
        if not await self.fetch([job.research_id]) or job.status.finished:
            return
        for pause in _END_PAUSES_S:
            await asyncio.sleep(pause)
            try:
                now = await self.jobs.get(job.research_id)
            except SharedDown:
                return
            if now is None:
                return
            if now.status.finished:
                await self.fetch([job.research_id])
                return

    def _missing(self, research_ids: Sequence[str]) -> list[str]:
        return [i for i in research_ids if not os.path.exists(f"{self.directory}/{i}.json")]

    def _keep(self, records: dict[str, bytes], reader: Principal | None) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        for research_id, data in records.items():
            if reader is None or _may_read_record(reader, data):
                write_atomic(f"{self.directory}/{research_id}.json", data)

    async def markdowns(self, research_ids: Sequence[str]) -> dict[str, str | None]:
        """The reports' Markdown by research id (None: no such report), in one trip to a thread."""
        await self.fetch(research_ids)
        return await asyncio.to_thread(lambda: {i: report_markdown(self.directory, i) for i in research_ids})

    async def markdown(self, research_id: str) -> str | None:
        return (await self.markdowns([research_id]))[research_id]

    async def export(self, research_id: str, kind: str, user: str = "") -> Path | None:
        """The report's file of one format, rendered here if needed, for `user` (whose turn it takes);
        None when there is no report; ExportFailed, with why, when it cannot be made."""
        await self.fetch([research_id])
        form = EXPORT_FORMATS.get(kind)
        if (
            form is None
            or not form.apart
            or await asyncio.to_thread(os.path.isfile, self.directory / f"{research_id}.{kind}")
        ):
            return await asyncio.to_thread(export, self.directory, research_id, kind, self.page)
        async with self.gate.slot(user):
            return await asyncio.to_thread(export, self.directory, research_id, kind, self.page, self.gate.limits)

    async def record(self, research_id: str) -> dict[str, Any] | None:
        await self.fetch([research_id])
        path = self.directory / f"{research_id}.json"
        try:
            record = json.loads(await asyncio.to_thread(path.read_text, encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    async def question(self, research_id: str) -> str | None:
        """The question a report answers (its file is named after it): its job's task, else its
        record's, for a report whose job this host cannot read (Redis away, an earlier version's)."""
        with contextlib.suppress(SharedDown):
            job = await self.jobs.get(research_id)
            if job is not None:
                return job.task
        record = await self.record(research_id)
        question = record.get("question") if record is not None else None
        return question if isinstance(question, str) else None

    async def readable(self, principal: Principal, research_id: str) -> bool:
        """Whether `principal` may read this report (and it exists): its job says whose it is where
        this worker can read the job, else its record, fetched from the job store first. A job
        deleted on another host (by its owner or by retention) leaves this host's copy behind,
        which goes now rather than at the next sweep."""
        record = self.directory / f"{research_id}.json"
        with contextlib.suppress(SharedDown):  # Redis away: this host's own record decides
            # without Redis, a job another worker of the host ran is not here: its record decides
            job = await self.jobs.get(research_id)
            if job is not None and not may_see(principal, job):
                return False  # before its record is written here on a refused request's behalf
            if not self.jobs.shares_reports:
                await self.fetch([research_id], principal)
            elif job is not None:
                await self.fetch_of(job)
            elif await self.jobs.was_deleted(research_id):
                await asyncio.to_thread(delete_report, self.directory, research_id)
                return False
        return await asyncio.to_thread(may_read, principal, record)

    async def sweep(self, since: float) -> tuple[int, float]:
        """Remove this host's files of the reports whose jobs were deleted from `since` on, a page of
        ids at a time; returns how many reports had files here, and the latest deletion seen."""
        swept, latest, skip = 0, since, 0
        while deleted := await self.jobs.deleted_since(since, skip, _SWEEP_PAGE):
            swept += await asyncio.to_thread(self._drop, [research_id for research_id, _ in deleted])
            latest, skip = deleted[-1][1], skip + len(deleted)
            if len(deleted) < _SWEEP_PAGE:
                break
        return swept, latest

    def _drop(self, research_ids: list[str]) -> int:
        # a deletion is read again on the sweeps within the clock margin: a stat, not five unlinks
        return drop_reports(self.directory, research_ids)


@contextlib.asynccontextmanager
async def sweeping_leftovers(reports: SavedReports) -> AsyncIterator[None]:
    """With jobs shared by several hosts, drop every minute the files this host keeps of reports
    whose jobs were deleted elsewhere (at start, those of the day the store remembers)."""
    jobs = reports.jobs

    async def sweep() -> None:
        since = time.time() - KEEP_DELETED_S
        while True:
            try:
                swept, latest = await reports.sweep(since)
                since = max(since, latest - _CLOCK_SKEW_S)  # deletions are stamped by each host's clock
            except SharedDown:
                pass  # the shared state says so in the log; tried again next time
            except OSError as error:
                log.warning("could not sweep the reports folder: %s", error)
            else:
                if swept:
                    log.info("removed the files of %d reports deleted on other hosts", swept)
            await asyncio.sleep(_SWEEP_EVERY_S)

    sweeper = asyncio.create_task(sweep()) if jobs.shares_reports else None
    yield
    await cancelled(sweeper)


def may_read(principal: Principal, record: Path) -> bool:
    """Admins read every report; a key bound to a user reads the reports that user's tasks saved."""
    if principal.admin:
        return record.is_file()
    try:
        data = record.read_bytes()
    except OSError:
        return False
    return _may_read_record(principal, data)


def _may_read_record(principal: Principal, data: bytes) -> bool:
    if principal.admin:
        return True
    try:
        owner = json.loads(data).get("owner")
    except (ValueError, AttributeError):
        return False  # no readable record says whose it is: only an admin may read it
    return owner is not None and owner == principal.user_id
