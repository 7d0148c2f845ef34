"""Writing the report: the LLM writer, section by section within the model's context and verified as
it goes (report/sectioned.py), or the extractive writer; either way every cited sentence is checked,
and the report always gets written.

A section the model cannot write (a timeout, 429/5xx after the SDK's retries, a stalled stream, a
malformed chunk, a context the server says is exceeded, an empty or unsupported answer) is the
extractive writer's text of that section, under a notice, and a `writer_fallback` log frame says why;
a report with nothing for the model to write from is the extractive writer's whole.
"""

from __future__ import annotations

from fedresearch.core.events import Emit
from fedresearch.core.work import run_on
from fedresearch.report.llm import LlmConfig
from fedresearch.report.sectioned import SectionedReport
from fedresearch.report.types import form_of
from fedresearch.report.writer import Brief
from fedresearch.report.written import (
    Composed,
    SavedReport,
    SaveReport,
    SendReport,
    announce_verification,
    records,
    report_chunks,
    send_all,
    write_extractive,
)

__all__ = ["Composed", "SaveReport", "SavedReport", "SendReport", "compose", "report_chunks", "write_extractive"]


def _write_and_save(brief: Brief, save: SaveReport | None) -> Composed:
    """The extractive report written, verified and saved in one trip to a thread: each trip wakes the
    worker and then the loop, 90-300 µs of CPU on a 2-core VM."""
    markdown, references, verification = write_extractive(brief)
    composed = Composed(markdown, references, verification, "extractive", sentences=records(verification.sentences))
    if save is not None:
        composed.saved = save(composed)
    return composed


async def compose(
    brief: Brief,
    config: LlmConfig | None,
    emit: Emit,
    send: SendReport | None = None,
    save: SaveReport | None = None,
) -> Composed:
    """The report, sent through `send` (paragraph-bounded frames) as it is written, and verified;
    with `save`, saved before it is sent whole (the extractive writer) or once the last section is
    sent (the model), its `saved` set from what `save` returned."""
    if config is None or not form_of(brief.report_type).written_by_model:
        composed = await run_on(brief.writing.work, _write_and_save, brief, save)
        await announce_verification(composed.verification, emit)
        await send_all(composed.markdown, send)
        return composed
    composed = await SectionedReport(brief, config, emit, send).write()
    if save is not None:
        composed.saved = await run_on(brief.writing.work, save, composed)
    return composed
