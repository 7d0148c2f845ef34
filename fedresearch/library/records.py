"""The store of record: documents and their passages (with vectors) in SQLite.

Everything else the library keeps (the full-text index, the in-memory vectors) derives from these
tables and is rebuilt from them. Every query names the user, so no path reads across users.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from fedresearch.library.chunking import Chunk
from fedresearch.library.formats import Document

_SCHEMA = """
CREATE TABLE IF NOT EXISTS documents (
    id INTEGER PRIMARY KEY,
    user_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    source TEXT NOT NULL,
    content_hash TEXT NOT NULL,
    title TEXT NOT NULL,
    authors TEXT NOT NULL DEFAULT '[]',
    year INTEGER,
    doi TEXT,
    url TEXT,
    tags TEXT NOT NULL DEFAULT '[]',
    extra TEXT NOT NULL DEFAULT '{}',
    indexed INTEGER NOT NULL DEFAULT 0,
    added_at TEXT NOT NULL,
    UNIQUE (user_id, source)
);
CREATE TABLE IF NOT EXISTS chunks (
    id INTEGER PRIMARY KEY,
    document_id INTEGER NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
    user_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    heading TEXT NOT NULL DEFAULT '',
    page INTEGER,
    position INTEGER NOT NULL,
    text TEXT NOT NULL,
    vector BLOB
);
CREATE INDEX IF NOT EXISTS chunks_by_document ON chunks(document_id);
CREATE INDEX IF NOT EXISTS chunks_by_user ON chunks(user_id, id);
CREATE TABLE IF NOT EXISTS user_state (
    user_id TEXT PRIMARY KEY,
    generation INTEGER NOT NULL,
    removed INTEGER NOT NULL DEFAULT 0
);
"""

# what a search needs of a passage and its document, in one row
PASSAGE_COLUMNS = (
    "c.id, c.heading, c.page, c.position, c.text, c.kind, c.vector, d.id AS document_id,"
    " d.title, d.authors, d.year, d.doi, d.url, d.tags, d.extra, d.source"
)


@dataclass(frozen=True)
class DocumentInfo:
    id: int
    kind: str
    title: str
    source: str
    chunks: int
    added_at: str


@dataclass(frozen=True)
class Prepared:
    """A document ready to store: its passages and one vector (or None) per passage."""

    document: Document
    chunks: list[Chunk]
    vectors: list[bytes | None]


_BUSY_S = 30.0  # how long a connection waits for another's lock


def _use_wal(connection: sqlite3.Connection) -> None:
    """Two processes opening a new library at once (two `ingest`s, the workers of `serve`) both
    switch it to WAL, which needs the file to itself: SQLite then answers "database is locked" at
    once, without waiting its busy timeout (1 process in 240 failed so, 4 at a time). Once the
    file is in WAL mode the switch is a no-op and never waits."""
    deadline = time.monotonic() + _BUSY_S
    while True:
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


class Records:
    """SQLite with one connection per thread (WAL: readers never wait for the writer)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.local()
        self.db().executescript(_SCHEMA)
        columns = {row["name"] for row in self.db().execute("PRAGMA table_info(user_state)")}
        if "removed" not in columns:  # a library made before removals were counted
            self.db().execute("ALTER TABLE user_state ADD COLUMN removed INTEGER NOT NULL DEFAULT 0")

    def db(self) -> sqlite3.Connection:
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = sqlite3.connect(self.path, timeout=_BUSY_S, isolation_level=None)
            connection.row_factory = sqlite3.Row
            _use_wal(connection)
            connection.execute("PRAGMA foreign_keys=ON")
            connection.execute("PRAGMA synchronous=NORMAL")
            self._local.connection = connection
        return connection

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        db = self.db()
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    # -- writing ------------------------------------------------------------------------------

    def store(self, user_id: str, prepared: Sequence[Prepared]) -> tuple[int, int]:
        """Store documents in one transaction, replacing earlier versions; (added, replaced)."""
        added = replaced = 0
        with self.transaction() as db:
            for item in prepared:
                row = db.execute(
                    "SELECT id FROM documents WHERE user_id = ? AND source = ?", (user_id, item.document.source)
                ).fetchone()
                if row is not None:
                    db.execute("DELETE FROM documents WHERE id = ?", (row["id"],))
                    replaced += 1
                else:
                    added += 1
                _insert(db, user_id, item)
            if prepared:
                _bump(db, user_id, removed=replaced > 0)
        return added, replaced

    def set_vectors(self, user_id: str, vectors: Sequence[tuple[bytes | None, int]]) -> None:
        with self.transaction() as db:
            db.executemany("UPDATE chunks SET vector = ? WHERE id = ?", vectors)
            _bump(db, user_id)

    def delete(self, user_id: str, document_id: int) -> bool:
        with self.transaction() as db:
            deleted = db.execute("DELETE FROM documents WHERE user_id = ? AND id = ?", (user_id, document_id)).rowcount
            if deleted:
                _bump(db, user_id, removed=True)
        return bool(deleted)

    def mark_indexed(self, document_ids: Sequence[int]) -> None:
        self.db().executemany("UPDATE documents SET indexed = 1 WHERE id = ?", [(i,) for i in document_ids])

    def mark_all_unindexed(self) -> None:
        self.db().execute("UPDATE documents SET indexed = 0")

    # -- reading ------------------------------------------------------------------------------

    def hashes(self, user_id: str, sources: list[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        for start in range(0, len(sources), 500):
            part = sources[start : start + 500]
            marks = ",".join("?" * len(part))
            rows = self.db().execute(
                f"SELECT source, content_hash FROM documents WHERE user_id = ? AND source IN ({marks})",
                (user_id, *part),
            )
            found.update({row["source"]: row["content_hash"] for row in rows})
        return found

    def without_vectors(self, user_id: str) -> list[sqlite3.Row]:
        return (
            self.db()
            .execute(
                "SELECT c.id, c.heading, c.text, d.title FROM chunks c JOIN documents d ON d.id = c.document_id"
                " WHERE c.user_id = ? AND c.vector IS NULL",
                (user_id,),
            )
            .fetchall()
        )

    def indexed_chunk_count(self) -> int:
        """How many passages the full-text index must hold: those of documents marked indexed."""
        query = "SELECT COUNT(*) FROM chunks c JOIN documents d ON d.id = c.document_id WHERE d.indexed = 1"
        return int(self.db().execute(query).fetchone()[0])

    def unindexed(self) -> list[sqlite3.Row]:
        return self.db().execute("SELECT id, title, authors, year, tags FROM documents WHERE indexed = 0").fetchall()

    def chunks_of(self, document_id: int) -> list[sqlite3.Row]:
        return (
            self.db()
            .execute("SELECT id, user_id, kind, heading, text FROM chunks WHERE document_id = ?", (document_id,))
            .fetchall()
        )

    def passages(self, user_id: str, chunk_ids: Sequence[int]) -> dict[int, sqlite3.Row]:
        if not chunk_ids:
            return {}
        marks = ",".join("?" * len(chunk_ids))
        rows = self.db().execute(
            f"SELECT {PASSAGE_COLUMNS} FROM chunks c JOIN documents d ON d.id = c.document_id"
            f" WHERE c.user_id = ? AND d.user_id = ? AND c.id IN ({marks})",
            (user_id, user_id, *chunk_ids),
        )
        return {row["id"]: row for row in rows}

    def document_passages(self, user_id: str, document_id: int) -> list[sqlite3.Row]:
        return list(
            self.db().execute(
                "SELECT id, heading, page, position, text FROM chunks WHERE user_id = ? AND document_id = ?"
                " ORDER BY position, id",
                (user_id, document_id),
            )
        )

    def documents(self, user_id: str) -> list[DocumentInfo]:
        rows = self.db().execute(
            "SELECT d.id, d.kind, d.title, d.source, d.added_at, COUNT(c.id) AS chunks"
            " FROM documents d LEFT JOIN chunks c ON c.document_id = d.id"
            " WHERE d.user_id = ? GROUP BY d.id ORDER BY d.id",
            (user_id,),
        )
        return [DocumentInfo(r["id"], r["kind"], r["title"], r["source"], r["chunks"], r["added_at"]) for r in rows]

    def document_ids_with(self, user_id: str, column: str, values: Sequence[str]) -> list[int]:
        """Documents whose `authors` or `tags` list holds any of `values` (case-insensitive)."""
        if column not in ("authors", "tags"):
            raise ValueError(f"no list column {column!r}")
        marks = ",".join("?" * len(values))
        rows = self.db().execute(
            f"SELECT DISTINCT d.id FROM documents d, json_each(d.{column}) j"
            f" WHERE d.user_id = ? AND lower(j.value) IN ({marks})",
            (user_id, *[value.lower() for value in values]),
        )
        return [row[0] for row in rows]

    def user_ids(self) -> list[str]:
        return [row[0] for row in self.db().execute("SELECT DISTINCT user_id FROM documents ORDER BY user_id")]

    def document_rows(self, user_id: str) -> list[sqlite3.Row]:
        """Every column of the user's documents, oldest first (what `library migrate` copies)."""
        return self.db().execute("SELECT * FROM documents WHERE user_id = ? ORDER BY id", (user_id,)).fetchall()

    def stored_chunks(self, user_id: str, document_id: int) -> list[sqlite3.Row]:
        return (
            self.db()
            .execute(
                "SELECT heading, page, position, text, vector FROM chunks WHERE user_id = ? AND document_id = ?"
                " ORDER BY position, id",
                (user_id, document_id),
            )
            .fetchall()
        )

    def generation(self, user_id: str) -> int:
        return self.state(user_id)[0]

    def state(self, user_id: str) -> tuple[int, int]:
        """The user's generation (moved by every write) and how many writes removed passages: a
        removed passage's id can be given again (SQLite reuses the largest rowid once it is gone),
        so a reader that appends what is new must reload whole after a removal."""
        row = self.db().execute("SELECT generation, removed FROM user_state WHERE user_id = ?", (user_id,)).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    def vector_rows(self, user_id: str, after_id: int) -> list[sqlite3.Row]:
        """(chunk id, document id, kind, year or 0, vector) of the user's embedded passages past `after_id`."""
        return (
            self.db()
            .execute(
                "SELECT c.id, c.document_id, c.kind, COALESCE(d.year, 0), c.vector FROM chunks c"
                " JOIN documents d ON d.id = c.document_id"
                " WHERE c.user_id = ? AND c.id > ? AND c.vector IS NOT NULL ORDER BY c.id",
                (user_id, after_id),
            )
            .fetchall()
        )

    def vectors_up_to(self, user_id: str, last_id: int) -> int:
        row = (
            self.db()
            .execute(
                "SELECT COUNT(*) FROM chunks WHERE user_id = ? AND id <= ? AND vector IS NOT NULL", (user_id, last_id)
            )
            .fetchone()
        )
        return int(row[0])


def _bump(db: sqlite3.Connection, user_id: str, removed: bool = False) -> None:
    """Every write moves the user's generation, which tells every reader (any process) to reload; a
    write that removed passages counts as such too (Records.state)."""
    db.execute(
        "INSERT INTO user_state (user_id, generation, removed) VALUES (?, 1, ?)"
        " ON CONFLICT (user_id) DO UPDATE SET generation = generation + 1, removed = removed + excluded.removed",
        (user_id, int(removed)),
    )


def _insert(db: sqlite3.Connection, user_id: str, item: Prepared) -> None:
    document = item.document
    cursor = db.execute(
        "INSERT INTO documents (user_id, kind, source, content_hash, title, authors, year, doi,"
        " url, tags, extra, added_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            user_id,
            document.kind,
            document.source,
            document.content_hash,
            document.title,
            json.dumps(document.authors, ensure_ascii=False),
            document.year,
            document.doi,
            document.url,
            json.dumps(document.tags, ensure_ascii=False),
            json.dumps(document.extra, ensure_ascii=False),
            datetime.now(UTC).isoformat(),
        ),
    )
    db.executemany(
        "INSERT INTO chunks (document_id, user_id, kind, heading, page, position, text, vector)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (cursor.lastrowid, user_id, document.kind, c.heading, c.page, c.position, c.text, vector)
            for c, vector in zip(item.chunks, item.vectors, strict=True)
        ],
    )
