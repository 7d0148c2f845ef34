"""One research task: a planned request in, progress events and a saved, cited report out."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fedresearch.core.events import Emit, ProgressEvent
from fedresearch.core.models import FusedResult, ResearchRequest, RetrieverOutcome
from fedresearch.core.settings import Settings
from fedresearch.federation.contract import Adapter
from fedresearch.federation.fusion import fuse
from fedresearch.federation.planning import Plan
from fedresearch.federation.runner import Deps, federate
from fedresearch.report.citations import Reference
from fedresearch.report.store import save_report
from fedresearch.report.writer import write_report

_RETRIEVAL_SHARE = 0.8


@dataclass(frozen=True)
class ResearchOutcome:
    report_id: str
    markdown: str
    files: dict[str, str]
    sources: list[FusedResult]
    references: list[Reference]
    outcomes: list[RetrieverOutcome]
    retrieval_ms: float


async def run_research(
    request: ResearchRequest,
    plan: Plan,
    registry: dict[str, Adapter],
    deps: Deps,
    emit: Emit,
    owner: str | None = None,
) -> ResearchOutcome:
    """`owner`: the user whose key asked, the only one (with admins) who may read the saved report."""
    settings: Settings = deps.settings
    names = ", ".join(plan.names)
    await emit(
        ProgressEvent(
            "starting_research",
            f"🔍 Researching “{request.task}” with {names}",
            {"retrievers": plan.names, "user_id": plan.options.user_id},
        )
    )
    started = time.perf_counter()
    # retrievers must leave part of the task's time for writing and saving the report
    cap = (round(settings.task_timeout_s * _RETRIEVAL_SHARE, 3), "TASK_TIMEOUT_S")
    federated = await federate(plan.names, registry, plan.options, deps, emit, cap)
    retrieval_ms = round((time.perf_counter() - started) * 1000, 1)

    merging = f"🧩 Merging {len(federated.results)} results from {len(plan.names)} retrievers"
    await emit(ProgressEvent("merging", merging, {"results": len(federated.results), "retrieval_ms": retrieval_ms}))
    sources = fuse(federated.results, settings.retriever_weights)

    writing = f"✍️ Writing the {request.report_type.value} from {len(sources)} sources"
    await emit(ProgressEvent("writing_report", writing))
    markdown, references = write_report(request.task, request.report_type, sources, federated.outcomes)

    report_id = uuid.uuid4().hex
    record = {"owner": owner} | _record(report_id, request, markdown, references, federated.outcomes, retrieval_ms)
    files = await asyncio.to_thread(save_report, settings.reports_dir, report_id, markdown, record)
    return ResearchOutcome(report_id, markdown, files, sources, references, federated.outcomes, retrieval_ms)


def _record(
    report_id: str,
    request: ResearchRequest,
    markdown: str,
    references: list[Reference],
    outcomes: list[RetrieverOutcome],
    retrieval_ms: float,
) -> dict[str, Any]:
    """The saved JSON: the report and everything needed to check it (sources, per-retriever outcomes)."""
    return {
        "id": report_id,
        "question": request.task,
        "report_type": request.report_type.value,
        "created_at": datetime.now(UTC).isoformat(),
        "retrieval_ms": retrieval_ms,
        "retrievers": [outcome.model_dump() for outcome in outcomes],
        "sources": [
            {
                "number": reference.number,
                "title": reference.title,
                "href": reference.link,
                "retrievers": reference.retrievers,
                "fused_score": round(reference.source.score, 6),
                "metadata": reference.source.metadata,
            }
            for reference in references
        ],
        "report": markdown,
    }
