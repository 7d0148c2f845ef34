"""The LLM writer section by section on a fake model: how many requests a report takes, the largest
of them, and the time.

    python -m bench.llm_sections [--sources 24] [--context 8192] [--chinese] [--repeat 3]
                                 [--types research_report,detailed_report]

The model is tests/fakes/openai_chat.py's fake OpenAI-compatible server holding `--context` tokens as
servers do (refusing a longer request with HTTP 400), answering as a faithful model at once (a
section: its first passages' first sentences, cited; a summing section: its drafts' first sentences),
so the time is the writer's own work (planning, ranking, verifying, rendering), not a model's. The
report is written from `--sources` long sources on hybrid retrieval (tests/fakes/long_sources.py;
`--chinese`: in Chinese), a detailed report with three sub-questions over them; no encoder.

Printed per report type: requests (sections written from passages + sections summing them up),
passages per section request, the largest prompt as the server counts it and as the writer counted
it, the largest request as the server holds it (prompt + max_tokens, within `--context`), refusals,
the report's references and sentences checked, and the median wall time of `compose` over
`--repeat` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from fedresearch.core.events import ProgressEvent
from fedresearch.core.models import ReportType
from fedresearch.report.compose import compose
from fedresearch.report.llm import LlmConfig
from fedresearch.report.tokens import message_tokens
from fedresearch.report.writer import Brief
from tests.fakes import long_sources
from tests.fakes.openai_chat import FakeOpenAI, faithful, is_summing, passages_of


async def _quiet(_: ProgressEvent) -> None:
    return None


async def measure(report_type: ReportType, sources: int, context: int, chinese: bool, repeat: int) -> dict[str, Any]:
    found = long_sources.chinese_sources(sources) if chinese else long_sources.english_sources(sources)
    question = long_sources.ZH_QUESTION if chinese else long_sources.QUESTION
    parts = (
        long_sources.parts(found, deep=report_type is ReportType.deep)
        if report_type is not ReportType.research_report
        else []
    )
    brief = Brief(question, report_type, found, parts=parts)
    times, fake = [], None
    for _ in range(repeat):
        fake = await FakeOpenAI(context).start()
        fake.script = [faithful]
        config = LlmConfig(fake.url, "not-needed", "fake", timeout_s=30.0, max_retries=0, context_tokens=context)
        try:
            started = time.perf_counter()
            composed = await compose(brief, config, _quiet)
            times.append(time.perf_counter() - started)
        finally:
            await fake.stop()
    assert fake is not None
    sections = [r for r in fake.requests if not is_summing(r)]
    return {
        "type": report_type.value,
        "requests": f"{len(fake.requests)} ({len(sections)} + {len(fake.requests) - len(sections)})",
        "passages": "/".join(str(len(passages_of(r))) for r in sections),
        "largest prompt (server)": max(fake.prompts),
        "largest prompt (writer)": max(message_tokens(r["messages"]) for r in fake.requests),
        "largest request (server)": max(p + r["max_tokens"] for p, r in zip(fake.prompts, fake.requests, strict=True)),
        "refused": len(fake.refused),
        "references": len(composed.references),
        "checked": composed.verification.counts()["checked"],
        "writer": composed.writer,
        "ms": round(1000 * statistics.median(times)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sources", type=int, default=24)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--chinese", action="store_true")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--types", default="research_report,detailed_report")
    args = parser.parse_args()
    rows = [
        asyncio.run(measure(ReportType(name), args.sources, args.context, args.chinese, args.repeat))
        for name in args.types.split(",")
    ]
    print(f"{args.sources} {'Chinese' if args.chinese else 'English'} sources, context {args.context} tokens")
    columns = list(rows[0])
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in columns) + " |")


if __name__ == "__main__":
    main()
