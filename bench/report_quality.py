"""What the offline writer's reports cite and how they read, per report type, on judged collections.

    python -m bench.report_quality [--collections med,cisi,med-zh,cacm-zh] [--queries 6] [--types research_report,...]
                                   [--keep DIR] [--datasets DIR] [--json FILE]

Each collection (BEIR layout, ../shared/datasets; `med-zh` is MED's questions in Chinese over MED's
corpus) is ingested into an embedded library once (`--keep` reuses it), and each of its first
`--queries` judged questions is researched as a server researches it (`report/task.py`
`run_research`, the library as the only retriever, no model, no pages), once per report type.
Printed per collection and type, averaged over the questions:

- `cited P`: of the library documents the report cites, the share judged relevant; `search P@k`: the
  same for the library search's own first k documents, k the number the report cites (a report that
  picks worse sources than its own search scores under it); `ratio` = cited P / search P@k;
- `answer P`: the same as `cited P` for the sources the research report's answer paragraph cites;
- `cover@20`: of the relevant documents among the search's first 20, the share the report cites;
- `words` of the body (headings, the sources searched and References excluded); `cited %`: the
  body's sentences that carry a citation; `repeats`: sentences stated twice or more;
- `bad heads`: headings that are a cut piece of a source's title, a piece of a word (a fragment of
  a longer word of the evidence, or two CJK characters alone), or not in the question's language;
- `further`: the share of the body's sentences under "Further findings" or "Findings" (其他发现,
  主要发现), what no theme could name;
- `ms`: wall time of the whole task (retrieval included) on this machine.

Printed side by side for whatever checkout is on PYTHONPATH; run it in two checkouts for before and
after. Quality figures do not depend on the machine; times do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.quality import CORPUS_OF, DEFAULT_DATASETS, USER, load_collection, open_library
from fedresearch.core.events import ProgressEvent
from fedresearch.core.models import FusedResult, ReportType, ResearchRequest
from fedresearch.core.settings import Settings
from fedresearch.core.text import cjk_bigrams, split_sentences
from fedresearch.federation.planning import plan_request
from fedresearch.federation.registry import build_registry
from fedresearch.federation.runner import Deps
from fedresearch.library.embeddings import load_encoder
from fedresearch.library.facade import Library
from fedresearch.report import evidence
from fedresearch.report.language import CHINESE, ENGLISH
from fedresearch.report.task import ResearchTask, ResearchTools, gather_sources, run_research, writing_for
from fedresearch.retrievers import ADAPTERS

# the types a question alone can ask, plus the two that need a field (given one here)
TYPES = [t.value for t in ReportType]
_EXTRA: dict[str, dict[str, Any]] = {
    "custom_report": {"custom_prompt": "A short answer in bullet points, at most 300 words, on the evidence only."},
    "subtopic_report": {"existing_headers": []},
}
_CITATION = re.compile(r"\[\[?(\d+)\]")
_MARKS = re.compile(r"(\[\[\d+\]\]\([^)\s]*\)|\[\d+\])+")
_WORD = re.compile(r"[A-Za-z][A-Za-z\-]+")
_LABELS = {
    value for labels in (ENGLISH, CHINESE) for value in vars(labels).values() if isinstance(value, str) and value
}
_ANSWER = re.compile(r"^## (?:Answer|回答)\s*\n(.*?)(?=^## |\Z)", re.MULTILINE | re.DOTALL)
_NUMBER = re.compile(r"\[\[?(\d+)\]")
_FURTHER = re.compile(
    r"^## (?:Further findings|Findings|其他发现|主要发现)\s*\n(.*?)(?=^## |\Z)", re.MULTILINE | re.DOTALL
)
_TAIL = re.compile(r"^## (Sources searched|References|检索的来源|参考文献)\s*$", re.MULTILINE)


@dataclass
class Row:
    cited_p: list[float] = field(default_factory=list)
    answer_p: list[float] = field(default_factory=list)
    search_p: list[float] = field(default_factory=list)
    cover: list[float] = field(default_factory=list)
    words: list[int] = field(default_factory=list)
    cited_share: list[float] = field(default_factory=list)
    repeats: list[int] = field(default_factory=list)
    bad_heads: list[int] = field(default_factory=list)
    heads: list[int] = field(default_factory=list)
    further: list[float] = field(default_factory=list)
    ms: list[float] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)


def doc_id(source: FusedResult, ids: dict[str, str]) -> str | None:
    """The collection's document id a library source stands for (ingested as the record's `source`)."""
    return ids.get(str(source.metadata.get("document_id")))


def body_of(markdown: str) -> str:
    return _TAIL.split(markdown, maxsplit=1)[0]


def prose_lines(body: str) -> list[str]:
    """The body's lines of prose and list items: no headings, no title, no italic notes."""
    found = []
    for line in body.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or (line.startswith("*") and line.endswith("*")):
            continue
        found.append(re.sub(r"^([-*]|\d+(\.\d+)*\.?)\s+", "", line))
    return found


def sentences_of(lines: list[str]) -> list[str]:
    """Sentences with their citations removed (a citation ends a sentence; it starts none)."""
    return [s for line in lines for s in split_sentences(_MARKS.sub("", line)) if len(s) > 3]


def bare(sentence: str) -> str:
    text = re.sub(r"\[\[?\d+\]\]?(\([^)]*\))?", "", sentence)
    return " ".join(text.lower().split()).strip(" .。")


def bad_heading(heading: str, titles: list[str], vocabulary: set[str], chinese: bool) -> bool:
    """A cut piece of a title, a piece of a word, or a heading not in the question's language."""
    text = heading.strip().rstrip("…").strip()
    if text in _LABELS:
        return False
    if heading.strip().endswith("…"):
        return True
    lowered = text.lower()
    for title in titles:
        t = " ".join(title.lower().split())
        if lowered != t and len(lowered) > 3 and lowered in t:
            return True
    cjk = cjk_bigrams(text)
    if chinese and not cjk:
        return True
    if not chinese and cjk:
        return True
    if cjk and len(text) <= 2:
        return True  # two characters alone: most often a piece of a word ("合检")
    return any(word.lower() not in vocabulary for word in _WORD.findall(text))


async def _quiet(_: ProgressEvent) -> None:
    return None


async def research(
    question: str, report_type: str, settings: Settings, tools: ResearchTools, extra: dict[str, Any]
) -> tuple[Any, float]:
    request = ResearchRequest.model_validate(
        {"task": question, "report_type": report_type, "report_source": "local", "headers": {"user_id": USER}} | extra
    )
    plan = plan_request(request, settings, tools.registry)
    started = time.perf_counter()
    outcome = await run_research(ResearchTask(request, plan), tools, _quiet)
    return outcome, (time.perf_counter() - started) * 1000


def score(outcome: Any, qrels: dict[str, int], chinese: bool, row: Row, ids: dict[str, str]) -> None:
    cited = list(dict.fromkeys(d for r in outcome.references if (d := doc_id(r.source, ids)) is not None))
    searched = list(dict.fromkeys(d for s in outcome.sources if (d := doc_id(s, ids)) is not None))
    k = len(cited)
    if k:
        row.cited_p.append(sum(1 for d in cited if qrels.get(d, 0) > 0) / k)
        row.search_p.append(sum(1 for d in searched[:k] if qrels.get(d, 0) > 0) / k)
    answer = _ANSWER.search(outcome.markdown)
    if answer is not None:  # the sources the answer paragraph cites (the report's most read lines)
        numbers = {int(n) for n in _NUMBER.findall(answer.group(1))}
        references = [outcome.references[n - 1].source for n in sorted(numbers) if 0 < n <= len(outcome.references)]
        said = list(dict.fromkeys(d for source in references if (d := doc_id(source, ids)) is not None))
        if said:
            row.answer_p.append(sum(1 for d in said if qrels.get(d, 0) > 0) / len(said))
    relevant_top = [d for d in searched[:20] if qrels.get(d, 0) > 0]
    if relevant_top:
        row.cover.append(sum(1 for d in relevant_top if d in cited) / len(relevant_top))
    body = body_of(outcome.markdown)
    lines = prose_lines(body)
    sentences = sentences_of(lines)
    row.words.append(sum(len(s.split()) + len(cjk_bigrams(s)) for s in sentences))
    if sentences:
        groups = sum(len(_MARKS.findall(line)) for line in lines)
        row.cited_share.append(min(1.0, groups / len(sentences)))
    if sentences:  # what no theme could name: the share of the body's sentences under "Further findings"
        unnamed = _FURTHER.search(body)
        row.further.append(len(sentences_of(prose_lines(unnamed.group(1)))) / len(sentences) if unnamed else 0.0)
    counts = Counter(bare(s) for s in sentences)
    row.repeats.append(sum(n - 1 for n in counts.values() if n > 1))
    titles = [s.title for s in outcome.sources]
    vocabulary = {w.lower() for s in outcome.sources for w in _WORD.findall(f"{s.title} {s.body}")}
    vocabulary |= {w.lower() for w in _WORD.findall(body)}
    headings = [line.lstrip("#").strip() for line in body.splitlines() if line.startswith(("## ", "### "))]
    # a resource's entry is headed by its source's title and number: a title, not a heading made up
    headings = [h for h in headings if not re.search(r"\[\d+\]$", h)]
    bad = [h for h in headings if bad_heading(h, titles, vocabulary, chinese)]
    row.heads.append(len(headings))
    row.bad_heads.append(len(bad))
    row.examples.extend(bad[:2])


def _mean(values: list[float] | list[int]) -> float:
    return statistics.fmean(values) if values else float("nan")


async def run_collection(
    name: str, library: Library, questions: dict[str, str], qrels: dict[str, dict[str, int]], options: Any
) -> dict[str, Row]:
    chinese = name.endswith("-zh")
    settings = Settings(
        _env_file=None,
        data_dir=Path(tempfile.mkdtemp(prefix="bench-rq-")),
        default_user=USER,
        api_keys=None,
        fetch_pages=False,
    )
    rows = {t: Row() for t in options.types}
    ids = {str(info.id): info.source for info in library.list_documents(USER)}
    async with aiohttp.ClientSession() as session:
        tools = ResearchTools(build_registry(settings, ADAPTERS), Deps(session, settings, library=library))
        for question_id, question in list(questions.items())[: options.queries]:
            for report_type in options.types:
                extra = dict(_EXTRA.get(report_type, {}))
                if report_type == "subtopic_report":
                    extra["parent_query"] = question
                    extra["task"] = question
                outcome, ms = await research(question, report_type, settings, tools, extra)
                rows[report_type].ms.append(ms)
                score(outcome, qrels[question_id], chinese, rows[report_type], ids)
                if options.show and question_id == next(iter(questions)):
                    print(f"\n----- {name} {report_type} -----\n{outcome.markdown[:3000]}", flush=True)
    return rows


_RELATIVE = (0.0, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
_FLOORS = (0.0, 0.1, 0.2, 0.3, 0.4)


async def gate_features(
    library: Library, questions: dict[str, str], qrels: dict[str, dict[str, int]], ids: dict[str, str], count: int
) -> list[list[tuple[float | None, float, bool]]]:
    """Per question, each of the search's first 20 sources: its best cosine with the question, its
    share of the question's weight, and whether it is judged relevant."""
    settings = Settings(_env_file=None, data_dir=Path(tempfile.mkdtemp(prefix="bench-rq-")), default_user=USER)
    found = []
    async with aiohttp.ClientSession() as session:
        deps = Deps(session, settings, library=library)
        tools = ResearchTools(build_registry(settings, ADAPTERS), deps)
        for question_id, question in list(questions.items())[:count]:
            request = ResearchRequest(task=question, report_source="local", max_search_results=20)
            plan = plan_request(request, settings, tools.registry)
            sources, _ = await gather_sources(question, plan, tools, _quiet)
            writing = writing_for(request, deps)
            ranked = evidence.rank(question, evidence.gather(sources, {}), writing.embed)
            scores = evidence.relevance(ranked)
            found.append(
                [
                    (c, share, qrels[question_id].get(doc_id(s, ids) or "", 0) > 0)
                    for s in sources[:20]
                    for c, share in [scores.get(s.key, (None, 0.0))]
                ]
            )
    return found


def gate_outcome(
    features: list[list[tuple[float | None, float, bool]]], relative: float, floor: float, dense: bool
) -> tuple[float, float, float]:
    """Precision and recall of the sources the gate keeps (over the search's first 20), and how many it keeps."""
    kept_relevant = kept = relevant = 0
    for question in features:
        values = [(c if dense else share) for c, share, _ in question]
        present = [v for v in values if v is not None]
        top = max(present, default=0.0)
        for value, (_, _, judged) in zip(values, question, strict=True):
            keep = value is not None and value > 0 and value >= max(floor, relative * top)
            kept += keep
            relevant += judged
            kept_relevant += keep and judged
    count = len(features) or 1
    return (kept_relevant / kept if kept else 0.0), (kept_relevant / relevant if relevant else 0.0), kept / count


def gate_sweep(features: dict[str, list[list[tuple[float | None, float, bool]]]]) -> None:
    """Each gate's precision, recall and F1 per collection, and leave-one-collection-out: the gate best
    (by F1) on the other collections, measured on this one."""
    for dense in (True, False):
        signal = "cosine" if dense else "lexical share"
        print(f"\ngate on {signal}: precision / recall / sources kept a question")
        scores: dict[tuple[float, float], dict[str, float]] = {}
        for relative in _RELATIVE:
            for floor in _FLOORS:
                cells = []
                for name, collected in features.items():
                    p, r, n = gate_outcome(collected, relative, floor, dense)
                    f1 = 2 * p * r / (p + r) if p + r else 0.0
                    scores.setdefault((relative, floor), {})[name] = f1
                    cells.append(f"{name} {p:.2f}/{r:.2f}/{n:4.1f}")
                print(f"  relative {relative:.2f} floor {floor:.1f}: " + "   ".join(cells))
        for held in features:
            others = [n for n in features if n != held]
            if not others:
                continue
            choice = max(scores, key=lambda g: statistics.fmean(scores[g][n] for n in others))
            p, r, n = gate_outcome(features[held], *choice, dense)
            print(
                f"  leave {held} out: relative {choice[0]:.2f} floor {choice[1]:.1f}"
                f" -> on {held}: P {p:.2f} R {r:.2f} kept {n:.1f}"
            )


def table(name: str, rows: dict[str, Row]) -> list[str]:
    lines = [
        f"{name}",
        f"  {'type':<16} {'cited P':>7} {'search P@k':>10} {'ratio':>5} {'answer P':>8} {'cover@20':>8} {'words':>6}"
        f" {'cited %':>7} {'repeats':>7} {'bad heads':>11} {'further':>7} {'ms':>7}",
    ]
    for report_type, row in rows.items():
        cited, searched = _mean(row.cited_p), _mean(row.search_p)
        ratio = cited / searched if searched else float("nan")
        heads = f"{sum(row.bad_heads)}/{sum(row.heads)}"
        ms = statistics.median(row.ms) if row.ms else float("nan")
        lines.append(
            f"  {report_type:<16} {cited:7.2f} {searched:10.2f} {ratio:5.2f} {_mean(row.answer_p):8.2f}"
            f" {_mean(row.cover):8.2f}"
            f" {_mean(row.words):6.0f} {100 * _mean(row.cited_share):6.0f}% {_mean(row.repeats):7.1f}"
            f" {heads:>11} {100 * _mean(row.further):6.0f}% {ms:7.0f}"
        )
    return lines


def collection(
    name: str, options: argparse.Namespace, libraries: dict[str, Library], encoder: Any
) -> tuple[str, dict[str, str], dict[str, dict[str, int]]]:
    """A collection's library (opened once: med-zh searches MED's), its questions and judgments."""
    base = CORPUS_OF.get(name, name)
    corpus, questions, qrels = load_collection(options.datasets / name)
    if base not in libraries:
        libraries[base] = open_library(base, corpus, encoder, options.keep)
    return base, questions, qrels


def main(options: argparse.Namespace) -> None:
    encoder = load_encoder()
    libraries: dict[str, Library] = {}
    if options.gate:
        features = {}
        for name in options.collections:
            base, questions, qrels = collection(name, options, libraries, encoder)
            ids = {str(info.id): info.source for info in libraries[base].list_documents(USER)}
            features[name] = asyncio.run(gate_features(libraries[base], questions, qrels, ids, options.queries))
        gate_sweep(features)
        return
    report: list[str] = []
    results: dict[str, dict[str, dict[str, float]]] = {}
    for name in options.collections:
        base, questions, qrels = collection(name, options, libraries, encoder)
        started = time.perf_counter()
        rows = asyncio.run(run_collection(name, libraries[base], questions, qrels, options))
        print(f"{name}: {time.perf_counter() - started:.0f} s", flush=True)
        lines = table(name, rows)
        print("\n".join(lines), flush=True)
        for report_type, row in rows.items():
            if row.examples:
                print(f"    {report_type} bad headings, e.g.: {row.examples[:4]}")
        report.extend(lines)
        results[name] = {
            t: {"cited_p": _mean(r.cited_p), "search_p": _mean(r.search_p), "cover": _mean(r.cover)}
            for t, r in rows.items()
        }
    print("\n" + "\n".join(report))
    if options.json is not None:
        options.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--collections", type=lambda text: text.split(","), default=["med", "cisi", "med-zh"])
    parser.add_argument("--types", type=lambda text: text.split(","), default=TYPES)
    parser.add_argument("--queries", type=int, default=6, help="the first N judged questions of each collection")
    parser.add_argument("--datasets", type=Path, default=DEFAULT_DATASETS)
    parser.add_argument("--keep", type=Path, default=None, help="ingest each library here once, reuse it after")
    parser.add_argument("--json", type=Path, default=None, help="write the precision figures here too")
    parser.add_argument("--gate", action="store_true", help="sweep the relevance gate instead (leave-one-out)")
    parser.add_argument("--show", action="store_true", help="print each type's report on the first question")
    main(parser.parse_args())
