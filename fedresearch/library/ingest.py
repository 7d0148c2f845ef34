"""Walk files and folders into a user's library, reporting what was added, skipped and why.

One bad file never stops a run: whatever reading it raises, it is reported in `skipped` and the
walk goes on. Links that lead outside the roots given are not followed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from fedresearch.library.facade import Library
from fedresearch.library.formats import READERS, UnsupportedFile, read_file
from fedresearch.library.locking import IndexBusy
from fedresearch.library.store import LibraryUnavailable

log = logging.getLogger(__name__)


@dataclass
class IngestReport:
    files: int = 0
    added: int = 0
    replaced: int = 0
    unchanged: int = 0
    skipped: list[str] = field(default_factory=list)


def walk(paths: Iterable[Path]) -> Iterator[Path]:
    """Every readable file under `paths`, folders recursively, in a stable order.

    Links are yielded too: `ingest` reads one found in a folder only when its target lies inside the
    folders given, and reports the others as skipped.
    """
    for path in paths:
        if path.is_dir():
            for child in sorted(path.rglob("*")):
                readable = child.suffix.lower() in READERS and not child.name.startswith(".")
                if readable and (child.is_file() or child.is_symlink()):
                    yield child
        else:
            yield path


def shown(path: Path) -> str:
    """`path` as printable text, even when its name is not valid UTF-8."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


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
    paths = list(paths)
    roots = [path.resolve() for path in paths if path.is_dir()]
    for path in walk(paths):
        report.files += 1
        try:
            _refuse_unreadable(path, max_bytes, None if path in paths else roots)
            outcome = library.add_documents(user_id, read_file(path, kind), on_progress)
        except UnsupportedFile as error:
            report.skipped.append(str(error))
        except (IndexBusy, LibraryUnavailable):
            raise  # the library's state, not this file's: every next file would wait as long, or fail alike
        except Exception as error:  # a reader's bug on a hostile file must not end the run
            log.exception("ingest of %s failed", shown(path))
            report.skipped.append(f"{shown(path)}: could not be read ({type(error).__name__}: {error})"[:500])
        else:
            report.added += outcome.added
            report.replaced += outcome.replaced
            report.unchanged += outcome.unchanged
        if on_file is not None:
            on_file(path)
    return report


def _refuse_unreadable(path: Path, max_bytes: int | None, roots: list[Path] | None) -> None:
    """Raise UnsupportedFile for a file not to read; `roots`: the folders it was found in (None: named outright)."""
    name = shown(path)
    if name != str(path):
        raise UnsupportedFile(f"{name}: the file name is not UTF-8; rename it")
    if roots is not None and path.is_symlink() and not any(path.resolve().is_relative_to(r) for r in roots):
        raise UnsupportedFile(f"{name}: a link to {path.resolve()}, outside the folders given; not followed")
    if not path.is_file():
        raise UnsupportedFile(f"{name}: no such file")
    size = path.stat().st_size
    if max_bytes is not None and size > max_bytes:
        raise UnsupportedFile(f"{name}: {size / 1e6:.1f} MB is over INGEST_MAX_FILE_MB ({max_bytes / 1e6:g})")


Status = Literal["added", "replaced", "unchanged", "skipped"]


@dataclass(frozen=True)
class FileOutcome:
    """What became of one uploaded file: its documents added, replaced or left as they were, or the
    file skipped and why."""

    file: str
    status: Status
    reason: str | None = None
    documents: int = 0
    added: int = 0
    replaced: int = 0
    unchanged: int = 0


def ingest_uploads(library: Library, user_id: str, saved: Sequence[tuple[str, Path]], kind: str) -> list[FileOutcome]:
    """Each uploaded file (its name, where it was saved) into the user's library, its documents'
    sources named `upload:NAME`; one that cannot be read is skipped with why. Runs in a thread."""
    results = []
    for name, path in saved:
        try:
            documents = [
                dataclasses.replace(document, source=document.source.replace(str(path), f"upload:{name}", 1))
                for document in read_file(path, kind)
            ]
            outcome = library.add_documents(user_id, documents)
        except UnsupportedFile as error:
            results.append(FileOutcome(name, "skipped", str(error).replace(str(path), name)))
            continue
        except (IndexBusy, LibraryUnavailable):
            raise  # the library's state, not this file's
        except Exception as error:  # a reader's bug on a hostile file must not end the upload
            log.exception("ingest of upload %s failed", name)
            results.append(FileOutcome(name, "skipped", f"could not be read ({type(error).__name__})"))
            continue
        status: Status = "added" if outcome.added else "replaced" if outcome.replaced else "unchanged"
        counts = {"added": outcome.added, "replaced": outcome.replaced, "unchanged": outcome.unchanged}
        results.append(FileOutcome(name, status, None, len(documents), **counts))
    return results
