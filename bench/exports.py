"""Size and render time of the demo report's exports (HTML, PDF, DOCX), side by side in one run.

    python -m bench.exports [--repeat 5]

Builds the report `make demo` builds (the example library ingested for user `demo`, the demo's
question and retrievers, no web keys) through the real server, then renders each export of that
Markdown: once in a fresh Python process (cold: imports, pango and fonts loaded, as the first
download after a server start pays) and `repeat` times in this process (warm, the median).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import websockets
from aiohttp import web

from examples.demo import QUESTION
from fedresearch.core.settings import Settings
from fedresearch.library.ingest import ingest
from fedresearch.library.open import open_library
from fedresearch.report.exports import EXPORT_FORMATS
from fedresearch.web.app import create_app

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "library"
DEMO_RETRIEVERS = "internal_biblio,internal_highlight,tavily,google"
_COLD = """
import sys, time
started = time.perf_counter()
from fedresearch.report.exports import EXPORT_FORMATS
data = EXPORT_FORMATS[sys.argv[1]].render(open(sys.argv[2], encoding="utf-8").read(), "Report", "A4")
print(round((time.perf_counter() - started) * 1000, 1), len(data))
"""


def demo_settings(data_dir: Path) -> Settings:
    """The demo's settings: offline, no web keys, whatever the environment holds."""
    return Settings(
        _env_file=None,
        data_dir=data_dir,
        upstreams=dict.fromkeys(("tavily_api_key", "google_api_key", "google_cx_key", "internal_api_base_url")),
        api_keys=None,
    )


async def demo_report(data_dir: Path) -> str:
    """The Markdown of the report `make demo` writes."""
    settings = demo_settings(data_dir)
    ingest(open_library(settings), "demo", [EXAMPLES])
    runner = web.AppRunner(create_app(settings))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    task = {"task": QUESTION, "headers": {"retrievers": DEMO_RETRIEVERS, "user_id": "demo"}}
    markdown = ""
    try:
        async with websockets.connect(f"ws://127.0.0.1:{port}/ws", max_size=None) as ws:
            await ws.send("start " + json.dumps(task))
            while (frame := json.loads(await ws.recv()))["type"] != "path":
                markdown += frame["output"] if frame["type"] == "report" else ""
    finally:
        await runner.cleanup()
    return markdown


def cold(kind: str, source: Path) -> tuple[float, int]:
    done = subprocess.run([sys.executable, "-c", _COLD, kind, str(source)], capture_output=True, text=True, check=True)
    elapsed, size = done.stdout.split()
    return float(elapsed), int(size)


def warm(kind: str, markdown: str, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        EXPORT_FORMATS[kind].render(markdown, "Report", "A4")
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    repeat = parser.parse_args().repeat
    with tempfile.TemporaryDirectory(prefix="bench-exports-") as folder:
        markdown = asyncio.run(demo_report(Path(folder) / "data"))
        source = Path(folder) / "demo.md"
        source.write_text(markdown, encoding="utf-8")
        references = markdown.split("## References", 1)[-1].count("\n[")
        print(f"demo report: {len(markdown.encode())} bytes of Markdown, {references} references")
        print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; warm = median of {repeat}")
        print(f"{'format':<7}{'size':>10}{'cold ms':>10}{'warm ms':>10}{'warm / html':>13}")
        rows = {kind: (*cold(kind, source), warm(kind, markdown, repeat)) for kind in ("html", "pdf", "docx")}
        for kind, (cold_ms, size, warm_ms) in rows.items():
            ratio = warm_ms / rows["html"][2]
            print(f"{kind:<7}{size / 1024:>8.1f} K{cold_ms:>10.0f}{warm_ms:>10.0f}{ratio:>12.1f}x")


if __name__ == "__main__":
    main()
