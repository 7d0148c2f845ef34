"""Saved reports: `<id>.json` under the data directory (the record, the Markdown in its `report`),
and its Markdown, HTML, PDF and DOCX files, rendered on first request and kept beside it."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fedresearch.report.exports import EXPORT_FORMATS
from fedresearch.report.markup import read_text
from fedresearch.report.render import ExportLimits, render_apart

log = logging.getLogger("fedresearch")

REPORT_ID = re.compile(r"[0-9a-f]{32}")
REPORT_NAME = re.compile(rf"^([0-9a-f]{{32}})\.({'|'.join(map(re.escape, EXPORT_FORMATS))})$")


_UNKEPT = "unkept"  # in the name of a file rendered without what it needed: served once, then replaced
_TEMPORARY = itertools.count()  # unique per process without a getrandom call per file (uuid4)


def write_atomic(path: Path | str, data: bytes) -> None:
    folder, name = os.path.split(path)  # strings: a Path built and turned back cost 5 µs, each
    temporary = f"{folder}/.{name}.{os.getpid()}.{next(_TEMPORARY)}.tmp"
    with open(temporary, "wb") as file:  # live processes never share a name; a dead one's leftover goes
        file.write(data)
    os.replace(temporary, path)


def record_bytes(markdown: str, record: dict[str, Any]) -> bytes:
    """The saved JSON: `record`, with the Markdown as its `report`."""
    # compact: json's C encoder serves only unindented output, the indented one runs in Python
    return json.dumps({**record, "report": markdown}, ensure_ascii=False).encode()


def save_report(directory: Path, report_id: str, data: bytes) -> dict[str, str]:
    """Write the JSON record (`data`, from record_bytes); return every format's name relative to the
    reports directory. The Markdown file, like the exports, is written when first fetched: every
    file created is an inode allocated, and on ext4 without a journal each allocation skips one by
    one the inodes retention freed in the last minute (six, while their block of the inode table
    is not yet written back), while most clients never fetch the Markdown file (the report reaches
    them in frames). Where the job store keeps the records (jobs.py), the record too is written
    only when first asked for."""
    try:
        write_atomic(f"{directory}/{report_id}.json", data)
    except FileNotFoundError:  # no folder yet: made on the first report, not checked at every one
        directory.mkdir(parents=True, exist_ok=True)
        write_atomic(f"{directory}/{report_id}.json", data)
    return report_files(report_id)


def report_files(report_id: str) -> dict[str, str]:
    """Every format's name relative to the reports directory, as `path` frames list them."""
    return {kind: f"{report_id}.{kind}" for kind in EXPORT_FORMATS}


_NOT_IN_NAMES = re.compile(r"[^\w]+")  # \w keeps letters of every script: a Chinese question names its file


def file_name(question: str, kind: str, most: int = 60) -> str:
    """A report's file named after its question, for people: its words joined by hyphens, cut at a
    word within `most` characters ("report" when nothing of it can name a file)."""
    words = [word for word in _NOT_IN_NAMES.split(question.lower()) if word and word != "_"]
    name = ""
    for word in words:
        if name and len(name) + 1 + len(word) > most:
            break
        name = f"{name}-{word}" if name else word[:most]
    return f"{name or 'report'}.{kind}"


def content_disposition(question: str, kind: str, attachment: bool = True) -> str:
    """A `Content-Disposition` naming a report's file after its question (`file_name`): the browser
    saves `how-does-rank-fusion-work.pdf`, not the report's id. A name beyond ASCII (a Chinese
    question) goes in `filename*` (RFC 6266, RFC 8187's UTF-8 encoding), with `report.KIND` as the
    plain `filename` for a client that reads only that."""
    name = file_name(question, kind)
    disposition = "attachment" if attachment else "inline"
    if name.isascii():
        return f'{disposition}; filename="{name}"'
    return f"{disposition}; filename=\"report.{kind}\"; filename*=UTF-8''{quote(name, safe='')}"


def report_markdown(directory: Path, report_id: str) -> str | None:
    """A saved report's Markdown: its file where one was written (by earlier versions, or a fetch),
    else its record's `report`; None when there is no such report."""
    try:
        return (directory / f"{report_id}.md").read_text(encoding="utf-8")
    except (FileNotFoundError, ValueError):
        pass
    try:
        record = json.loads((directory / f"{report_id}.json").read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None
    markdown = record.get("report") if isinstance(record, dict) else None
    return markdown if isinstance(markdown, str) else None


def report_record(directory: Path, report_id: str) -> dict[str, Any] | None:
    """A saved report's JSON record; None when there is no such report."""
    try:
        record = json.loads((directory / f"{report_id}.json").read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def export(
    directory: Path, report_id: str, kind: str, page: str = "A4", limits: ExportLimits | None = None
) -> Path | None:
    """The file of one format, rendered now if it does not exist yet; None when the report does not.
    A file this host cannot render well (a PDF of Chinese text without a font for it) says so at its
    top and is not kept: it is rendered again when next asked for, once the host has what it lacked.
    With `limits`, PDF and DOCX are made in a process of their own within them (ExportFailed if not)."""
    path = directory / f"{report_id}.{kind}"
    if path.is_file():
        return path
    form = EXPORT_FORMATS.get(kind)
    if form is not None and form.from_record is not None:
        record = report_record(directory, report_id)
        if record is None:
            return None
        write_atomic(path, form.from_record(record))
        return path
    if form is None or form.render is None:  # no such format, or the record itself (there when the report is)
        return None
    markdown = report_markdown(directory, report_id)
    if markdown is None:
        return None
    title = next((read_text(line[2:].strip()) for line in markdown.splitlines() if line.startswith("# ")), "Report")
    lacking = form.lacks(markdown) if form.lacks is not None else None
    if lacking is not None:
        log.warning("report %s as %s: %s; not kept, made again when next asked for", report_id, kind, lacking)
        markdown = f"> **Note:** {lacking}.\n\n{markdown}"
        path = directory / f"{report_id}.{_UNKEPT}.{kind}"
    if form.apart and limits is not None:
        made = render_apart(kind, markdown, title, page, limits)
    else:
        made = form.render(markdown, title, page)
    write_atomic(path, made)
    return path


def drop_reports(directory: Path, report_ids: list[str]) -> int:
    """`delete_report` for each report with a file here; how many had. A stat each, not five
    unlinks: where the job store keeps the records, most reports never get a file."""
    here = [i for i in report_ids if any(os.path.exists(f"{directory}/{i}.{kind}") for kind in ("json", "md"))]
    return sum(delete_report(directory, report_id) for report_id in here)


def delete_report(directory: Path, report_id: str) -> bool:
    """Remove a report's Markdown, JSON and every rendered export; whether any file was there."""
    removed = False
    for kind in EXPORT_FORMATS:
        for name in (f"{report_id}.{kind}", f"{report_id}.{_UNKEPT}.{kind}"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{directory}/{name}")
                removed = True
    return removed
