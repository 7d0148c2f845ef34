"""Progress events: what the pipeline tells whoever is listening (the server turns them into frames)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class ProgressStep(StrEnum):
    """A step of a task as its `logs` frames name it (their `content`, GPT-Researcher's clients read
    it as such): every step the server reports is one of these, and its value is its name on the wire."""

    starting_research = "starting_research"
    planning = "planning"
    planner_fallback = "planner_fallback"  # the model gave no sub-questions: the task goes on without
    retriever_started = "retriever_started"
    retriever_done = "retriever_done"
    retriever_failed = "retriever_failed"
    retriever_skipped = "retriever_skipped"
    merging = "merging"
    fetching = "fetching"
    writing_report = "writing_report"
    writer_fallback = "writer_fallback"  # the model could not write: the extractive writer does
    verification = "verification"
    report_written = "report_written"
    warning = "warning"
    error = "error"


@dataclass(frozen=True)
class ProgressEvent:
    step: ProgressStep
    output: str
    metadata: dict[str, Any] | None = field(default=None)


Emit = Callable[[ProgressEvent], Awaitable[None]]


async def discard(_: ProgressEvent) -> None:
    return None
