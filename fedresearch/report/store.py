"""Saved reports: `<id>.md` and `<id>.json` under the data directory, served over HTTP."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

REPORT_NAME = re.compile(r"^[0-9a-f]{32}\.(md|json)$")


def _write_atomic(path: Path, text: str) -> None:
    # the report id is a fresh uuid, so its own temporary name is unique without mkstemp's search
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "x", encoding="utf-8") as file:
        file.write(text)
    os.replace(temporary, path)


def save_report(directory: Path, report_id: str, markdown: str, record: dict[str, Any]) -> dict[str, str]:
    """Write both files; return their names relative to the reports directory."""
    directory.mkdir(parents=True, exist_ok=True)
    _write_atomic(directory / f"{report_id}.md", markdown)
    _write_atomic(directory / f"{report_id}.json", json.dumps(record, ensure_ascii=False, indent=2))
    return {"md": f"{report_id}.md", "json": f"{report_id}.json"}
