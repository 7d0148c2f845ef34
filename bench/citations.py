"""Citation checking, measured; and the references a report lists, this checkout against another.

    python -m bench.citations [--build] [--no-encoder] [--float] [--reports 200]
    python -m bench.citations --references [--against DIR]

1. The verifier on a labelled set of sentence–passage pairs (bench/data/verifier_pairs.jsonl, built
   by `--build` from ../shared/datasets (MED, CISI abstracts) and examples/library, seed 11):
   - supported: a sentence of a document with the passage it stands in (as the model sees it, 900
     characters), and the same sentence cut to its first 60-75% of words (a compressed claim);
   - not supported: the sentence with the passage of the most similar other document of the same
     collection (same topic, other findings); the sentence with one of its figures changed; the
     sentence with its two rarest content words replaced by words of that other document.
   Pairs alternate between a calibration half (even index) and a held-out half (odd): the
   threshold is chosen on the first (highest recall at precision >= 0.90), precision and recall of
   "supported" are reported on the second.
2. Final reports' citation precision: a scripted model writes, per report, 6 sentences taken from 5
   passages; each sentence independently cites the wrong passage with probability 0.25, a number
   naming no passage with 0.10, nothing with 0.10, and an invented sentence is added with 0.15.
   Its paragraphs go through the verifier exactly as the LLM writer's do; citation precision is the
   share of kept citations that point at the passage the sentence came from, before and after.
3. `--references`: the demo's report (`make demo`: the example library, its question, offline, the
   library's lexical search) written by this checkout and by DIR (another checkout, e.g.
   `git worktree add /tmp/old main`), each in a process of its own, side by side: how many of its
   references give a year, name an author of the paper (the example library's authors), link a DOI,
   name a library note's section and file; how many paragraphs the References are in the DOCX
   and the HTML and the longest one; the BibTeX and RIS entries fetched from the server (where the
   checkout makes them) and whether they parse back; the time to write 20 references' entries, new
   (the fastest of 3) and seen before (each entry is written once per process).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from fedresearch.core.text import split_sentences
from fedresearch.report.evidence import terms
from fedresearch.report.task import RANKING_TOKENS
from fedresearch.report.verify import Thresholds, Verification, Verifier, strip_markers, verify_paragraph

DATASETS = Path(__file__).resolve().parents[2] / "shared" / "datasets"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "library" / "papers.jsonl"
PAIRS = Path(__file__).resolve().parent / "data" / "verifier_pairs.jsonl"
_PASSAGE = 900
_NUMBER = re.compile(r"\b\d+(?:\.\d+)?\b")


def _sentences(text: str) -> list[str]:
    parts = re.split(r"(?<=[.!?])\s+(?=[A-Za-z])|\s\.\s", text)
    return [" ".join(p.split()).rstrip(" .") + "." for p in parts if 8 <= len(p.split()) <= 45]


def _documents() -> dict[str, list[str]]:
    collections: dict[str, list[str]] = {}
    for name in ("med", "cisi"):
        path = DATASETS / name / "corpus.jsonl"
        docs = [json.loads(line)["text"] for line in path.open()][:400]
        collections[name] = [" ".join(d.split()) for d in docs if len(d) > 300]
    papers = [json.loads(line) for line in EXAMPLES.open()]
    collections["examples"] = [
        " ".join(p.get("abstract", "").split()) for p in papers if len(p.get("abstract", "")) > 200
    ]
    return collections


def _nearest(index: int, bags: list[set[str]]) -> int:
    mine = bags[index]
    return max(
        (j for j in range(len(bags)) if j != index), key=lambda j: len(mine & bags[j]) / (len(mine | bags[j]) or 1)
    )


def build(seed: int = 11) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    pairs: list[dict[str, Any]] = []
    for docs in _documents().values():
        bags = [set(terms(d)) for d in docs]
        for i, doc in enumerate(docs[:150]):
            passage = doc[:_PASSAGE]
            candidates = [s for s in _sentences(passage) if s.rstrip(".") in passage]
            if not candidates:
                continue
            sentence = rng.choice(candidates)
            other = docs[_nearest(i, bags)][:_PASSAGE]
            words = sentence.rstrip(".").split()
            cut = " ".join(words[: max(6, int(len(words) * rng.uniform(0.6, 0.75)))]) + "."
            pairs.append({"kind": "verbatim", "sentence": sentence, "passage": passage, "supported": True})
            pairs.append({"kind": "compressed", "sentence": cut, "passage": passage, "supported": True})
            pairs.append({"kind": "other_document", "sentence": sentence, "passage": other, "supported": False})
            figures = _NUMBER.findall(sentence)
            if figures:
                changed = str(int(float(figures[0])) * 3 + 7)
                altered = _NUMBER.sub(changed, sentence, count=1)
                pairs.append({"kind": "changed_figure", "sentence": altered, "passage": passage, "supported": False})
            swapped = _swap(sentence, passage, other, rng)
            if swapped:
                pairs.append({"kind": "swapped_terms", "sentence": swapped, "passage": passage, "supported": False})
        del bags
    for number, pair in enumerate(pairs):
        pair["split"] = "calibration" if number % 2 == 0 else "held_out"
        pair["source"] = "shared/datasets or examples/library"
    return pairs


def _swap(sentence: str, passage: str, other: str, rng: random.Random) -> str | None:
    """Two of the sentence's content words replaced by words only the other document uses."""
    own = set(re.findall(r"[a-z]{5,}", passage.lower()))
    foreign = sorted(set(re.findall(r"[a-z]{5,}", other.lower())) - own)
    mine = [w for w in re.findall(r"[A-Za-z]{5,}", sentence) if w.lower() in own]
    if len(mine) < 3 or len(foreign) < 2:
        return None
    out = sentence
    for word, new in zip(rng.sample(mine, 2), rng.sample(foreign, 2), strict=True):
        out = re.sub(rf"\b{re.escape(word)}\b", new, out, count=1)
    return out


def _scores(pairs: list[dict[str, Any]], embed: Any) -> list[float]:
    scores = []
    for pair in pairs:
        verifier = Verifier({1: pair["passage"]}, embed)
        scores.append(verifier.scores(pair["sentence"])[1])
    return scores


def _precision_recall(labels: list[bool], scores: list[float], threshold: float) -> tuple[float, float]:
    predicted = [s >= threshold for s in scores]
    hit = sum(p and y for p, y in zip(predicted, labels, strict=True))
    return hit / (sum(predicted) or 1), hit / (sum(labels) or 1)


def calibrate(labels: list[bool], scores: list[float]) -> float:
    best, best_recall = 0.5, -1.0
    for step in range(20, 96):
        threshold = step / 100
        precision, recall = _precision_recall(labels, scores, threshold)
        if precision >= 0.90 and recall > best_recall:
            best, best_recall = threshold, recall
    return best


def verifier_figures(pairs: list[dict[str, Any]], embed: Any) -> float:
    calibration = [p for p in pairs if p["split"] == "calibration"]
    held = [p for p in pairs if p["split"] == "held_out"]
    threshold = calibrate([p["supported"] for p in calibration], _scores(calibration, embed))
    scores = _scores(held, embed)
    labels = [p["supported"] for p in held]
    precision, recall = _precision_recall(labels, scores, threshold)
    kind = "encoder + lexical" if embed else "lexical"
    print(f"verifier ({kind}): threshold {threshold:.2f} from {len(calibration)} calibration pairs")
    print(
        f"  held out ({len(held)} pairs): precision {precision:.3f}  recall {recall:.3f}  (default 0.50: "
        + "precision {:.3f} recall {:.3f})".format(*_precision_recall(labels, scores, 0.5))
    )
    by_kind: Counter[str] = Counter()
    right: Counter[str] = Counter()
    for pair, score in zip(held, scores, strict=True):
        by_kind[pair["kind"]] += 1
        right[pair["kind"]] += (score >= threshold) == pair["supported"]
    print(
        "  per kind (held out, share judged right): "
        + ", ".join(f"{k} {right[k] / by_kind[k]:.2f}" for k in sorted(by_kind))
    )
    return threshold


def report_figures(pairs: list[dict[str, Any]], embed: Any, reports: int, threshold: float, seed: int = 7) -> None:
    # one loop on purpose: the scripted model's draws and the tallies they feed read best together
    rng = random.Random(seed)
    passages = sorted({p["passage"] for p in pairs if p["kind"] == "verbatim"})
    verbatim = {p["passage"]: [] for p in pairs}  # type: dict[str, list[str]]
    for p in pairs:
        if p["kind"] == "verbatim":
            verbatim[p["passage"]].append(p["sentence"])
    before = after = before_ok = after_ok = fabricated = 0
    started = time.perf_counter()
    for _ in range(reports):
        chosen = rng.sample(passages, 5)
        verifier = Verifier({n: text for n, text in enumerate(chosen, start=1)}, embed, Thresholds(support=threshold))
        sentences, truth = [], {}
        for _ in range(6):
            origin = rng.randint(1, 5)
            sentence = rng.choice(verbatim[chosen[origin - 1]]).rstrip(".")
            sentence = sentence[0].upper() + sentence[1:]  # MED and CISI are lowercased; a model writes sentences
            truth[strip_markers(sentence + ".")] = origin
            roll = rng.random()
            cited = (
                rng.choice([n for n in range(1, 6) if n != origin])
                if roll < 0.25
                else 9
                if roll < 0.35
                else None
                if roll < 0.45
                else origin
            )
            if cited is not None:
                before += 1
                before_ok += cited == origin
            sentences.append(f"{sentence} [{cited}]." if cited is not None else f"{sentence}.")
        if rng.random() < 0.15:
            sentences.append("A later survey of 4,000 practitioners found the opposite effect in every setting [2].")
            before += 1
        verification = Verification()
        kept = verify_paragraph(" ".join(sentences), verifier, verification)
        for checked in kept:
            for n in checked.cited:
                after += 1
                after_ok += truth.get(checked.text) == n
                fabricated += n not in verifier.passages
    elapsed = (time.perf_counter() - started) / reports * 1000
    print(f"scripted model, {reports} reports (25% wrong passage, 10% [9], 10% uncited, 15% invented sentence):")
    print(
        f"  citation precision before verification {before_ok / before:.3f}, after {after_ok / (after or 1):.3f};"
        f" fabricated references after: {fabricated}; {elapsed:.0f} ms a report"
    )


def cached_encoder(encoder: Any, pairs: list[dict[str, Any]], int8: bool = True) -> Any:
    """The library's encoder with every text of the set encoded once, in large batches; on its int8
    graph and cut to `RANKING_TOKENS` word pieces, as a server's writer runs it (report/task.py),
    unless `int8` is False."""
    texts = sorted(
        {p["sentence"] for p in pairs}
        | {s[:1000] for p in pairs for s in (split_sentences(p["passage"]) or [p["passage"]])}
    )
    started = time.perf_counter()
    cache = dict(zip(texts, encoder.encode(texts, 64, int8, RANKING_TOKENS if int8 else None), strict=True))
    print(f"encoded {len(texts)} texts in {time.perf_counter() - started:.0f} s", flush=True)

    def embed(batch: list[str]) -> np.ndarray:
        missing = [t for t in batch if t not in cache]
        if missing:
            cache.update(zip(missing, encoder.encode(missing, 16, int8, RANKING_TOKENS if int8 else None), strict=True))
        return np.stack([cache[t] for t in batch])

    return embed


# runs in the checkout measured, so it names only what every checkout since the export registry has
_REFERENCES_CHILD = """
import asyncio, io, json, re, sys, tempfile, time
from pathlib import Path
import aiohttp, docx, websockets
from aiohttp import web
from fedresearch.core.settings import Settings
from fedresearch.library.ingest import ingest
from fedresearch.library.open import open_library
from fedresearch.report.exports import EXPORT_FORMATS
from fedresearch.web.app import create_app
EXAMPLES = Path("examples/library").resolve()
QUESTION = "How should lexical BM25 and dense retrieval be combined with rank fusion?"

async def report(folder):
    settings = Settings(_env_file=None, data_dir=Path(folder), api_keys=None, embeddings=False,
        upstreams=dict.fromkeys(("tavily_api_key", "google_api_key", "google_cx_key", "internal_api_base_url")))
    ingest(open_library(settings), "demo", [EXAMPLES])
    runner = web.AppRunner(create_app(settings))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = "127.0.0.1:%d" % site._server.sockets[0].getsockname()[1]
    task = {"task": QUESTION, "headers": {"retrievers": "internal_biblio,internal_highlight", "user_id": "demo"}}
    markdown, files, fetched = "", {}, {}
    try:
        async with websockets.connect("ws://%s/ws" % base, max_size=None) as ws:
            await ws.send("start " + json.dumps(task))
            while (frame := json.loads(await ws.recv()))["type"] != "path":
                markdown += frame["output"] if frame["type"] == "report" else ""
            files = frame["output"]
        async with aiohttp.ClientSession() as session:
            for kind in ("bib", "ris"):
                if kind in files:
                    async with session.get("http://%s/%s" % (base, files[kind])) as answer:
                        fetched[kind] = await answer.text()
    finally:
        await runner.cleanup()
    return markdown, fetched

with tempfile.TemporaryDirectory() as folder:
    markdown, fetched = asyncio.run(report(folder))
authors = set()
for line in open(EXAMPLES / "papers.jsonl", encoding="utf-8"):
    authors |= {name.split()[-1] for name in json.loads(line).get("authors", [])}
lines = [l for l in markdown.partition("## References")[2].splitlines() if re.match(r"\\[\\d+\\] ", l)]
papers = [l for l in lines if "doi.org/" in l]
said = [re.sub(r"https?://\\S+", "", l) for l in papers]  # what an entry says, its DOI left out
notes = [l for l in lines if "highlight:" in l]
word = docx.Document(io.BytesIO(EXPORT_FORMATS["docx"].render(markdown, "Report", "A4")))
texts = [p.text for p in word.paragraphs]
after = texts[texts.index("References") + 1:] if "References" in texts else []
html = EXPORT_FORMATS["html"].render(markdown, "Report", "A4").decode()
out = {
    "references": len(lines),
    "papers": len(papers),
    "papers with a year": sum(bool(re.search(r"\\b(19|20)\\d\\d\\b", l)) for l in said),
    "papers naming an author": sum(any(a in l for a in authors) for l in said),
    "papers linking a DOI": sum("](https://doi.org/" in l for l in papers),
    "notes": len(notes),
    "notes naming section": sum("section “" in l or " › " in l for l in notes),
    "notes naming file": sum(".md" in l for l in notes),
    "DOCX paragraphs": len(after),
    "DOCX longest chars": max(map(len, after), default=0),
    "HTML blocks": html.partition("<h2>References</h2>")[2].count("<p>"),
}
try:
    import bibtexparser, rispy
    if "bib" in fetched:
        parsed = bibtexparser.parse_string(fetched["bib"])
        out["BibTeX entries"] = len(parsed.entries) if not parsed.failed_blocks else -1
        out["BibTeX unique keys"] = len({e.key for e in parsed.entries})
    if "ris" in fetched:
        out["RIS records"] = len(rispy.loads(fetched["ris"]))
    from fedresearch.core.models import FusedResult
    from fedresearch.report.citations import Citations, reference_entries
    sources = [FusedResult(key=str(n), href="https://doi.org/10.1/%d" % n, title="Title %d" % n, body="", score=1.0,
        retrievers=[], ranks={}, metadata={"type": "paper", "authors": ["Ann Author", "Bo Writer"], "year": 2020,
        "venue": "SIGIR", "doi": "10.1/%d" % n}) for n in range(20)]
    citations = Citations()
    for source in sources:
        citations.cite(source)
    from fedresearch.report import styles
    cold = []
    for _ in range(3):
        getattr(getattr(styles, "entry", None), "cache_clear", lambda: None)()
        started = time.perf_counter()
        reference_entries(citations.references)
        cold.append(time.perf_counter() - started)
    started = time.perf_counter()
    reference_entries(citations.references)
    out["entries ms, 20 new refs"] = round(min(cold) * 1000, 1)
    out["entries ms, 20 seen refs"] = round((time.perf_counter() - started) * 1000, 1)
except ImportError:
    pass
print(json.dumps(out))
"""


def references_figures(against: Path | None) -> None:
    """The demo report's references in this checkout and in `against`, side by side."""
    checkouts = {"this": Path(__file__).resolve().parents[1]}
    if against is not None:
        checkouts[str(against)] = against.resolve()
    figures = {}
    for name, root in checkouts.items():
        env = {**os.environ, "PYTHONPATH": str(root), "FEDRESEARCH_EMBEDDINGS": "false"}
        done = subprocess.run(
            [sys.executable, "-c", _REFERENCES_CHILD], cwd=root, env=env, capture_output=True, text=True, check=True
        )
        figures[name] = json.loads(done.stdout.strip().splitlines()[-1])
    rows = list(dict.fromkeys(key for figure in figures.values() for key in figure))
    print(f"{'':<26}" + "".join(f"{name[-24:]:>26}" for name in figures))
    for row in rows:
        print(f"{row:<26}" + "".join(f"{figure.get(row, '—')!s:>26}" for figure in figures.values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", action="store_true", help="rebuild the labelled set from the datasets")
    parser.add_argument("--no-encoder", action="store_true")
    parser.add_argument("--float", action="store_true", help="the encoder's float graph, not the int8 one")
    parser.add_argument("--reports", type=int, default=200)
    parser.add_argument("--references", action="store_true", help="the demo report's references (3. above)")
    parser.add_argument("--against", type=Path, help="with --references: another checkout, measured beside this one")
    args = parser.parse_args()
    if args.references:
        references_figures(args.against)
        return
    if args.build or not PAIRS.exists():
        PAIRS.parent.mkdir(parents=True, exist_ok=True)
        pairs = build()
        PAIRS.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs), encoding="utf-8")
        print(f"built {len(pairs)} pairs: {dict(Counter(p['kind'] for p in pairs))}")
    pairs = [json.loads(line) for line in PAIRS.open(encoding="utf-8")]
    embed = None
    if not args.no_encoder:
        from fedresearch.library.embeddings import load_encoder

        encoder = load_encoder()
        if encoder is not None:
            embed = cached_encoder(encoder, pairs, int8=not args.float)
    threshold = verifier_figures(pairs, embed)
    for support in sorted({threshold, 0.5}):
        print(f"threshold {support:.2f}:")
        report_figures(pairs, embed, args.reports, support)


if __name__ == "__main__":
    main()
