"""GPT-Researcher's REST API (its backend/server/app.py: `POST /report/`, `GET /report/{research_id}`,
`/api/reports` CRUD with its chat history, `POST /api/chat`), plus `GET /api/jobs[/{research_id}]`.

Every research task is a job (`tasks.py`); these routes start jobs and read them. Each route that
reads a job or a report checks that the caller owns it (or is an admin): another user's job is
answered exactly as a missing one, 404, so ids cannot be probed.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fedresearch.core.auth import Principal
from fedresearch.core.errors import FailureKind
from fedresearch.core.models import ResearchRequest
from fedresearch.jobs.retention import delete_with_reports
from fedresearch.jobs.runs import chat_plan, start_job
from fedresearch.jobs.store import JOB_ID, Job, JobStatus, client_entry_id, may_see, shown_id
from fedresearch.report.chat import session_from_report
from fedresearch.report.render import ExportFailed
from fedresearch.report.store import REPORT_ID, content_disposition
from fedresearch.web.auth import principal_of, validation_message
from fedresearch.web.keys import RUNTIME, SETTINGS
from fedresearch.web.reports import failed_export

_BACKGROUND_MESSAGE = "Your report is being generated in the background. Please check back later."

# what a REST caller waiting for a task that failed is answered with, by why it failed
_FAILURE_STATUS = {
    FailureKind.bad_request: 400,
    FailureKind.too_many_tasks: 429,
    FailureKind.stopping: 503,  # a client retrying reaches a server that runs it
    FailureKind.timed_out: 504,
    FailureKind.internal: 500,
}


class ReportRequest(ResearchRequest):
    """GPT-Researcher's `ResearchRequest` of `POST /report/` (repo_name and branch_name, for its
    GitHub report source, are accepted and ignored)."""

    generate_in_background: bool = True
    repo_name: str | None = None
    branch_name: str | None = None


class ChatRequest(BaseModel):
    """GPT-Researcher's `ChatRequest`: the report and the conversation so far (its last user message
    is the question); `research_id` (ours) names a saved report instead of sending its text."""

    model_config = ConfigDict(extra="allow")

    report: str = ""
    messages: list[dict[str, Any]] = Field(min_length=1)
    research_id: str | None = None


# a report's chat: what one report keeps (each message is a line of the job's file, and in memory)
CHAT_MESSAGES = 500
CHAT_MESSAGE_BYTES = 128 * 1024  # a chat answer with its sources is 2 to 60 KB


def _detail(kind: type[web.HTTPException], message: str) -> web.HTTPException:
    # FastAPI's HTTPException body, which GPT-Researcher's clients read
    return kind(text=json.dumps({"detail": message}), content_type="application/json")


async def _body(request: web.Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise _detail(web.HTTPBadRequest, f"the body is not JSON: {error}") from None


def _owner(request: web.Request, principal: Principal) -> str | None:
    return principal.user_id or request.app[SETTINGS].default_user


async def _found(request: web.Request, principal: Principal, research_id: str) -> Job | None:
    """The job `research_id` names for this caller: a research id, or an id the caller chose for an
    entry of its own (kept per owner: client_entry_id); None when it names nothing the caller may see."""
    store = request.app[RUNTIME].jobs
    job = None
    if not REPORT_ID.fullmatch(research_id):
        job = await store.get(client_entry_id(_owner(request, principal) or "", research_id))
    if job is None:
        job = await store.get(research_id)  # a research id, or (an admin) an entry's own id
    return job if job is not None and may_see(principal, job) else None


async def _owned(request: web.Request, principal: Principal, research_id: str, missing: str) -> Job:
    job = await _found(request, principal, research_id)
    if job is None:
        raise _detail(web.HTTPNotFound, missing)
    return job


async def _report_text(request: web.Request, research_id: str) -> str | None:
    return await request.app[RUNTIME].reports().markdown(research_id)


async def generate_report(request: web.Request) -> web.Response:
    """Start a research job; in the background (default) answer at once with its research_id,
    otherwise answer with the report when it is written. A task that cannot run (an unknown
    retriever, a limit) is answered with why at once, either way; it is kept as a failed job."""
    principal = principal_of(request)
    try:
        asked = ReportRequest.model_validate(await _body(request))
    except ValidationError as error:
        raise _detail(web.HTTPUnprocessableEntity, validation_message(error)) from None
    run, live = await start_job(request.app[RUNTIME], principal, asked, "rest", detached=True)
    if asked.generate_in_background and run.failure is None:
        return web.json_response({"message": _BACKGROUND_MESSAGE, "research_id": run.research_id})
    await asyncio.wait({live.task})  # the job goes on if this request is dropped; a cancelled job is no error here
    if run.failure is not None or run.outcome is None:
        failure = run.failure
        reason = failure.reason if failure else "the task was cancelled"
        body = {"research_id": run.research_id, "status": "failed", "error": reason, "detail": reason}
        return web.json_response(body, status=_FAILURE_STATUS[failure.kind] if failure else 503)
    outcome = run.outcome
    information = {
        "source_urls": [source.href for source in outcome.sources],
        "research_costs": 0.0,  # no paid model was called that we pay per token for
        "visited_urls": sorted(outcome.writing.pages),
        "research_images": [],
    }
    return web.json_response(
        {
            "research_id": run.research_id,
            "research_information": information,
            "report": outcome.markdown,
            "docx_path": f"reports/{run.research_id}.docx",
            "pdf_path": f"reports/{run.research_id}.pdf",
        }
    )


async def read_report(request: web.Request) -> web.StreamResponse:
    """A job's report as DOCX (GPT-Researcher's `GET /report/{research_id}`)."""
    principal = principal_of(request)
    research_id = request.match_info["research_id"]
    job = await request.app[RUNTIME].jobs.get(research_id)
    path = None
    if job is not None and may_see(principal, job):
        reports = request.app[RUNTIME].reports()
        await reports.fetch_of(job)
        try:
            path = await reports.export(research_id, "docx", principal.user_id or principal.key_id)
        except ExportFailed as failed:
            raise failed_export(failed) from None
    if path is None or job is None:
        raise web.HTTPNotFound(text=json.dumps({"message": "Report not found."}), content_type="application/json")
    return web.FileResponse(path, headers={"Content-Disposition": content_disposition(job.task, "docx")})


async def _job_view(request: web.Request, job: Job, with_report: bool) -> dict[str, Any]:
    view: dict[str, Any] = {
        "research_id": shown_id(job),
        "status": job.status.value,
        "progress": job.progress,
        "task": job.task,
        "report_type": job.report_type,
        "origin": job.origin,
        "detached": job.detached,
        "created_at": datetime.fromtimestamp(job.created_at, UTC).isoformat(),
        "updated_at": datetime.fromtimestamp(job.updated_at, UTC).isoformat(),
        "error": job.error,
        "files": job.files,
    }
    if with_report:  # one job: what a client resuming it will be sent, and the report itself
        view["frames"] = len(await request.app[RUNTIME].jobs.frames(job.research_id))
        done = job.status is JobStatus.completed
        view["report"] = await _report_text(request, job.research_id) if done else None
    return view


async def job_status(request: web.Request) -> web.Response:
    """One job: status, progress (0..1), the report once completed, and its files."""
    principal = principal_of(request)
    job = await _owned(request, principal, request.match_info["research_id"], "Job not found")
    return web.json_response(await _job_view(request, job, with_report=True))


async def list_jobs(request: web.Request) -> web.Response:
    """The caller's jobs, newest first (an admin sees everyone's, or one user's with ?user_id=)."""
    principal = principal_of(request)
    jobs = await _visible(request, principal)
    return web.json_response({"jobs": [await _job_view(request, job, with_report=False) for job in jobs]})


async def _visible(request: web.Request, principal: Principal) -> list[Job]:
    store = request.app[RUNTIME].jobs
    if not principal.admin:
        return await store.list(principal.user_id)
    asked = request.query.get("user_id", "").strip()
    return await store.list(asked) if asked else await store.list(None, everyone=True)


def _needs_text(job: Job) -> bool:
    return job.client.get("answer") is None and job.origin != "client"


async def _entries(request: web.Request, jobs: list[Job]) -> list[dict[str, Any]]:
    """Jobs as GPT-Researcher's saved reports, their texts read in one trip to a thread (a listing
    of a user's 200 reports made 200 trips) and those written on other hosts in one trip to Redis."""
    wanted = [job.research_id for job in jobs if _needs_text(job)]
    texts = await request.app[RUNTIME].reports().markdowns(wanted)
    return [_entry(job, texts.get(job.research_id)) for job in jobs]


def _entry(job: Job, text: str | None) -> dict[str, Any]:
    """A job as GPT-Researcher's saved report: {id, question, answer, orderedData, chatMessages, timestamp}."""
    client = job.client
    answer = text if _needs_text(job) else client.get("answer")
    stamp = client.get("timestamp")
    timestamp = max(stamp if isinstance(stamp, int) else 0, int(job.updated_at * 1000))
    return {
        "id": shown_id(job),
        "question": client.get("question", job.task),
        "answer": answer,
        "orderedData": client.get("orderedData") or [],
        "chatMessages": client.get("chatMessages") or [],
        "timestamp": timestamp,
    }


async def list_reports(request: web.Request) -> web.Response:
    """The caller's saved reports (`?report_ids=a,b` picks some), as GPT-Researcher lists them."""
    principal = principal_of(request)
    jobs = await _visible(request, principal)
    wanted = request.query.get("report_ids")
    if wanted:
        order = [part.strip() for part in wanted.split(",")]
        by_id = {shown_id(job): job for job in jobs}
        jobs = [by_id[research_id] for research_id in order if research_id in by_id]
    return web.json_response({"reports": await _entries(request, jobs)})


async def get_report(request: web.Request) -> web.Response:
    """One saved report, as GPT-Researcher answers it."""
    principal = principal_of(request)
    job = await _owned(request, principal, request.match_info["research_id"], "Report not found")
    return web.json_response({"report": (await _entries(request, [job]))[0]})


def _client_fields(data: dict[str, Any], keep: dict[str, Any]) -> dict[str, Any]:
    fields = dict(keep)
    for name in ("question", "answer", "orderedData", "chatMessages", "timestamp"):
        if data.get(name) is not None:
            fields[name] = data[name]
    return fields


async def create_or_update_report(request: web.Request) -> web.Response:
    """Save a report entry (GPT-Researcher's page keeps its history here); an existing id of the
    caller's is updated, another user's is not found."""
    principal = principal_of(request)
    data = await _body(request)
    if not isinstance(data, dict):
        raise _detail(web.HTTPBadRequest, "expected a JSON object")
    research_id = str(data.get("id") or "temp_id")
    if not JOB_ID.fullmatch(research_id):
        raise _detail(web.HTTPBadRequest, "id must be 1 to 128 letters, digits or _ . : -")
    store = request.app[RUNTIME].jobs
    existing = await _found(request, principal, research_id)
    # ids shaped as this server's research ids are its own to give: a client cannot claim one
    if existing is None and REPORT_ID.fullmatch(research_id):
        raise _detail(web.HTTPNotFound, "Report not found")
    if existing is not None:
        await store.save(replace(existing, client=_client_fields(data, existing.client)))
    else:
        owner = _owner(request, principal)
        question = data.get("question") if isinstance(data.get("question"), str) else ""
        job = Job(client_entry_id(owner or "", research_id), owner, question or "", origin="client")
        job = replace(job, status=JobStatus.completed, client={**_client_fields(data, {}), "id": research_id})
        await store.create(job)
    return web.json_response({"success": True, "id": research_id})


async def update_report(request: web.Request) -> web.Response:
    """Update a saved report's fields (those sent and not null)."""
    principal = principal_of(request)
    job = await _owned(request, principal, request.match_info["research_id"], "Report not found")
    data = await _body(request)
    if not isinstance(data, dict):
        raise _detail(web.HTTPBadRequest, "expected a JSON object")
    await request.app[RUNTIME].jobs.save(replace(job, client=_client_fields(data, job.client)))
    return web.json_response({"success": True, "id": shown_id(job)})


async def delete_report_entry(request: web.Request) -> web.Response:
    """Delete a report: its job (cancelled first if it still runs) and every file saved for it."""
    principal = principal_of(request)
    job = await _owned(request, principal, request.match_info["research_id"], "Report not found")
    live = request.app[RUNTIME].live.get(job.research_id)
    if live is not None and not live.task.done():
        live.task.cancel()
        await asyncio.gather(live.task, return_exceptions=True)
    await delete_with_reports(request.app[RUNTIME].jobs, request.app[SETTINGS].reports_dir, [job.research_id])
    return web.json_response({"success": True})


async def report_chat(request: web.Request) -> web.Response:
    """A saved report's chat messages."""
    principal = principal_of(request)
    job = await _owned(request, principal, request.match_info["research_id"], "Report not found")
    return web.json_response({"chatMessages": job.client.get("chatMessages") or []})


async def add_report_chat_message(request: web.Request) -> web.Response:
    """Append one message to a saved report's chat (at most CHAT_MESSAGES, of CHAT_MESSAGE_BYTES each)."""
    principal = principal_of(request)
    job = await _owned(request, principal, request.match_info["research_id"], "Report not found")
    message = await _body(request)
    size = len(json.dumps(message, ensure_ascii=False).encode())
    if size > CHAT_MESSAGE_BYTES:
        said = f"a chat message may hold {CHAT_MESSAGE_BYTES // 1024} KB; this one holds {size // 1024} KB"
        raise web.HTTPRequestEntityTooLarge(
            max_size=CHAT_MESSAGE_BYTES,
            actual_size=size,
            text=json.dumps({"detail": said}),
            content_type="application/json",
        )
    messages = job.client.get("chatMessages")
    if isinstance(messages, list) and len(messages) >= CHAT_MESSAGES:
        raise _detail(
            web.HTTPConflict,
            f"this report's chat holds {len(messages)} messages, the most one report keeps; "
            "start a new report to go on",
        )
    messages = [*messages, message] if isinstance(messages, list) else [message]
    client = {**job.client, "chatMessages": messages, "timestamp": int(time.time() * 1000)}
    await request.app[RUNTIME].jobs.save(replace(job, client=client))
    return web.json_response({"success": True, "id": shown_id(job)})


async def chat(request: web.Request) -> web.Response:
    """Chat about a report: the answer is drawn from the report's cited evidence (and, when that does
    not cover the question, a new search: with the retrievers its task ran for a `research_id`, the
    default ones for a report sent along), cited with its numbers."""
    principal = principal_of(request)
    try:
        asked = ChatRequest.model_validate(await _body(request))
    except ValidationError as error:
        raise _detail(web.HTTPBadRequest, validation_message(error)) from None
    question = next((str(m.get("content", "")) for m in reversed(asked.messages) if m.get("role") == "user"), "")
    if not question.strip():
        raise _detail(web.HTTPBadRequest, "messages holds no user message to answer")
    report, owner, scope = asked.report, principal.user_id, None
    if asked.research_id:
        job = await _owned(request, principal, asked.research_id, "Report not found")
        report, owner, scope = await _report_text(request, job.research_id) or "", job.owner, job.scope
    plan = chat_plan(request.app[RUNTIME], principal, owner or request.app[SETTINGS].default_user, question, scope)
    deps = request.app[RUNTIME].deps
    session = session_from_report(report, ResearchRequest(task=question[:2000]), plan, deps)
    answer = await session.answer(question.strip(), request.app[RUNTIME].tools)
    message = {
        "role": "assistant",
        "content": answer.content,
        "timestamp": int(time.time() * 1000),
        "metadata": answer.metadata,
    }
    return web.json_response({"response": message})


def register(app: web.Application) -> None:
    app.router.add_post("/report/", generate_report)
    app.router.add_get("/report/{research_id}", read_report)
    app.router.add_get("/api/jobs", list_jobs)
    app.router.add_get("/api/jobs/{research_id}", job_status)
    app.router.add_get("/api/reports", list_reports)
    app.router.add_post("/api/reports", create_or_update_report)
    app.router.add_get("/api/reports/{research_id}", get_report)
    app.router.add_put("/api/reports/{research_id}", update_report)
    app.router.add_delete("/api/reports/{research_id}", delete_report_entry)
    app.router.add_get("/api/reports/{research_id}/chat", report_chat)
    app.router.add_post("/api/reports/{research_id}/chat", add_report_chat_message)
    app.router.add_post("/api/chat", chat)
