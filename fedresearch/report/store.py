"""Saved reports: `<id>.md` and `<id>.json` under the data directory, and their HTML, PDF and DOCX
exports, rendered on first request and kept beside them."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
from pathlib import Path
from typing import Any

from fedresearch.report.exports import RENDERERS

REPORT_ID = re.compile(r"[0-9a-f]{32}")
REPORT_NAME = re.compile(r"^([0-9a-f]{32})\.(md|json|html|pdf|docx)$")
FORMATS = ("md", "pdf", "docx", "html", "json")  # what every path frame lists


_TEMPORARY = itertools.count()  # unique per process without a getrandom call per file (uuid4)


def write_atomic(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{next(_TEMPORARY)}.tmp")
    with open(temporary, "wb") as file:  # live processes never share a name; a dead one's leftover goes
        file.write(data)
    os.replace(temporary, path)


def save_report(directory: Path, report_id: str, markdown: str, record: dict[str, Any]) -> dict[str, str]:
    """Write the Markdown and the JSON; return every format's name relative to the reports directory
    (the exports are rendered when first fetched, so a task never pays for a PDF nobody reads)."""
    if not directory.is_dir():
        directory.mkdir(parents=True, exist_ok=True)
    write_atomic(directory / f"{report_id}.md", markdown.encode())
    # compact: json's C encoder serves only unindented output, the indented one runs in Python
    write_atomic(directory / f"{report_id}.json", json.dumps(record, ensure_ascii=False).encode())
    return {kind: f"{report_id}.{kind}" for kind in FORMATS}


def export(directory: Path, report_id: str, kind: str) -> Path | None:
    """The file of one format, rendered now if it does not exist yet; None when the report does not."""
    path = directory / f"{report_id}.{kind}"
    if path.is_file():
        return path
    source = directory / f"{report_id}.md"
    if kind not in RENDERERS or not source.is_file():
        return None
    markdown = source.read_text(encoding="utf-8")
    title = next((line[2:].strip() for line in markdown.splitlines() if line.startswith("# ")), "Report")
    write_atomic(path, RENDERERS[kind](markdown, title))
    return path


def delete_report(directory: Path, report_id: str) -> bool:
    """Remove a report's Markdown, JSON and every rendered export; whether any file was there."""
    removed = False
    for kind in FORMATS:
        with contextlib.suppress(FileNotFoundError):
            (directory / f"{report_id}.{kind}").unlink()
            removed = True
    return removed
