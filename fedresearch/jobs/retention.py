"""Retention: finished jobs and their reports go after REPORT_RETENTION_DAYS, and beyond each
user's newest REPORT_MAX_PER_USER."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from fedresearch.jobs.store import JobStore
from fedresearch.report.store import drop_reports

log = logging.getLogger("fedresearch")


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
