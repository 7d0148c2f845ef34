"""fedresearch as a Model Context Protocol server (the official `mcp` SDK): tools `search`,
`research`, `list_retrievers` and `get_report`, over stdio (`fedresearch mcp`) and streamable
HTTP at `/mcp` on the same aiohttp server, behind the same API keys.

Over HTTP, the SDK's session manager (an ASGI app) is driven by one ordinary aiohttp route
(web/mcp_http.py, which imports this module at its first request): the key is checked there like on
every other route, and each tool call checks it again from the request's headers, so a tool acts
as the key's user. Over stdio the caller is the local user who started it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from aiohttp import web
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError  # its message reaches the client as is
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from pydantic import Field, ValidationError

from fedresearch.core.auth import Principal, bearer_token
from fedresearch.core.errors import RequestError
from fedresearch.core.events import discard
from fedresearch.core.identifiers import string_ids
from fedresearch.core.models import FusedResult, ResearchRequest
from fedresearch.federation.fusion import fuse
from fedresearch.federation.planning import Plan, plan_request
from fedresearch.federation.runner import federate
from fedresearch.jobs.frames import LogsFrame
from fedresearch.jobs.runs import start_job
from fedresearch.jobs.store import follow
from fedresearch.report.citations import reference_entries
from fedresearch.report.language import labels_for
from fedresearch.report.store import REPORT_NAME
from fedresearch.report.types import offered_forms
from fedresearch.web.keys import KEYS, RUNTIME, SETTINGS
from fedresearch.web.limits import app_query_slot, query_too_long
from fedresearch.web.status import retriever_list

_BODY_CHARS = 1200
# the report types a question alone can ask for, from their registry (report/types.py)
ReportTypeName = Annotated[
    str,
    Field(
        description="; ".join(f"{form.name}: {form.description}" for form in offered_forms()),
        json_schema_extra={"enum": [form.name for form in offered_forms()]},
    ),
]
INSTRUCTIONS = (
    "fedresearch searches the user's own library (papers, notes, PDFs) federated with scholarly and "
    "web retrievers. Use `search` for sources, `research` for a cited report, `list_retrievers` to "
    "see what can be searched, `get_report` to read a saved report."
)


def caller(app: web.Application, ctx: Context) -> Principal:
    headers = ctx.headers
    if headers is None:  # stdio: whoever started the process
        return Principal(None, admin=True)
    keys = app[KEYS]
    if not keys.enabled:
        return Principal(None, admin=True)
    principal = keys.authenticate(bearer_token(headers.get("authorization")))
    if principal is None or principal.knowledge_bases is not None:
        raise ToolError("a valid API key is required: send Authorization: Bearer KEY")
    return principal


def plan_for(
    app: web.Application, principal: Principal, task: str, retrievers: str, user_id: str, **extra: Any
) -> Plan:
    headers = {key: value for key, value in (("retrievers", retrievers), ("user_id", user_id)) if value}
    registry = app[RUNTIME].registry
    try:
        request = ResearchRequest(task=task, headers=headers, **extra)
        return plan_request(
            request, app[SETTINGS], registry, None if principal.admin else principal.user_id, principal=principal
        )
    except ValidationError as error:
        raise ToolError("; ".join(str(issue["msg"]) for issue in error.errors())) from None
    except RequestError as error:
        raise ToolError(str(error)) from None


def source_json(number: int, source: FusedResult) -> dict[str, Any]:
    return {
        "number": number,
        "title": source.title or source.href,
        "href": source.href,
        "content": source.body[:_BODY_CHARS],
        "score": round(source.score, 6),
        "retrievers": list(source.retrievers),
        "metadata": string_ids({k: v for k, v in source.metadata.items() if v is not None}),
    }


class McpTools:
    """The MCP tools over one app's runtime and keys; each call checks its caller's key first."""

    def __init__(self, app: web.Application) -> None:
        self.app = app

    async def search(
        self, query: str, ctx: Context, retrievers: str = "", max_results: int = 10, user_id: str = ""
    ) -> dict[str, Any]:
        app = self.app
        principal = caller(app, ctx)
        if (refusal := query_too_long(query, app)) is not None:
            raise ToolError(refusal)
        plan = plan_for(app, principal, query, retrievers, user_id, max_search_results=max_results)
        runtime = app[RUNTIME]
        with app_query_slot(app, principal.key_id, lambda reason, _: ToolError(reason)):
            federated = await federate(plan.names, runtime.registry, plan.options, runtime.deps, discard)
        sources = fuse(federated.results, app[SETTINGS].retriever_weights)[: max(1, min(max_results, 50))]
        outcomes = [outcome.model_dump(include={"name", "status", "count", "error"}) for outcome in federated.outcomes]
        return {"sources": [source_json(n, s) for n, s in enumerate(sources, start=1)], "retrievers": outcomes}

    async def research(
        self,
        task: str,
        ctx: Context,
        retrievers: str = "",
        report_type: ReportTypeName = "research_report",
        user_id: str = "",
    ) -> dict[str, Any]:
        # a job, as over the WebSocket and REST: MAX_TASKS_PER_KEY, MAX_TASK_CHARS and TASK_TIMEOUT_S
        # apply, it is listed and kept (or expired) with the user's other reports, and it goes on
        # should the client leave (get_report reads it then)
        headers = {key: value for key, value in (("retrievers", retrievers), ("user_id", user_id)) if value}
        try:
            request = ResearchRequest(task=task, report_type=report_type, headers=headers)
        except ValidationError as error:
            raise ToolError("; ".join(str(issue["msg"]) for issue in error.errors())) from None
        runtime = self.app[RUNTIME]
        run, live = await start_job(runtime, caller(self.app, ctx), request, "mcp", detached=True)
        if run.failure is not None:
            raise ToolError(run.failure.reason)
        steps = 0
        async with contextlib.aclosing(follow(runtime.jobs, run.research_id)) as frames:
            async for frame in frames:
                if isinstance(frame, LogsFrame):
                    steps += 1
                    await ctx.report_progress(steps, None, frame.output)  # MCP's progress notifications
        await asyncio.wait({live.task})
        if run.failure is not None or run.outcome is None:
            raise ToolError(run.failure.reason if run.failure is not None else "the task was cancelled")
        outcome = run.outcome
        # each reference's full entry as the report's References give it (its style, its language),
        # formatted by citeproc off the loop
        language = labels_for(task, outcome.writing.language).code
        entries = await asyncio.to_thread(
            reference_entries, outcome.references, outcome.writing.citation_style, language
        )
        references = [{"number": r.number, "title": r.title, "href": r.link, "entry": e} for r, e in entries]
        files = {kind: f"/reports/{name}" for kind, name in outcome.files.items()}
        return {"research_id": outcome.report_id, "report": outcome.markdown, "references": references, "files": files}

    async def list_retrievers(self, ctx: Context) -> dict[str, Any]:
        caller(self.app, ctx)
        return retriever_list(self.app[RUNTIME].registry)

    async def get_report(self, research_id: str, ctx: Context) -> dict[str, Any]:
        principal = caller(self.app, ctx)
        reports = self.app[RUNTIME].reports()
        if not REPORT_NAME.match(f"{research_id}.json") or not await reports.readable(principal, research_id):
            raise ToolError(f"no report {research_id!r}")  # another user's report is not there for this key
        record = await reports.record(research_id)
        if record is None:
            raise ToolError(f"no report {research_id!r}")
        return record


# each tool, by its method's name, and what its clients are told it does
_TOOLS = {
    "search": "Federated search: ranked sources (title, link, passage, retrievers) for a query.",
    "research": "Research a question: a cited Markdown report; progress arrives as notifications.",
    "list_retrievers": "The retrievers this server offers, whether each is configured, and the aliases.",
    "get_report": "A saved report by its research_id: its Markdown, sources and retriever outcomes.",
}


def build_server(app: web.Application) -> MCPServer:
    """The MCP server over this app's registry, library and keys."""
    server: MCPServer = MCPServer(name="fedresearch", instructions=INSTRUCTIONS)
    tools = McpTools(app)
    for name, description in _TOOLS.items():
        server.add_tool(getattr(tools, name), description=description)
    return server


@asynccontextmanager
async def session_manager(app: web.Application) -> AsyncIterator[StreamableHTTPSessionManager]:
    server = build_server(app)
    # stateless: any worker of `serve --workers N`, or any host behind a balancer, answers any request
    # (a session lived in the memory of the worker that began it, and the others answered 404)
    manager = StreamableHTTPSessionManager(server._lowlevel_server, stateless=True)
    ready, stop = asyncio.Event(), asyncio.Event()

    # the manager's task group must be entered and left by one task; aiohttp starts and cleans up
    # the app in different ones, so one task of its own holds it for the app's lifetime
    async def hold() -> None:
        async with manager.run():
            ready.set()
            await stop.wait()

    holder = asyncio.create_task(hold())
    await asyncio.wait([holder, asyncio.create_task(ready.wait())], return_when=asyncio.FIRST_COMPLETED)
    if holder.done():
        holder.result()  # it failed to start: raise why
    try:
        yield manager
    finally:
        stop.set()
        await holder
