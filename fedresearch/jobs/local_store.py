"""Jobs kept by this process (`LocalJobStore`), each in one file of the jobs folder that the
workers of one host share; a `JobStore` (store.py)."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

from fedresearch.core.lineage import process_space
from fedresearch.core.work import QuickWrites, WorkPool, run_on
from fedresearch.jobs.frames import Frame, decode
from fedresearch.jobs.store import JOB_ID, Job, JobStatus, runner_id, sibling_runs
from fedresearch.report.store import write_atomic

log = logging.getLogger("fedresearch")


@dataclass
class _Entry:
    job: Job
    frames: list[Frame] | None  # None: a finished job's frames, on disk only (LocalJobStore.frames_kept_s)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    frames_saved: bool = False  # its frames are in its file (and kept in memory a moment longer)
    report: bytes | None = None  # its saved report's record, while its frames are in memory too
    report_saved: bool = False  # the record is in its file
    # its client's chat messages in its file (chat lines, `_chat_lines`), and the state line last
    # written without them: a message appended costs a line of its own size, not the whole state
    chat_written: int = 0
    chat_prefix: list[Any] = field(default_factory=list)  # the messages written (the same objects)
    state_written: bytes = b""  # a digest of it

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
    `{"job": state}`, `{"report": record}` or `{"frame": frame}`; the last state line wins; a
    client's chat messages are lines of their own, `{"chat": [new messages], ...}`), so
    listing, replaying and reading its report survive a restart. A job that was running when the
    process died is found failed at `load`. The workers of `serve --workers N` without Redis share
    the folder, so each reads the others' reports from it.

    One file a job, only ever appended to, its report in it: every file created is an inode
    allocated and every file replaced or deleted one freed, and ext4 without a journal skips each
    inode freed in the last minute one by one when it allocates the next. Written as a state file
    replaced at the end plus a frames file, a job cost three allocations and a free; with the
    report's two files and retention deleting them all, inode allocation took a fifth of the
    server's CPU in one profiled run (docs/benchmarks.md); with the report's record in a file of its own, 13%.
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
        for job, chat_in_lines in found:
            if not job.status.finished and sibling_runs(job.runner, self._space):
                continue  # another worker's (serve --workers N without Redis), running: it ends it
            cut_short = not job.status.finished
            if cut_short:
                job = replace(job, status=JobStatus.failed, error="the server stopped while this job ran")
            entry = self._entries.setdefault(job.research_id, _Entry(job, None))
            messages = job.client.get("chatMessages")
            if chat_in_lines and isinstance(messages, list):  # else written with the state: not yet in lines
                entry.chat_written, entry.chat_prefix = len(messages), messages
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
            chat, state = _chat_lines(entry, entry.job.to_json(), force_state=bool(frames) or fresh_line)
            lines = _record_lines(state, [frame.text for frame in frames or ()]).encode() if state else b""
            data = (b"\n" if fresh_line else b"") + (_report_line(report) if report else b"") + chat + lines
            if not data:
                return
            await self._appends.run(_append, self.directory, job.research_id, data)
            if report is not None:
                entry.report, entry.report_saved = report, True


_JOB_SUFFIX = ".job.jsonl"
_STATE_LINE = b'{"job":'
_FRAME_LINE = b'{"frame": '
_REPORT_LINE = b'{"report": '
_CHAT_LINE = b'{"chat'
# where a job's latest state is looked for: its file's last 4 KiB (a state line is about 600 bytes),
# then 64 KiB, then all of it; a finished job's frames come before it and are not read at start-up
_TAILS = (4 * 1024, 64 * 1024)


def _job_path(directory: Path, research_id: str) -> str:
    # a string: building a Path and turning it back into one cost 5 µs, a few times a task
    return f"{directory}/{research_id}{_JOB_SUFFIX}"


def _report_line(record: bytes) -> bytes:
    # the record's JSON as it is: json.dumps escapes newlines, so it is one line
    return b"%s%s}\n" % (_REPORT_LINE, record)


def _record_lines(meta: dict[str, Any] | None, frames: list[str]) -> str:
    # frames (their texts) before the state that says the job finished, which promises them
    lines = [f'{{"frame": {frame}}}' for frame in frames]
    if meta is not None:
        lines.append(json.dumps({"job": meta}, ensure_ascii=False))
    return "\n".join(lines) + "\n"


def _chat_lines(entry: _Entry, meta: dict[str, Any], force_state: bool) -> tuple[bytes, dict[str, Any] | None]:
    """The chat line a state needs (the messages new since the last written, or all of them when
    they were replaced), and the state to write without them: None when nothing else changed.
    A chat of 150 messages of 60 KB, each saved with the whole state, made a 680 MB file."""
    client = dict(meta["client"])
    messages = client.pop("chatMessages", None)
    messages = messages if isinstance(messages, list) else []
    written = entry.chat_written
    moment = {"updated_at": meta["updated_at"], "timestamp": client.get("timestamp")}
    if len(messages) == written and _kept_prefix(entry, messages):
        chat = b""
    elif len(messages) > written and _kept_prefix(entry, messages):
        chat = _chat_line({"chat": messages[written:], **moment})
    else:
        chat = _chat_line({"chat_all": messages, **moment})
    entry.chat_written, entry.chat_prefix = len(messages), messages
    state = {**meta, "client": client, "chat_lines": True}
    unchanged = {**state, "updated_at": None, "client": {**client, "timestamp": None}}
    text = json.dumps(unchanged, ensure_ascii=False, sort_keys=True, default=str).encode()
    stamp = hashlib.blake2b(text, digest_size=16).digest()
    if chat and stamp == entry.state_written and not force_state:
        return chat, None  # only the chat changed: its line says when
    entry.state_written = stamp
    return chat, state


def _kept_prefix(entry: _Entry, messages: list[Any]) -> bool:
    """Whether `messages` extends those written (a message appended, not the history replaced)."""
    return entry.chat_prefix == messages[: entry.chat_written]


def _chat_line(value: dict[str, Any]) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode() + b"\n"


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


def _read_job(path: Path) -> tuple[Job, bool] | None:
    """The job a file holds, and whether its chat messages are in chat lines."""
    with open(path, "rb") as file:
        size = file.seek(0, os.SEEK_END)
        for tail in (*_TAILS, size):
            start = max(0, size - tail)
            file.seek(start)
            state = _latest_state(file.read())
            if state is not None or start == 0:
                break
        if state is None:
            return None
        chat_in_lines = bool(state.get("chat_lines"))
        if chat_in_lines:
            file.seek(0)
            state = _with_chat(state, file)
    return Job.from_json(state), chat_in_lines


def _with_chat(state: dict[str, Any], file: BinaryIO) -> dict[str, Any]:
    """`state` with the chat its file's chat lines hold (a line cut short by a crash left out), and
    the time of the last of them. Other lines are passed over unread."""
    messages: list[Any] | None = None
    updated_at, timestamp = state.get("updated_at"), state.get("client", {}).get("timestamp")
    for line in file:
        if not line.startswith(_CHAT_LINE):
            continue
        try:
            chat = json.loads(line)
        except ValueError:
            continue
        if not isinstance(chat, dict):
            continue
        if isinstance(chat.get("chat_all"), list):
            messages = list(chat["chat_all"])
        elif isinstance(chat.get("chat"), list):
            messages = messages if messages is not None else []
            messages.extend(chat["chat"])
        else:
            continue
        if isinstance(chat.get("updated_at"), (int, float)) and chat["updated_at"] > (updated_at or 0):
            updated_at, timestamp = chat["updated_at"], chat.get("timestamp", timestamp)
    if messages is None:
        return state
    client = {**state.get("client", {}), "chatMessages": messages}
    if timestamp is not None:
        client["timestamp"] = timestamp
    return {**state, "client": client, "updated_at": updated_at}


def _read_saved(directory: Path) -> list[tuple[Job, bool]]:
    if not directory.is_dir():
        return []
    _convert_earlier_records(directory)
    jobs = []
    for path in directory.glob(f"*{_JOB_SUFFIX}"):
        try:
            read = _read_job(path)
        except (OSError, ValueError, TypeError, AttributeError) as error:
            log.warning("job record %s is unreadable and was skipped: %s", path.name, error)
            continue
        if read is None:
            log.warning("job record %s holds no readable state and was skipped", path.name)
            continue
        if read[0].research_id == path.name[: -len(_JOB_SUFFIX)] and JOB_ID.fullmatch(read[0].research_id):
            jobs.append(read)
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


def _read_earlier_frames(path: Path) -> list[str]:
    """The texts of the frames in an earlier version's frames file, each as this version writes it."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    lines = text.split("\n")  # not splitlines: U+2028 is in lines
    return [json.dumps(json.loads(line), ensure_ascii=False) for line in lines if line]


def _read_frames(path: Path) -> list[Frame]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    frames = []
    for line in data.split(b"\n"):
        if line.startswith(_FRAME_LINE):
            try:
                # the frame's text as it was written, so it is sent again as it was first sent
                frames.append(decode(line[len(_FRAME_LINE) : -1].decode()))
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
