"""A research task run as a job, for the WebSocket, the REST API and MCP alike: admitted, planned, run under
TASK_TIMEOUT_S, every frame it produces appended to the job store (whoever listens reads them from
there: a socket, a REST call waiting for the report, or nobody), and its end announced by webhook."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any

from fedresearch.core.auth import Principal
from fedresearch.core.errors import FailureKind, RequestError, ServerStopping, TooManyTasks
from fedresearch.core.events import ProgressEvent, ProgressStep
from fedresearch.core.metrics import Metrics
from fedresearch.core.models import ResearchRequest
from fedresearch.core.redis import cancelled
from fedresearch.federation.contract import SearchOptions
from fedresearch.federation.planning import Plan, follow_up_request, plan_request, scope_of
from fedresearch.jobs import webhooks
from fedresearch.jobs.frames import Frame, LogsFrame, PathFrame, ReportFrame, error_frames
from fedresearch.jobs.retention import RetentionPace, enforce_retention
from fedresearch.jobs.runtime import LiveJob, Runtime
from fedresearch.jobs.slots import Release
from fedresearch.jobs.store import Job, JobStatus
from fedresearch.report.chat import ChatSession
from fedresearch.report.compose import report_chunks
from fedresearch.report.store import record_bytes, report_files
from fedresearch.report.task import ResearchOutcome, ResearchTask, run_research

log = logging.getLogger("fedresearch")

# how far along a job is when it reports a step (retriever_done moves it between the two marks)
_PROGRESS = {
    ProgressStep.starting_research: 0.05,
    ProgressStep.planning: 0.1,
    ProgressStep.merging: 0.45,
    ProgressStep.fetching: 0.5,
    ProgressStep.writing_report: 0.7,
    ProgressStep.verification: 0.9,
    ProgressStep.report_written: 0.98,
}
_RETRIEVER_ENDS = frozenset(
    {ProgressStep.retriever_done, ProgressStep.retriever_failed, ProgressStep.retriever_skipped}
)
_RETRIEVERS_FROM, _RETRIEVERS_TO = 0.05, 0.45


@dataclass(frozen=True)
class Failure:
    """Why a job failed: the message its client reads, and which kind of failure it is (what a
    REST caller waiting for the job is answered with depends on the kind: web/jobs.py)."""

    reason: str
    kind: FailureKind


def chat_plan(
    runtime: Runtime, principal: Principal, owner: str | None, question: str, scope: dict[str, Any] | None
) -> Plan:
    """A follow-up search about a saved report, as the caller: within its job's scope (the
    retrievers it ran, its library) when the job kept one, else with the default retrievers; none
    when they cannot run (a retriever gone since, no user for the library: the report's evidence
    must do), nor when the task read only the pages it was given."""
    follow_up = follow_up_request(question, scope or {}, owner)
    nothing = Plan([], SearchOptions(query=follow_up.task, max_results=runtime.settings.max_search_results))
    if scope and not scope.get("retrievers"):
        return nothing
    bound = None if principal.admin else principal.user_id
    try:
        return plan_request(follow_up, runtime.settings, runtime.registry, bound_user=bound, principal=principal)
    except RequestError:
        return nothing


class JobRun:
    """One job from admission to its last frame."""

    def __init__(self, runtime: Runtime, principal: Principal, request: ResearchRequest, origin: str) -> None:
        self.runtime = runtime
        self.principal = principal
        self.request = request
        self.origin = origin
        self.research_id = uuid.uuid4().hex
        self.failure: Failure | None = None
        self.outcome: ResearchOutcome | None = None
        self.record: bytes | None = None  # the saved report's JSON, which the job store keeps
        self.slot: Slot | None = None  # its place under MAX_TASKS_PER_KEY (none: it was refused)
        self._done_retrievers = 0
        self._retrievers = 1
        self._progress = 0.0

    async def emit(self, frame: Frame) -> None:
        await self.runtime.jobs.append(self.research_id, frame)
        if isinstance(frame, LogsFrame):
            await self._advance(frame.content)

    async def _advance(self, step: ProgressStep) -> None:
        if step in _RETRIEVER_ENDS:
            self._done_retrievers += 1
            share = min(1.0, self._done_retrievers / self._retrievers)
            progress = _RETRIEVERS_FROM + (_RETRIEVERS_TO - _RETRIEVERS_FROM) * share
        else:
            progress = _PROGRESS.get(step, self._progress)
        if progress > self._progress:
            self._progress = progress
            job = await self.runtime.jobs.get(self.research_id)
            if job is not None and not job.status.finished:
                await self.runtime.jobs.save(job.evolve(progress=round(progress, 3)))

    async def log_event(self, event: ProgressEvent) -> None:
        metadata = event.metadata
        if event.step == ProgressStep.starting_research:  # the first frame names the job, for resume and REST
            metadata = {**(metadata or {}), "research_id": self.research_id}
        await self.emit(LogsFrame(content=event.step, output=event.output, metadata=metadata))

    async def error(self, message: str, metadata: dict[str, Any] | None = None) -> None:
        for frame in error_frames(message, metadata):
            await self.emit(frame)

    async def send_report(self, chunk: str) -> None:
        await self.emit(ReportFrame(output=chunk))

    async def deliver(self, markdown: str, saved: dict[str, str], message: str, streamed: bool = False) -> None:
        for chunk in [] if streamed else report_chunks(markdown):
            await self.send_report(chunk)
        files = {kind: f"reports/{name}" for kind, name in saved.items()}
        if self.record is not None:  # readable from the moment `path` names it, on this worker too
            await self.runtime.jobs.keep_report(self.research_id, self.record)
        metadata = {"files": files, "research_id": self.research_id}
        await self.log_event(ProgressEvent(ProgressStep.report_written, message, metadata))
        if self.slot is not None:
            self.slot.give_back()
        await self.emit(PathFrame(output=files))

    async def cannot_run(self, failure: Failure) -> None:
        """A task that cannot run ends as a finished one does on GPT-Researcher's page: the error,
        then a short report saying why, then `path`, so no client is left waiting."""
        self.failure = failure
        # `kind`: why, for a client that acts on it (the CLI's exit code); GPT-Researcher's ignore it
        await self.error(failure.reason, {"then": "report", "research_id": self.research_id, "kind": failure.kind})
        markdown = f"# {self.request.task}\n\nThis research could not run: {failure.reason}\n"
        job = await self.runtime.jobs.get(self.research_id)
        owner = job.owner if job is not None else None
        record = {
            "owner": owner,
            "id": self.research_id,
            "question": self.request.task,
            "error": failure.reason,
            "report": markdown,
        }
        self.record = record_bytes(markdown, record)
        await self.deliver(markdown, report_files(self.research_id), "📄 Report saved: the research could not run")

    async def execute(self, plan: Plan | None, refusal: Failure | None) -> None:
        """The job's whole life; it ends completed, failed or cancelled, never left running."""
        try:
            if plan is None:
                await self.cannot_run(refusal or Failure("the task was refused", FailureKind.bad_request))
            else:
                self._retrievers = max(1, len(plan.names))
                await self._research(plan)
        except asyncio.CancelledError:
            # whoever else follows this job (a resumed socket) learns why its frames stop here
            stopped = "the task was cancelled: its socket closed, it was deleted, or the server is stopping"
            await self.error(stopped, {"research_id": self.research_id})
            await self._finish(JobStatus.cancelled, stopped)
            raise
        except Exception:
            log.exception("job %s failed", self.research_id)
            await self._finish(JobStatus.failed, "internal error while running the task")
            return
        if self.failure is not None:
            await self._finish(JobStatus.failed, self.failure.reason)
        else:
            await self._finish(JobStatus.completed, None)

    async def _research(self, plan: Plan) -> None:
        settings = self.runtime.settings
        job = await self.runtime.jobs.get(self.research_id)
        try:
            async with asyncio.timeout(settings.task_timeout_s):
                owner = job.owner if job is not None else None
                self.outcome = await run_research(
                    ResearchTask(self.request, plan, owner, self.research_id),
                    self.runtime.tools,
                    self.log_event,
                    self.send_report,
                )
        except TimeoutError:
            late = f"the task did not finish within {settings.task_timeout_s:g} s (TASK_TIMEOUT_S)"
            await self.cannot_run(Failure(late, FailureKind.timed_out))
            return
        except Exception:
            log.exception("research task failed")
            reason = "internal error while running the task; the server log has the details"
            await self.cannot_run(Failure(reason, FailureKind.internal))
            return
        self.record = self.outcome.record
        live = self.runtime.live.get(self.research_id)
        if live is not None:
            live.chat = ChatSession(self.request, plan, self.outcome)
        saved = f"📄 Report saved with {len(self.outcome.references)} references"
        await self.deliver(self.outcome.markdown, self.outcome.files, saved, streamed=self.outcome.streamed)

    async def _finish(self, status: JobStatus, error: str | None) -> None:
        files = {kind: f"reports/{name}" for kind, name in report_files(self.research_id).items()}
        saved = status is not JobStatus.cancelled or self.outcome is not None
        record = self.record if saved else None
        job = await self.runtime.jobs.finish(self.research_id, status, error, files if saved else None, record)
        if job is None or status is JobStatus.cancelled:
            return
        settings = self.runtime.settings
        if settings.webhook_url:
            payload = webhooks.payload(job, self.report_text())
            self.runtime.in_background(webhooks.notify(self.runtime.deps.session, settings, payload))
        pace = self.runtime.retention
        if pace.due(job.owner):
            pass_ = enforce_retention(
                self.runtime.jobs,
                settings.reports_dir,
                settings.report_retention_days,
                pace.max_per_user,
                owner=job.owner,
                keep=pace.keep,
                kept_out=pace.counts,
            )
            self.runtime.in_background(_paced(pass_, pace, job.owner))

    def report_text(self) -> str | None:
        return self.outcome.markdown if self.outcome is not None and self.failure is None else None


async def _paced(work: Coroutine[Any, Any, Any], pace: RetentionPace, owner: str | None) -> None:
    try:
        await _quietly(work)
    finally:
        pace.done(owner)


async def _quietly(work: Coroutine[Any, Any, Any]) -> None:
    try:
        await work
    except Exception:
        log.exception("background work failed")


class Slot:
    """A task's place among its API key's MAX_TASKS_PER_KEY, given back once: before the task's
    `path` frame, or when the task ends however it ends (a done callback, which runs even for a task
    cancelled before its first step). Given back only at the end, a client that starts its next task
    when it reads `path`, as GPT-Researcher's do, was refused for the task it had just received the
    report of: 15 times in 30 with MAX_TASKS_PER_KEY=1 and Redis, 3 in 30 without (the job's record
    is still being written then)."""

    def __init__(self, release: Release, metrics: Metrics) -> None:
        self._release: Release | None = release
        self.metrics = metrics

    def give_back(self, _: object = None) -> None:
        """With Redis the lease's removal is a task scheduled before the one that sends `path`, so its
        command is on a pooled connection to Redis before the frame is on the client's socket (only a
        pool with no idle connection would connect first). Awaiting its answer before `path` instead
        cost 4% of the CPU per task and 7% of the tasks/s (`bench.cpu_per_task --together --redis`)."""
        release, self._release = self._release, None
        if release is not None:
            self.metrics.tasks.dec()
            release()


async def _take_slot(runtime: Runtime, key: str) -> Slot:
    """One of `key`'s MAX_TASKS_PER_KEY places (shared by every worker with Redis). Taken atomically,
    so two callers cannot both slip under the limit; TooManyTasks when all are taken."""
    limit = runtime.settings.max_tasks_per_key
    taken = await runtime.slots.take(key, limit)
    if isinstance(taken, int):
        raise TooManyTasks(
            f"{taken} tasks are already running for this API key (MAX_TASKS_PER_KEY={limit}); wait for one to finish"
        )
    runtime.metrics.tasks.inc()
    return Slot(taken, runtime.metrics)


def _admit(runtime: Runtime, principal: Principal, request: ResearchRequest) -> Plan:
    """The plan for `request`, if this caller may run it now; else RequestError saying why."""
    settings = runtime.settings
    if request.report_type_error:
        raise RequestError(request.report_type_error)
    if len(request.task) > settings.max_task_chars:
        raise RequestError(f"task is {len(request.task)} characters; MAX_TASK_CHARS is {settings.max_task_chars}")
    bound = None if principal.admin else principal.user_id
    return plan_request(request, settings, runtime.registry, bound_user=bound, principal=principal)


_STOPPING = (
    "this server is stopping (a restart or a deploy) and takes no new tasks: send it again, and another "
    "worker or host runs it"
)


async def start_job(
    runtime: Runtime, principal: Principal, request: ResearchRequest, origin: str, detached: bool
) -> tuple[JobRun, LiveJob]:
    """Admit, register and start a job; a refused one runs too, to its short report and `path`."""
    run = JobRun(runtime, principal, request, origin)
    registry = runtime.registry
    plan: Plan | None = None
    refusal: Failure | None = None
    slot = None
    try:
        if runtime.stopping.begun:
            raise ServerStopping(_STOPPING)
        admitted = _admit(runtime, principal, request)
        slot = await _take_slot(runtime, principal.key_id)
        plan, owner = admitted, principal.user_id or admitted.options.user_id
    except RequestError as error:
        refusal = Failure(str(error), error.kind)
        owner = principal.user_id or request.header("user_id") or runtime.settings.default_user
    job = Job(
        run.research_id,
        owner,
        request.task,
        request.report_type.value,
        origin=origin,
        detached=detached,
        status=JobStatus.running,
        created_at=time.time(),
        scope=scope_of(plan, registry) if plan is not None else {},
    )
    try:
        await runtime.jobs.create(job)
    except BaseException:
        if slot is not None:
            slot.give_back()
        raise
    run.failure, run.slot = refusal, slot  # the refusal is known now: a REST caller gets it even in the background
    task = asyncio.create_task(run.execute(plan, refusal))
    if slot is not None:
        task.add_done_callback(slot.give_back)
    live = LiveJob(task, detached)
    runtime.live[run.research_id] = live
    task.add_done_callback(lambda _: runtime.live.pop(run.research_id, None))
    return run, live


async def stop_jobs(runtime: Runtime) -> None:
    """The server is stopping: cancel the jobs still running (each ends `cancelled`), then give the
    webhooks under way a few seconds before they are cancelled too."""
    tasks = [live.task for live in runtime.live.values()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    under_way = runtime.background
    pending = list(under_way)
    if pending:
        _, late = await asyncio.wait(pending, timeout=5)
        for work in late:
            work.cancel()
        await asyncio.gather(*late, return_exceptions=True)


_SWEEP_EVERY_S = 3600.0


@contextlib.asynccontextmanager
async def retention_sweeps(runtime: Runtime) -> AsyncIterator[None]:
    """While the process runs, apply REPORT_RETENTION_DAYS every hour, so reports expire on an idle
    server too (a finished job applies both limits to its owner at once)."""
    settings = runtime.settings

    async def sweep() -> None:
        while True:
            await asyncio.sleep(_SWEEP_EVERY_S)
            work = enforce_retention(runtime.jobs, settings.reports_dir, settings.report_retention_days, 0)
            await _quietly(work)

    sweeper = asyncio.create_task(sweep()) if settings.report_retention_days > 0 else None
    yield
    await cancelled(sweeper)
