"""Reading the pages behind the best web and scholarly results (and the request's own URLs), each
outcome said in a `fetching` frame, all under the time the task has left."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from fedresearch.core.events import Emit, ProgressEvent, ProgressStep
from fedresearch.core.identifiers import canonical_key, is_url
from fedresearch.core.models import FusedResult
from fedresearch.library.formats import Section
from fedresearch.report.pages import Page, PageReader, PageSkipped


def url_sources(urls: Sequence[str]) -> list[FusedResult]:
    """The request's own pages as sources, ranked before anything a retriever found."""
    return [
        FusedResult(
            key=canonical_key(url),
            href=url,
            title="",
            body="",
            score=1.0,
            retrievers=["source_urls"],
            ranks={},
            kinds=["web"],
        )
        for url in urls
    ]


def page_url(source: FusedResult) -> str | None:
    """What to read for a source: a scholarly result's open-access PDF, a web result's page."""
    pdf = source.metadata.get("pdf_url")
    if isinstance(pdf, str) and is_url(pdf):
        return pdf
    if source.kind in ("web",) and is_url(source.href):
        return source.href
    return None


async def read_pages(
    reader: PageReader, sources: Sequence[FusedResult], limit: int, budget_s: float, emit: Emit
) -> dict[str, list[Section]]:
    """Main text of up to `limit` sources' pages, by source key; the rest keep their snippets."""
    wanted = [(source, url) for source in sources if (url := page_url(source))][:limit]
    if not wanted:
        return {}
    await emit(ProgressEvent(ProgressStep.fetching, f"🌐 Reading {len(wanted)} pages", {"pages": len(wanted)}))
    tasks = {asyncio.create_task(_read(reader, source, url, emit)): source for source, url in wanted}
    done, pending = await asyncio.wait(tasks, timeout=max(0.1, budget_s))
    for task in pending:
        task.cancel()
        source = tasks[task]
        await emit(
            ProgressEvent(
                ProgressStep.fetching, f"⏭️ {source.href}: not read in time", {"url": source.href, "status": "skipped"}
            )
        )
    pages = {}
    for task in done:
        page = task.result()
        if page is not None:
            source = tasks[task]
            pages[source.key] = page.sections
            if not source.title and page.title:
                source.title = page.title
    return pages


async def _read(reader: PageReader, source: FusedResult, url: str, emit: Emit) -> Page | None:
    try:
        page = await reader.read(url, titled=not source.title)
    except PageSkipped as reason:
        await emit(
            ProgressEvent(
                ProgressStep.fetching, f"⏭️ {url}: {reason}", {"url": url, "status": "skipped", "reason": str(reason)}
            )
        )
        return None
    except Exception as failure:  # a page must never sink the task
        why = f"failed ({type(failure).__name__})"
        await emit(
            ProgressEvent(ProgressStep.fetching, f"⏭️ {url}: {why}", {"url": url, "status": "skipped", "reason": why})
        )
        return None
    text = f"📄 {url}: read in {page.elapsed_ms:.0f} ms ({page.chars} characters, {page.kind})"
    meta = {"url": url, "status": "fetched", "elapsed_ms": page.elapsed_ms, "chars": page.chars, "kind": page.kind}
    await emit(ProgressEvent(ProgressStep.fetching, text, meta))
    return page
