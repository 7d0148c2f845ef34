"""One research task: a planned request in, progress events and a saved, cited report out."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from core.events import Emit, ProgressEvent
from core.models import FusedResult, ResearchRequest, RetrieverOutcome
from core.settings import Settings
from report.citations import Reference
from report.store import save_report
from report.writer import write_report
from retrievers.base import Deps, Retriever
from retrievers.federation import federate
from retrievers.fusion import fuse
from retrievers.selection import Plan


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
    registry: dict[str, Retriever],
    deps: Deps,
    emit: Emit,
) -> ResearchOutcome:
    settings: Settings = deps.settings
    await emit(
        ProgressEvent(
            "starting_research",
            f"🔍 Researching “{request.task}” with {', '.join(plan.names)}",
            {"retrievers": plan.names, "user_id": plan.options.user_id},
        )
    )
    started = time.perf_counter()
    deadline = min(settings.retriever_timeout_s, settings.task_timeout_s)
    federated = await federate(plan.names, registry, plan.options, deps, emit, deadline)
    retrieval_ms = round((time.perf_counter() - started) * 1000, 1)

    await emit(
        ProgressEvent(
            "merging",
            f"🧩 Merging {len(federated.results)} results from {len(plan.names)} retrievers",
            {"results": len(federated.results), "retrieval_ms": retrieval_ms},
        )
    )
    sources = fuse(federated.results, settings.retriever_weights)

    await emit(
        ProgressEvent("writing_report", f"✍️ Writing the {request.report_type.value} from {len(sources)} sources")
    )
    markdown, references = write_report(request.task, request.report_type, sources, federated.outcomes)

    report_id = uuid.uuid4().hex
    record = {
        "id": report_id,
        "question": request.task,
        "report_type": request.report_type.value,
        "created_at": datetime.now(UTC).isoformat(),
        "retrieval_ms": retrieval_ms,
        "retrievers": [outcome.model_dump() for outcome in federated.outcomes],
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
    files = await asyncio.to_thread(save_report, settings.reports_dir, report_id, markdown, record)
    return ResearchOutcome(report_id, markdown, files, sources, references, federated.outcomes, retrieval_ms)
