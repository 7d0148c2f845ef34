"""Main-text extraction from web pages: candidates side by side on the same pages.

Pages are built from real abstracts (../shared/datasets/med) wrapped in the boilerplate real sites
carry (navigation, cookie banner, sidebar of related links, comments, footer, scripts and styles).
For each extractor: ms per page, recall of the article's sentences, and how much boilerplate leaks.
"trafilatura, as served" is the call fedresearch/report/pages.py makes for a URL without a title
(metadata for the title, the short date search); "…, a result's page" the one for a search result,
which has its title (no metadata); "…, full date search" the first with trafilatura's default date
search.

    python -m bench.extract [--pages 200]
    python -m bench.extract --html-dir DIR   # real saved pages: time per page and text length only
    python -m bench.extract --eval-corpus DIR   # trafilatura's evaluation corpus: CPU and F1, as served

With `--html-dir`, every *.html file under DIR (the Rust book rustup installs, under
~/.rustup/toolchains/*/share/doc/rust/html/book, is 100-odd real pages) is read by each extractor,
with no article to check against: CPU time per page and the characters kept.

With `--eval-corpus`, DIR is the tests/ folder of a trafilatura checkout (`evaldata.json`, and 990
real pages of many languages under eval/ and cache/, each annotated with up to six passages its main
text must hold and six it must not): the read as served (trafilatura's fallback only where its own
pass found under 1,000 characters), with the fallback always, and never, for a result's page and for
a page read for its title too. Printed: CPU per page (median, and in all), and the precision, recall
and F1 of the passages, scored as trafilatura's own evaluation scores them (whitespace-normalized
substrings).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import time
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

DATASET = Path(__file__).resolve().parent.parent.parent / "shared" / "datasets" / "med" / "corpus.jsonl"
CISI = DATASET.parent.parent / "cisi" / "corpus.jsonl"
BOILERPLATE = [
    "Subscribe to our newsletter for weekly updates",
    "We use cookies to improve your experience",
    "Copyright 2026 Example Health Media Group",
    "Related articles you may have missed",
    "Sign in to leave a comment on this story",
    "Advertise with us and reach millions of readers",
]


def page(title: str, paragraphs: list[str], rng: random.Random) -> str:
    nav = "".join(f'<li><a href="/section/{i}">Section {i} news</a></li>' for i in range(25))
    related = "".join(f'<li><a href="/story/{rng.randint(1, 10**6)}">{BOILERPLATE[3]} {i}</a></li>' for i in range(8))
    comments = "".join(f'<div class="comment"><p>{BOILERPLATE[4]}: great read {i}!</p></div>' for i in range(3))
    body = "".join(f"<p>{p}</p>" for p in paragraphs)
    return f"""<!doctype html><html><head><title>{title} | Example Health</title>
<style>body{{font-family:sans-serif}} .nav li{{display:inline}}</style>
<script>window.analytics = {{track: function(){{}}}}; var ads = "{BOILERPLATE[5]}";</script></head>
<body><div class="cookie-banner">{BOILERPLATE[1]}. <button>Accept</button></div>
<header><nav class="nav"><ul>{nav}</ul></nav><div class="promo">{BOILERPLATE[0]}</div></header>
<main><article><h1>{title}</h1><p class="byline">By Staff Writer, 3 May 2026</p>{body}</article>
<aside class="sidebar"><h3>Related</h3><ul>{related}</ul></aside><section class="comments">{comments}</section></main>
<footer><p>{BOILERPLATE[2]}. All rights reserved.</p><p>{BOILERPLATE[5]}</p></footer></body></html>"""


def site(paragraphs: int = 8) -> web.Application:
    """A web site for reading under load: any path is an article of `paragraphs` of CISI's abstracts
    (real prose, unlike MED's lowercase ones), chosen by the path, in the boilerplate `page` adds:
    about 10 kB a page, the same page for the same path."""
    records = [json.loads(line) for line in CISI.read_text().splitlines()]

    async def answer(request: web.Request) -> web.Response:
        rng = random.Random(zlib.crc32(request.path.encode()))
        chosen = rng.sample(records, paragraphs)
        markup = page(chosen[0].get("title") or "A study", [record["text"] for record in chosen], rng)
        return web.Response(text=markup, content_type="text/html")

    app = web.Application()
    app.router.add_get("/{path:.*}", answer)
    return app


def extractors() -> dict[str, Callable[[str], str]]:
    found: dict[str, Callable[[str], str]] = {}
    try:
        import trafilatura

        from fedresearch.report.pages import extract

        found["trafilatura"] = lambda html: (
            trafilatura.extract(html, include_comments=False, favor_precision=True) or ""
        )

        def served(html: str, titled: bool = True) -> str:
            page = extract("https://example.org/a", "https://example.org/a", "text/html", html.encode(), titled)
            return page.sections[0].text

        def full_date_search(html: str) -> str:
            found = trafilatura.bare_extraction(
                html, url="https://example.org/a", include_comments=False, favor_precision=True, with_metadata=True
            )
            return str(getattr(found, "text", "") or "")

        found["trafilatura, as served"] = served
        found["…, a result's page"] = lambda html: served(html, titled=False)
        found["…, full date search"] = full_date_search
    except ImportError:
        pass
    try:
        from lxml import html as lxml_html
        from readability import Document

        def readability_text(markup: str) -> str:
            return lxml_html.fromstring(Document(markup).summary()).text_content()

        found["readability-lxml"] = readability_text
    except ImportError:
        pass
    try:
        from resiliparse.extract.html2text import extract_plain_text
        from resiliparse.parse.html import HTMLTree

        found["resiliparse"] = lambda html: extract_plain_text(HTMLTree.parse(html), main_content=True)
    except ImportError:
        pass
    return found


def saved_pages(directory: Path) -> None:
    pages = [path.read_text(encoding="utf-8", errors="replace") for path in sorted(directory.rglob("*.html"))]
    print(f"{len(pages)} pages from {directory}, {statistics.mean(map(len, pages)) / 1000:.1f} kB each on average")
    for name, extract in extractors().items():
        times, kept = [], 0
        for markup in pages:
            started = time.process_time()
            with contextlib.suppress(Exception):  # a page an extractor cannot read: nothing kept
                kept += len(extract(markup))
            times.append((time.process_time() - started) * 1000)
        total = sum(times) / 1000
        print(f"{name:<24} {statistics.median(times):6.2f} ms/page CPU (total {total:.2f} s)  kept {kept:,} chars")


def eval_corpus(directory: Path) -> None:
    import trafilatura

    from fedresearch.federation import pages as served

    annotations = json.loads((directory / "evaldata.json").read_text(encoding="utf-8"))
    corpus = []
    for url, item in sorted(annotations.items()):
        found = [directory / part / item["file"] for part in ("cache", "eval")]
        path = next((candidate for candidate in found if candidate.is_file()), None)
        if path is not None:
            corpus.append((url, item, path.read_bytes()))
    print(f"{len(corpus)} annotated pages from {directory}")
    real = trafilatura.bare_extraction

    below = served._FALLBACK_BELOW_CHARS

    def always(fast: bool) -> Callable[..., object]:
        return lambda *args, **options: real(*args, **{**options, "fast": fast})

    for titled in (False, True):
        for name, call, fallback_below in (
            ("as served", real, below),
            ("fallback always", always(False), 0),
            ("fallback never", always(True), 0),
        ):
            served.trafilatura.bare_extraction = call  # type: ignore[attr-defined]
            served._FALLBACK_BELOW_CHARS = fallback_below
            times, hits = [], Counter[str]()
            for url, item, body in corpus:
                started = time.process_time()
                try:
                    text = " ".join(served.extract(url, url, "text/html", body, titled).sections[0].text.split())
                except served.PageSkipped:
                    text = ""
                times.append((time.process_time() - started) * 1000)
                kept = [" ".join(passage.split()) in text for passage in item["with"]]
                leaked = [" ".join(passage.split()) in text for passage in item["without"]]
                hits.update(tp=sum(kept), fn=len(kept) - sum(kept), fp=sum(leaked))
            served.trafilatura.bare_extraction = real  # type: ignore[attr-defined]
            served._FALLBACK_BELOW_CHARS = below
            precision = hits["tp"] / (hits["tp"] + hits["fp"])
            recall = hits["tp"] / (hits["tp"] + hits["fn"])
            f1 = 2 * precision * recall / (precision + recall)
            label = f"{name}, {'for its title' if titled else 'a result'}"
            print(
                f"{label:<34} {statistics.median(times):6.2f} ms/page CPU (total {sum(times) / 1000:6.2f} s)"
                f"  precision {precision:.3f}  recall {recall:.3f}  F1 {f1:.3f}",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--html-dir", type=Path, help="measure on the saved pages under this folder instead")
    parser.add_argument("--eval-corpus", type=Path, help="trafilatura's tests/ folder: CPU and F1 on its corpus")
    args = parser.parse_args()
    if args.eval_corpus is not None:
        eval_corpus(args.eval_corpus)
        return
    if args.html_dir is not None:
        saved_pages(args.html_dir)
        return
    rng = random.Random(7)
    records = [json.loads(line) for line in DATASET.read_text().splitlines()[: args.pages * 3]]
    pages = []
    for i in range(args.pages):
        chosen = records[i * 3 : i * 3 + 3]
        paragraphs = [r["text"] for r in chosen if r.get("text")]
        pages.append((page(chosen[0].get("title") or f"Study {i}", paragraphs, rng), paragraphs))
    print(f"{len(pages)} pages, {statistics.mean(len(h) for h, _ in pages) / 1000:.1f} kB each on average")
    for name, extract in extractors().items():
        times, recalls, leaks = [], [], []
        for markup, paragraphs in pages:
            started = time.perf_counter()
            text = " ".join(extract(markup).split())
            times.append((time.perf_counter() - started) * 1000)
            words = [" ".join(p.split()[:8]) for p in paragraphs]
            recalls.append(sum(w in text for w in words) / len(words))
            leaks.append(sum(b in text for b in BOILERPLATE) / len(BOILERPLATE))
        print(
            f"{name:<24} {statistics.median(times):6.2f} ms/page (p90 {statistics.quantiles(times, n=10)[-1]:.2f})"
            f"  article recall {statistics.mean(recalls):.3f}  boilerplate leaked {statistics.mean(leaks):.3f}"
        )


if __name__ == "__main__":
    main()
