"""The library: SQLite is the store of record; a tantivy index and per-user vector matrices derive from it.

Every read takes a `user_id` first and puts it inside the query itself (an exact-match term in
the index, a WHERE clause in SQL, one user's matrix for vectors), so no code path can search
across users.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
import tantivy

from library.chunking import Chunk, chunk_sections
from library.embeddings import Encoder
from library.formats import KINDS, Document
from library.text import ENGLISH_STOPWORDS, cjk_bigrams
from library.vectors import VectorCache

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
    generation INTEGER NOT NULL
);
"""

INDEX_VERSION = "3"  # bump when the tantivy schema changes: the index is rebuilt from SQLite
RRF_K = 60
_QUERY_CACHE = 1024
Mode = Literal["hybrid", "bm25", "dense"]


def _index_schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("user", stored=False, tokenizer_name="raw")
    builder.add_text_field("kind", stored=False, tokenizer_name="raw")
    builder.add_integer_field("document", stored=False, indexed=True)
    builder.add_integer_field("chunk", stored=True, indexed=True)
    builder.add_integer_field("year", stored=False, indexed=True, fast=True)
    builder.add_text_field("tag", stored=False, tokenizer_name="raw")
    builder.add_text_field("author", stored=False, tokenizer_name="raw")
    builder.add_text_field("body", stored=False, tokenizer_name="en_stem")
    builder.add_text_field("cjk", stored=False, tokenizer_name="raw_words")
    return builder.build()


def _analyzers() -> dict[str, tantivy.TextAnalyzer]:
    english = (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
        .filter(tantivy.Filter.remove_long(40))
        .filter(tantivy.Filter.lowercase())
        .filter(tantivy.Filter.custom_stopword(sorted(ENGLISH_STOPWORDS)))
        .filter(tantivy.Filter.stemmer("english"))
        .build()
    )
    words = tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.whitespace()).build()
    return {"en_stem": english, "raw_words": words}


@dataclass(frozen=True)
class SearchFilters:
    """Metadata filters, applied inside both the full-text and the vector search."""

    year_min: int | None = None
    year_max: int | None = None
    authors: tuple[str, ...] = ()  # any of them (case-insensitive, exact name)
    tags: tuple[str, ...] = ()  # any of them (case-insensitive)
    document_ids: tuple[int, ...] = ()

    @property
    def empty(self) -> bool:
        return self == SearchFilters()


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


@dataclass
class Hit:
    chunk_id: int
    rrf: float = 0.0
    bm25: float | None = None
    cosine: float | None = None
    ranks: dict[str, int] = field(default_factory=dict)


class Library:
    def __init__(self, directory: Path, encoder: Encoder | None = None) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.encoder = encoder
        self._db_path = directory / "library.sqlite3"
        self._index_dir = directory / "index"
        self._local = threading.local()
        self._write_lock = threading.Lock()
        self._schema = _index_schema()
        self._english = _analyzers()["en_stem"]
        self._vectors = VectorCache(encoder.dims) if encoder is not None else None
        self._query_vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self._query_lock = threading.Lock()
        self._query_pending: dict[str, Future[np.ndarray]] = {}
        self._db().executescript(_SCHEMA)
        self._index = self._open_index()

    # -- storage ------------------------------------------------------------------------------

    def _db(self) -> sqlite3.Connection:
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
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        db = self._db()
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def _open_index(self) -> tantivy.Index:
        version = self._index_dir / "VERSION"
        if self._index_dir.exists() and (not version.exists() or version.read_text().strip() != INDEX_VERSION):
            shutil.rmtree(self._index_dir)  # derived data: rebuilt from SQLite below
            self._db().execute("UPDATE documents SET indexed = 0")
        self._index_dir.mkdir(exist_ok=True)
        index = tantivy.Index(self._schema, path=str(self._index_dir))
        version.write_text(INDEX_VERSION)
        for name, analyzer in _analyzers().items():
            index.register_tokenizer(name, analyzer)
        return index

    # -- writing ------------------------------------------------------------------------------

    def _embed(self, texts: list[str], on_progress: Callable[[int], None] | None) -> list[bytes | None]:
        if self.encoder is None:
            return [None] * len(texts)
        blobs: list[bytes | None] = []
        for start in range(0, len(texts), 64):
            batch = texts[start : start + 64]
            blobs.extend(vector.tobytes() for vector in self.encoder.encode(batch, batch_size=8))
            if on_progress is not None:
                on_progress(len(batch))
        return blobs

    def add_documents(
        self,
        user_id: str,
        documents: Iterable[Document],
        on_progress: Callable[[int], None] | None = None,
    ) -> IngestOutcome:
        """Store documents in one transaction (unchanged ones are left alone, changed ones replaced).

        Embedding runs before the transaction, so a crash at any point leaves either the old
        state or the new one; the index catches up from the store on the next write.
        """
        documents = list(documents)
        for document in documents:
            if document.kind not in KINDS:
                raise ValueError(f"unknown kind {document.kind!r}")
        known = self._hashes(user_id, [d.source for d in documents])
        fresh = [d for d in documents if known.get(d.source) != d.content_hash]
        chunked = [(d, chunk_sections(d.sections)) for d in fresh]
        texts = [_embedding_text(d.title, c.heading, c.text) for d, chunks in chunked for c in chunks]
        vectors = iter(self._embed(texts, on_progress))
        added = replaced = 0
        with self._write_lock:
            with self._transaction() as db:
                for document, chunks in chunked:
                    row = db.execute(
                        "SELECT id FROM documents WHERE user_id = ? AND source = ?", (user_id, document.source)
                    ).fetchone()
                    if row is not None:
                        db.execute("DELETE FROM documents WHERE id = ?", (row["id"],))
                        replaced += 1
                    else:
                        added += 1
                    self._insert(db, user_id, document, chunks, [next(vectors) for _ in chunks])
                if chunked:
                    self._bump(db, user_id)
            self._index_pending()
        self._embed_missing(user_id, on_progress)
        return IngestOutcome(added=added, replaced=replaced, unchanged=len(documents) - len(fresh))

    def _embed_missing(self, user_id: str, on_progress: Callable[[int], None] | None) -> None:
        """Passages stored without a vector (before the model was installed) get one on the next ingest."""
        if self.encoder is None:
            return
        rows = (
            self._db()
            .execute(
                "SELECT c.id, c.heading, c.text, d.title FROM chunks c JOIN documents d ON d.id = c.document_id"
                " WHERE c.user_id = ? AND c.vector IS NULL",
                (user_id,),
            )
            .fetchall()
        )
        if not rows:
            return
        texts = [_embedding_text(r["title"], r["heading"], r["text"]) for r in rows]
        vectors = self._embed(texts, on_progress)
        with self._write_lock, self._transaction() as db:
            db.executemany(
                "UPDATE chunks SET vector = ? WHERE id = ?", [(v, r["id"]) for v, r in zip(vectors, rows, strict=True)]
            )
            self._bump(db, user_id)

    def _hashes(self, user_id: str, sources: list[str]) -> dict[str, str]:
        hashes: dict[str, str] = {}
        for start in range(0, len(sources), 500):
            part = sources[start : start + 500]
            marks = ",".join("?" * len(part))
            rows = self._db().execute(
                f"SELECT source, content_hash FROM documents WHERE user_id = ? AND source IN ({marks})",
                (user_id, *part),
            )
            hashes.update({row["source"]: row["content_hash"] for row in rows})
        return hashes

    @staticmethod
    def _bump(db: sqlite3.Connection, user_id: str) -> None:
        db.execute(
            "INSERT INTO user_state (user_id, generation) VALUES (?, 1)"
            " ON CONFLICT (user_id) DO UPDATE SET generation = generation + 1",
            (user_id,),
        )

    @staticmethod
    def _insert(
        db: sqlite3.Connection, user_id: str, document: Document, chunks: list[Chunk], vectors: list[bytes | None]
    ) -> None:
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
                for c, vector in zip(chunks, vectors, strict=True)
            ],
        )

    def _index_pending(self) -> None:
        """Bring the index up to the store: documents not yet marked indexed are (re)indexed.

        Removed documents may leave index entries behind; reads join against the store, so
        they are never returned.
        """
        db = self._db()
        pending = db.execute("SELECT id, title, authors, year, tags FROM documents WHERE indexed = 0").fetchall()
        if not pending:
            return
        writer = self._index.writer(heap_size=128_000_000, num_threads=1)
        for document in pending:
            writer.delete_documents_by_term("document", document["id"])
            authors = [name.lower() for name in json.loads(document["authors"])]
            tags = [tag.lower() for tag in json.loads(document["tags"])]
            for chunk in db.execute(
                "SELECT id, user_id, kind, heading, text FROM chunks WHERE document_id = ?", (document["id"],)
            ):
                # The title is part of the body field: a separately weighted title field scored
                # worse on CISI at every weight tried and no better on MED (README, Library).
                title = f"{document['title']} {chunk['heading']}".strip()
                fields: dict[str, Any] = {
                    "user": chunk["user_id"],
                    "kind": chunk["kind"],
                    "document": document["id"],
                    "chunk": chunk["id"],
                    "body": f"{title}\n{chunk['text']}",
                    "cjk": " ".join(cjk_bigrams(f"{title} {chunk['text']}")),
                    "year": document["year"] or 0,
                }
                entry = tantivy.Document(**fields)
                for author in authors:
                    entry.add_text("author", author)
                for tag in tags:
                    entry.add_text("tag", tag)
                writer.add_document(entry)
        writer.commit()
        writer.wait_merging_threads()
        db.executemany("UPDATE documents SET indexed = 1 WHERE id = ?", [(d["id"],) for d in pending])

    def delete_document(self, user_id: str, document_id: int) -> bool:
        with self._write_lock:
            with self._transaction() as db:
                deleted = db.execute(
                    "DELETE FROM documents WHERE user_id = ? AND id = ?", (user_id, document_id)
                ).rowcount
                if deleted:
                    self._bump(db, user_id)
            if deleted:
                writer = self._index.writer(heap_size=16_000_000, num_threads=1)
                writer.delete_documents_by_term("document", document_id)
                writer.commit()
                writer.wait_merging_threads()
        return bool(deleted)

    # -- reading ------------------------------------------------------------------------------

    def query_vector(self, query: str) -> np.ndarray:
        """Encoded once per distinct query: repeats (retries, the same question twice) cost nothing."""
        assert self.encoder is not None
        key = " ".join(query.split())
        with self._query_lock:
            cached = self._query_vectors.get(key)
            if cached is not None:
                self._query_vectors.move_to_end(key)
                return cached
            # several retrievers of one task ask at once: the first encodes, the others wait for it
            pending = self._query_pending.get(key)
            owner = pending is None
            if owner:
                pending = self._query_pending[key] = Future()
        if not owner:
            return pending.result()
        try:
            vector = self.encoder.encode([key])[0]
        except BaseException as error:
            pending.set_exception(error)
            raise
        finally:
            with self._query_lock:
                self._query_pending.pop(key, None)
        with self._query_lock:
            self._query_vectors[key] = vector
            while len(self._query_vectors) > _QUERY_CACHE:
                self._query_vectors.popitem(last=False)
        pending.set_result(vector)
        return vector

    def list_documents(self, user_id: str) -> list[DocumentInfo]:
        rows = self._db().execute(
            "SELECT d.id, d.kind, d.title, d.source, d.added_at, COUNT(c.id) AS chunks"
            " FROM documents d LEFT JOIN chunks c ON c.document_id = d.id"
            " WHERE d.user_id = ? GROUP BY d.id ORDER BY d.id",
            (user_id,),
        )
        return [
            DocumentInfo(row["id"], row["kind"], row["title"], row["source"], row["chunks"], row["added_at"])
            for row in rows
        ]

    def _scope(self, user_id: str, kind: str | None, filters: SearchFilters) -> list[tuple[Any, tantivy.Query]]:
        q, occur = tantivy.Query, tantivy.Occur
        clauses = [(occur.Must, q.term_query(self._schema, "user", user_id))]
        if kind is not None:
            clauses.append((occur.Must, q.term_query(self._schema, "kind", kind)))
        if filters.year_min is not None or filters.year_max is not None:
            clauses.append(
                (
                    occur.Must,
                    q.range_query(
                        self._schema,
                        "year",
                        tantivy.FieldType.Integer,
                        filters.year_min if filters.year_min is not None else -(2**62),
                        filters.year_max if filters.year_max is not None else 2**62,
                    ),
                )
            )
        for name, values in (("author", filters.authors), ("tag", filters.tags)):
            if values:
                clauses.append(
                    (
                        occur.Must,
                        q.boolean_query(
                            [(occur.Should, q.term_query(self._schema, name, value.lower())) for value in values]
                        ),
                    )
                )
        if filters.document_ids:
            clauses.append(
                (
                    occur.Must,
                    q.boolean_query(
                        [(occur.Should, q.term_query(self._schema, "document", i)) for i in filters.document_ids]
                    ),
                )
            )
        return clauses

    def _bm25(
        self, user_id: str, kind: str | None, query: str, filters: SearchFilters, limit: int
    ) -> list[tuple[int, float]]:
        q, occur = tantivy.Query, tantivy.Occur
        terms = []
        for term in dict.fromkeys(self._english.analyze(query)):
            terms.append((occur.Should, q.term_query(self._schema, "body", term)))
        for gram in dict.fromkeys(cjk_bigrams(query)):
            terms.append((occur.Should, q.term_query(self._schema, "cjk", gram)))
        if not terms:
            return []
        full = q.boolean_query([*self._scope(user_id, kind, filters), (occur.Must, q.boolean_query(terms))])
        self._index.reload()
        searcher = self._index.searcher()
        return [(searcher.doc(address)["chunk"][0], score) for score, address in searcher.search(full, limit).hits]

    def _allowed(self, user_id: str, rows: Any, kind: str | None, filters: SearchFilters) -> np.ndarray | None:
        mask = None if kind is None else rows.kinds == kind

        def both(extra: np.ndarray) -> np.ndarray:
            return extra if mask is None else mask & extra

        if filters.year_min is not None:
            mask = both(rows.years >= filters.year_min)
        if filters.year_max is not None:
            mask = both((rows.years <= filters.year_max) & (rows.years > 0))
        if filters.document_ids:
            mask = both(np.isin(rows.document_ids, np.array(filters.document_ids, dtype=np.int64)))
        for column, values in (("authors", filters.authors), ("tags", filters.tags)):
            if values:
                marks = ",".join("?" * len(values))
                ids = [
                    r[0]
                    for r in self._db().execute(
                        f"SELECT DISTINCT d.id FROM documents d, json_each(d.{column}) j"
                        f" WHERE d.user_id = ? AND lower(j.value) IN ({marks})",
                        (user_id, *[v.lower() for v in values]),
                    )
                ]
                mask = both(np.isin(rows.document_ids, np.array(ids, dtype=np.int64)))
        return mask

    def search(
        self,
        user_id: str,
        query: str,
        kind: str | None = None,
        top_k: int = 10,
        mode: Mode = "hybrid",
        filters: SearchFilters | None = None,
        candidates: int = 100,
    ) -> list[tuple[sqlite3.Row, Hit]]:
        """The user's best passages for `query`: BM25, exact vectors, or both fused with RRF."""
        filters = filters or SearchFilters()
        if top_k < 1 or not query.strip():
            return []
        limit = max(candidates, top_k)
        hits: dict[int, Hit] = {}
        if mode in ("hybrid", "bm25"):
            for rank, (chunk_id, score) in enumerate(self._bm25(user_id, kind, query, filters, limit), start=1):
                hit = hits.setdefault(chunk_id, Hit(chunk_id))
                hit.bm25, hit.ranks["bm25"] = score, rank
                hit.rrf += 1.0 / (RRF_K + rank)
        query_vector = None
        if mode in ("hybrid", "dense") and self.encoder is not None and self._vectors is not None:
            query_vector = self.query_vector(query)
            rows = self._vectors.get(self._db(), user_id)
            allowed = self._allowed(user_id, rows, kind, filters)
            for rank, (chunk_id, cosine) in enumerate(rows.search(query_vector, allowed, limit), start=1):
                hit = hits.setdefault(chunk_id, Hit(chunk_id))
                hit.cosine, hit.ranks["dense"] = cosine, rank
                hit.rrf += 1.0 / (RRF_K + rank)
        elif mode == "dense":
            raise RuntimeError("dense search needs the embedding model; see the README's install notes")
        best = sorted(hits.values(), key=lambda h: h.rrf, reverse=True)[:top_k]
        if not best:
            return []
        marks = ",".join("?" * len(best))
        fetched = {
            row["id"]: row
            for row in self._db().execute(
                "SELECT c.id, c.heading, c.page, c.position, c.text, c.kind, c.vector, d.id AS document_id,"
                " d.title, d.authors, d.year, d.doi, d.url, d.tags, d.extra"
                " FROM chunks c JOIN documents d ON d.id = c.document_id"
                f" WHERE c.user_id = ? AND d.user_id = ? AND c.id IN ({marks})",
                (user_id, user_id, *[h.chunk_id for h in best]),
            )
        }
        results = []
        for hit in best:
            row = fetched.get(hit.chunk_id)
            if row is None:
                continue  # left in the index by a removed document
            if hit.cosine is None and query_vector is not None and row["vector"] is not None:
                hit.cosine = float(np.frombuffer(row["vector"], dtype=np.float32) @ query_vector)
            results.append((row, hit))
        return results

    def search_items(
        self,
        user_id: str,
        kind: str | None,
        query: str,
        top_k: int = 10,
        mode: Mode = "hybrid",
        filters: SearchFilters | None = None,
    ) -> list[dict[str, Any]]:
        """Search answered in the internal literature API's item shape (DESIGN.md)."""
        return [
            item_of(row, relevance(hit), "cosine" if hit.cosine is not None else "bm25")
            for row, hit in self.search(user_id, query, kind, top_k, mode, filters)
        ]


def _embedding_text(title: str, heading: str, text: str) -> str:
    heading = heading if heading != title else ""
    return "\n".join(part for part in (title, heading, text) if part)


# BM25 is unbounded; this saturating map is only used when no vector exists for the passage.
_BM25_HALF = 10.0


def relevance(hit: Hit) -> float:
    """A 0..1 score that means the same across queries: the passage's cosine similarity to the query.

    Ranking uses RRF, whose values carry no meaning of their own; the reported score does not.
    """
    if hit.cosine is not None:
        return float(min(1.0, max(0.0, hit.cosine)))
    bm25 = hit.bm25 or 0.0
    return bm25 / (bm25 + _BM25_HALF)


def item_of(row: sqlite3.Row, score: float, score_kind: str = "cosine") -> dict[str, Any]:
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
        "title": row["title"] if kind != "highlight" else None,
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
        "document_id": row["document_id"],
        "title": title,
        "structured_data": structured,
        "section": row["heading"] or None,
        "page": row["page"],
        "tags": json.loads(row["tags"]),
        "score_kind": score_kind,
        **extra,
    }
    item: dict[str, Any] = {"id": identifier, "content": row["text"], "score": round(score, 6), "metadata": metadata}
    if row["url"]:
        item["url"] = row["url"]
    return item
