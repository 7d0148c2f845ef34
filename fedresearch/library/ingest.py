"""Walk files and folders into a user's library, reporting what was added, skipped and why."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from fedresearch.library.embedded import Library
from fedresearch.library.formats import READERS, UnsupportedFile, read_file


@dataclass
class IngestReport:
    files: int = 0
    added: int = 0
    replaced: int = 0
    unchanged: int = 0
    skipped: list[str] = field(default_factory=list)


def walk(paths: Iterable[Path]) -> Iterator[Path]:
    """Every readable file under `paths`, folders recursively, in a stable order."""
    for path in paths:
        if path.is_dir():
            for child in sorted(path.rglob("*")):
                if child.is_file() and child.suffix.lower() in READERS and not child.name.startswith("."):
                    yield child
        else:
            yield path


def ingest(
    library: Library,
    user_id: str,
    paths: Iterable[Path],
    kind: str = "highlight",
    on_file: Callable[[Path], None] | None = None,
    on_progress: Callable[[int], None] | None = None,
    max_bytes: int | None = None,
) -> IngestReport:
    report = IngestReport()
    for path in walk(paths):
        report.files += 1
        try:
            if not path.is_file():
                raise UnsupportedFile(f"{path}: no such file")
            size = path.stat().st_size
            if max_bytes is not None and size > max_bytes:
                raise UnsupportedFile(f"{path}: {size / 1e6:.1f} MB is over INGEST_MAX_FILE_MB ({max_bytes / 1e6:g})")
            documents = read_file(path, kind)
            outcome = library.add_documents(user_id, documents, on_progress)
        except UnsupportedFile as error:
            report.skipped.append(str(error))
        else:
            report.added += outcome.added
            report.replaced += outcome.replaced
            report.unchanged += outcome.unchanged
        if on_file is not None:
            on_file(path)
    return report
