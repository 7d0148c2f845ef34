"""PDF and DOCX made in a process of their own, bounded in time, memory and size.

WeasyPrint and python-docx run as long, and take as much memory, as the Markdown asks: a report of
a 10,000-row table took 108 s and 1.7 GB in the server. Here the Markdown is bounded first (tables
cut at `TABLE_ROWS` rows in all, the whole at `MAX_CHARS` characters), then rendered by
`python -m fedresearch.report.render` under a data-size limit and killed at its deadline: an export
that overruns fails with a reason a reader understands, and the server and its other users never
notice. Callers run `render_apart` in a thread; jobs/reports.py decides how many run at once.
"""

from __future__ import annotations

import json
import re
import resource
import subprocess
import sys
from dataclasses import dataclass

from fedresearch.report.exports import EXPORT_FORMATS

MAX_CHARS = 1_000_000  # a report is 5 to 60 thousand; a million renders in about 11 s on one core
TABLE_ROWS = 500  # rows of tables in all, in a PDF or DOCX; the Markdown and HTML files keep them all
_MEMORY_EXIT = 3
_ROW = re.compile(r"^\s*\|")


@dataclass(frozen=True)
class ExportLimits:
    """How long one PDF or DOCX may take to make (EXPORT_TIMEOUT_S) and the memory it may use
    (EXPORT_MEMORY_MB, the rendering process's data)."""

    timeout_s: float = 60.0
    memory_mb: int = 1024


class ExportFailed(Exception):
    """A file that could not be made, in words for whoever asked for it."""

    def __init__(self, reason: str, too_large: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.too_large = too_large  # the report itself is the cause: asking again will not help


def bounded(markdown: str, kind: str) -> str:
    """The Markdown a PDF or DOCX is made from: tables cut once they hold `TABLE_ROWS` rows in all,
    with a line that says so; a report over `MAX_CHARS` is refused."""
    if len(markdown) > MAX_CHARS:
        raise ExportFailed(
            f"this report is too long to make a {kind.upper()} of ({len(markdown):,} characters; at most "
            f"{MAX_CHARS:,}): its Markdown and HTML files have all of it",
            too_large=True,
        )
    rows = 0
    out: list[str] = []
    cut = 0
    for line in markdown.split("\n"):
        if _ROW.match(line):
            rows += 1
            if rows > TABLE_ROWS:
                cut += 1
                continue
        elif cut:
            out.append(f"\n*{cut:,} more table rows are left out of this {kind.upper()}; the HTML file has them.*\n")
            cut = 0
        out.append(line)
    if cut:
        out.append(f"\n*{cut:,} more table rows are left out of this {kind.upper()}; the HTML file has them.*")
    return "\n".join(out)


def render_apart(kind: str, markdown: str, title: str, page: str, limits: ExportLimits) -> bytes:
    """The file of `kind` (pdf or docx) made in a process of its own; ExportFailed when it cannot be."""
    document = json.dumps({"markdown": bounded(markdown, kind), "title": title, "page": page}).encode()
    command = [sys.executable, "-m", "fedresearch.report.render", kind, str(limits.memory_mb)]
    try:
        done = subprocess.run(command, input=document, capture_output=True, timeout=limits.timeout_s, check=False)
    except subprocess.TimeoutExpired:  # run() has killed it
        raise ExportFailed(
            f"making the {kind.upper()} took longer than {limits.timeout_s:g} s and was stopped; "
            "the Markdown and HTML files have the whole report"
        ) from None
    if done.returncode == 0:
        return done.stdout
    said = done.stderr[-2000:]
    if done.returncode == _MEMORY_EXIT or b"MemoryError" in said or b"memory" in said.lower():
        raise ExportFailed(
            f"making the {kind.upper()} needed more memory than this server gives one file "
            f"({limits.memory_mb} MB); the Markdown and HTML files have the whole report"
        )
    last = said.decode(errors="replace").strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
    raise ExportFailed(f"making the {kind.upper()} failed ({last[0][:200]})")


def main() -> None:
    """The rendering process: a JSON document on stdin, the file on stdout."""
    kind, memory_mb = sys.argv[1], int(sys.argv[2])
    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    document = json.loads(sys.stdin.buffer.read())
    render = EXPORT_FORMATS[kind].render
    assert render is not None
    try:
        made = render(document["markdown"], document["title"], document["page"])
    except MemoryError:
        sys.exit(_MEMORY_EXIT)
    sys.stdout.buffer.write(made)


if __name__ == "__main__":
    main()
