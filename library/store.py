"""The library: SQLite is the store of record, a tantivy index is derived from it.

Every read takes a `user_id` first and puts it inside the query itself (an exact-match term in
the index, a WHERE clause in SQL), so no code path can search across users.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import tantivy

from library.chunking import chunk_sections
from library.formats import KINDS, Document
from library.text import cjk_bigrams

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
    text TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS chunks_by_document ON chunks(document_id);
CREATE INDEX IF NOT EXISTS chunks_by_user ON chunks(user_id, id);
"""

# BM25 scores are unbounded; this saturating map keeps a given match strength at one score.
_SCORE_HALF = 10.0


def _index_schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("user", stored=False, tokenizer_name="raw")
    builder.add_text_field("kind", stored=False, tokenizer_name="raw")
    builder.add_integer_field("document", stored=False, indexed=True)
    builder.add_integer_field("chunk", stored=True, indexed=True)
    builder.add_text_field("title", stored=False, tokenizer_name="en_stem")
    builder.add_text_field("body", stored=False, tokenizer_name="en_stem")
    builder.add_text_field("cjk", stored=False, tokenizer_name="raw_words")
    return builder.build()


def _analyzers() -> dict[str, tantivy.TextAnalyzer]:
    english = (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
        .filter(tantivy.Filter.remove_long(40))
        .filter(tantivy.Filter.lowercase())
        .filter(tantivy.Filter.stemmer("english"))
        .build()
    )
    words = tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.whitespace()).build()
    return {"en_stem": english, "raw_words": words}


@dataclass(frozen=True)
class DocumentInfo:
    id: int
    kind: str
    title: str
    source: str
    chunks: int
    added_at: str


@dataclass(frozen=True)
class IngestOutcome:
    added: int = 0
    replaced: int = 0
    unchanged: int = 0


class Library:
    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._db_path = directory / "library.sqlite3"
        self._index_dir = directory / "index"
        self._index_dir.mkdir(exist_ok=True)
        self._local = threading.local()
        self._write_lock = threading.Lock()
        self._schema = _index_schema()
        self._index = tantivy.Index(self._schema, path=str(self._index_dir))
        self._english = _analyzers()["en_stem"]
        for name, analyzer in _analyzers().items():
            self._index.register_tokenizer(name, analyzer)
        with self._db() as db:
            db.executescript(_SCHEMA)

    # -- SQLite -------------------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = sqlite3.connect(self._db_path, timeout=30, isolation_level=None)
            connection.row_factory = sqlite3.Row
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA foreign_keys=ON")
            connection.execute("PRAGMA synchronous=NORMAL")
            self._local.connection = connection
        return connection

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        yield self._connection()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        db = self._connection()
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    # -- writing ------------------------------------------------------------------------------

    def add_documents(self, user_id: str, documents: Iterable[Document]) -> IngestOutcome:
        """Store documents (unchanged ones are left alone, changed ones replaced), then index them."""
        added = replaced = unchanged = 0
        with self._write_lock:
            with self._transaction() as db:
                for document in documents:
                    if document.kind not in KINDS:
                        raise ValueError(f"unknown kind {document.kind!r}")
                    digest = document.content_hash
                    row = db.execute(
                        "SELECT id, content_hash FROM documents WHERE user_id = ? AND source = ?",
                        (user_id, document.source),
                    ).fetchone()
                    if row is not None and row["content_hash"] == digest:
                        unchanged += 1
                        continue
                    if row is not None:
                        db.execute("DELETE FROM documents WHERE id = ?", (row["id"],))
                        replaced += 1
                    else:
                        added += 1
                    self._insert(db, user_id, document, digest)
            self._index_pending()
        return IngestOutcome(added=added, replaced=replaced, unchanged=unchanged)

    def _insert(self, db: sqlite3.Connection, user_id: str, document: Document, digest: str) -> None:
        cursor = db.execute(
            "INSERT INTO documents (user_id, kind, source, content_hash, title, authors, year, doi,"
            " url, tags, extra, added_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                user_id,
                document.kind,
                document.source,
                digest,
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
            "INSERT INTO chunks (document_id, user_id, kind, heading, page, position, text)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (cursor.lastrowid, user_id, document.kind, chunk.heading, chunk.page, chunk.position, chunk.text)
                for chunk in chunk_sections(document.sections)
            ],
        )

    def _index_pending(self) -> None:
        """Bring the index up to the store: documents not yet marked indexed are (re)indexed.

        Removed documents may leave index entries behind; reads join against the store, so
        they are never returned.
        """
        db = self._connection()
        pending = [row["id"] for row in db.execute("SELECT id FROM documents WHERE indexed = 0")]
        if not pending:
            return
        writer = self._index.writer(heap_size=64_000_000, num_threads=1)
        for document_id in pending:
            writer.delete_documents_by_term("document", document_id)
            title_row = db.execute("SELECT title FROM documents WHERE id = ?", (document_id,)).fetchone()
            for chunk in db.execute(
                "SELECT id, user_id, kind, heading, text FROM chunks WHERE document_id = ?", (document_id,)
            ):
                title = f"{title_row['title']} {chunk['heading']}".strip()
                writer.add_document(
                    tantivy.Document(
                        user=chunk["user_id"],
                        kind=chunk["kind"],
                        document=document_id,
                        chunk=chunk["id"],
                        title=title,
                        body=chunk["text"],
                        cjk=" ".join(cjk_bigrams(f"{title} {chunk['text']}")),
                    )
                )
        writer.commit()
        writer.wait_merging_threads()
        db.executemany("UPDATE documents SET indexed = 1 WHERE id = ?", [(i,) for i in pending])

    def delete_document(self, user_id: str, document_id: int) -> bool:
        with self._write_lock:
            with self._transaction() as db:
                deleted = db.execute(
                    "DELETE FROM documents WHERE user_id = ? AND id = ?", (user_id, document_id)
                ).rowcount
            if deleted:
                writer = self._index.writer(heap_size=16_000_000, num_threads=1)
                writer.delete_documents_by_term("document", document_id)
                writer.commit()
                writer.wait_merging_threads()
        return bool(deleted)

    # -- reading ------------------------------------------------------------------------------

    def list_documents(self, user_id: str) -> list[DocumentInfo]:
        rows = self._connection().execute(
            "SELECT d.id, d.kind, d.title, d.source, d.added_at, COUNT(c.id) AS chunks"
            " FROM documents d LEFT JOIN chunks c ON c.document_id = d.id"
            " WHERE d.user_id = ? GROUP BY d.id ORDER BY d.id",
            (user_id,),
        )
        return [
            DocumentInfo(row["id"], row["kind"], row["title"], row["source"], row["chunks"], row["added_at"])
            for row in rows
        ]

    def _text_query(self, user_id: str, kind: str, query: str) -> tantivy.Query | None:
        query_q, occur = tantivy.Query, tantivy.Occur
        clauses = []
        for term in dict.fromkeys(self._english.analyze(query)):
            clauses.append((occur.Should, query_q.boost_query(query_q.term_query(self._schema, "title", term), 2.0)))
            clauses.append((occur.Should, query_q.term_query(self._schema, "body", term)))
        for gram in dict.fromkeys(cjk_bigrams(query)):
            clauses.append((occur.Should, query_q.term_query(self._schema, "cjk", gram)))
        if not clauses:
            return None
        return query_q.boolean_query(
            [
                (occur.Must, query_q.term_query(self._schema, "user", user_id)),
                (occur.Must, query_q.term_query(self._schema, "kind", kind)),
                (occur.Must, query_q.boolean_query(clauses)),
            ]
        )

    def search(self, user_id: str, kind: str, query: str, top_k: int = 10) -> list[tuple[sqlite3.Row, float]]:
        """The user's best passages of `kind` for `query`, with BM25 scores."""
        text_query = self._text_query(user_id, kind, query)
        if text_query is None or top_k < 1:
            return []
        self._index.reload()
        searcher = self._index.searcher()
        hits = searcher.search(text_query, limit=top_k).hits
        scores = {searcher.doc(address)["chunk"][0]: score for score, address in hits}
        if not scores:
            return []
        marks = ",".join("?" * len(scores))
        rows = (
            self._connection()
            .execute(
                "SELECT c.id, c.heading, c.page, c.position, c.text, c.kind, d.id AS document_id, d.title,"
                " d.authors, d.year, d.doi, d.url, d.tags, d.extra"
                f" FROM chunks c JOIN documents d ON d.id = c.document_id"
                f" WHERE c.user_id = ? AND d.user_id = ? AND c.id IN ({marks})",
                (user_id, user_id, *scores),
            )
            .fetchall()
        )
        return sorted(((row, scores[row["id"]]) for row in rows), key=lambda pair: pair[1], reverse=True)

    def search_items(self, user_id: str, kind: str, query: str, top_k: int = 10) -> list[dict[str, Any]]:
        """Search answered in the internal literature API's item shape (DESIGN.md)."""
        return [item_of(row, score / (score + _SCORE_HALF)) for row, score in self.search(user_id, kind, query, top_k)]


def item_of(row: sqlite3.Row, score: float) -> dict[str, Any]:
    kind = row["kind"]
    authors = json.loads(row["authors"])
    extra = json.loads(row["extra"])
    if kind == "biblio":
        identifier, id_field = f"biblio:{row['document_id']}", "biblio_id"
    elif kind == "highlight":
        identifier, id_field = f"highlight:{row['id']}", "highlight_id"
    else:
        identifier, id_field = f"file:{row['document_id']}", "file_id"
        if row["page"] is not None:
            identifier += f"#page={row['page']}"
    structured: dict[str, Any] = {
        "title": row["title"] if kind == "biblio" else None,
        "year": row["year"],
        "authors": [{"name": name} for name in authors],
    }
    if row["doi"] and kind != "highlight":
        structured["doi"] = row["doi"]
    title = row["title"]
    if kind != "biblio" and row["heading"] and row["heading"] != title:
        title = f"{title} › {row['heading']}"  # one note's sections are separate sources
    metadata: dict[str, Any] = {
        id_field: identifier.split(":", 1)[1],
        "title": title,
        "structured_data": structured,
        "section": row["heading"] or None,
        "page": row["page"],
        "tags": json.loads(row["tags"]),
        **extra,
    }
    item: dict[str, Any] = {"id": identifier, "content": row["text"], "score": round(score, 6), "metadata": metadata}
    if row["url"]:
        item["url"] = row["url"]
    return item
