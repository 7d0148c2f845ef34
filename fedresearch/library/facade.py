"""The library: what every caller uses (ingest, search, list, delete), over either store of record,
the embedded one (embedded.py) or PostgreSQL (postgres.py) for a `postgresql://` location.

Every read takes a `user_id` first and puts it inside the query itself, so no code path can search
across users; searches are hybrid: BM25 and the encoder's vectors, fused (search.py).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedresearch.core.work import WorkPool
from fedresearch.library.chunking import chunk_sections
from fedresearch.library.crosslingual import passage_reading, query_texts
from fedresearch.library.embedded import EmbeddedStore
from fedresearch.library.embeddings import Encoder
from fedresearch.library.formats import KINDS, Document
from fedresearch.library.fulltext import FullTextIndex
from fedresearch.library.query_vectors import QueryVectors
from fedresearch.library.records import DocumentInfo, Prepared, Records
from fedresearch.library.search import (
    DEFAULT_AGGREGATION,
    Aggregation,
    Mode,
    Passage,
    Ranked,
    Row,
    SearchFilters,
    fuse_documents,
    fuse_rankings,
)
from fedresearch.library.store import Ranking, Store
from fedresearch.library.vectors import VECTOR_CACHE_MB

Progress = Callable[[int], None]
log = logging.getLogger(__name__)
POSTGRES_SCHEMES = ("postgresql://", "postgres://")
_INGEST_THREADS = 2
# how many times a search is ranked again when a passage it ranked was replaced before it was read
# (PostgreSQL reads the ranking and the passages in two statements: 11% of searches for a note
# being replaced found neither version)
_SEARCH_ATTEMPTS = 5


@dataclass(frozen=True)
class IngestOutcome:
    added: int = 0
    replaced: int = 0
    unchanged: int = 0


def open_store(
    location: Path | str,
    dims: int | None,
    read_timeout_s: float | None = None,
    transaction_pooling: bool = False,
    vector_cache_mb: int = VECTOR_CACHE_MB,
) -> Store:
    """The embedded store in a folder, or PostgreSQL for a `postgresql://` URL (whose reads the
    server ends after `read_timeout_s`; `transaction_pooling`: the URL is a pooler in transaction
    mode). `vector_cache_mb`: the embedded store's bound on the users' vectors it keeps."""
    if isinstance(location, str) and location.startswith(POSTGRES_SCHEMES):
        try:
            from fedresearch.library.postgres import PostgresStore  # psycopg: the optional `postgres` extra
        except ImportError as error:
            raise RuntimeError(
                f'the library on PostgreSQL needs the postgres extra: pip install "fedresearch[postgres]" ({error})'
            ) from error
        return PostgresStore(location, dims, read_timeout_s=read_timeout_s, transaction_pooling=transaction_pooling)
    return EmbeddedStore(Path(location), dims, vector_cache_mb)


class Library:
    def __init__(
        self,
        location: Path | str,
        encoder: Encoder | None = None,
        read_timeout_s: float | None = None,
        transaction_pooling: bool = False,
        vector_cache_mb: int = VECTOR_CACHE_MB,
    ) -> None:
        """`location`: the embedded library's folder, or a `postgresql://` URL; `read_timeout_s`:
        how long a read may run on PostgreSQL (its callers give up by then: RETRIEVER_TIMEOUT_S);
        `transaction_pooling`: that URL is a pooler in transaction mode; `vector_cache_mb`: how much
        of the users' vectors the embedded library keeps in memory (LIBRARY_VECTOR_CACHE_MB)."""
        self.encoder = encoder
        dims = encoder.dims if encoder is not None else None
        self.store = open_store(location, dims, read_timeout_s, transaction_pooling, vector_cache_mb)
        # the server's calls to the library run here, not on asyncio's default pool: searches
        # held up by a slow or locked database then never hold up host-name lookups and page reads
        # (as many threads as that pool has)
        self.threads = WorkPool(min(32, (os.cpu_count() or 1) + 4), "fedresearch-library")
        # uploads read, cut and embed files on threads of their own, a few: six users' uploads at
        # once took all of `threads`, and every other user's searches waited for them (minutes)
        self.ingest_threads = WorkPool(_INGEST_THREADS, "fedresearch-ingest")
        self._query_vectors = QueryVectors(encoder) if encoder is not None else None
        # snippets of records found elsewhere, scored against questions (knowledge/retrieval.py)
        # (passes of 8: a question, or a request past its deadline, waits for at most one short pass)
        self._text_vectors = QueryVectors(encoder, entries=8192, batch=8) if encoder is not None else None
        # BM25 beside the vector search (its threads start with the first search)
        self._beside = ThreadPoolExecutor(8, "library-bm25") if self.store.concurrent_searches else None

    @property
    def embedded(self) -> EmbeddedStore:
        """The embedded store, for what only it has (its SQLite records and tantivy index)."""
        if not isinstance(self.store, EmbeddedStore):
            raise RuntimeError("this library is on PostgreSQL: it has no embedded records or index")
        return self.store

    @property
    def records(self) -> Records:
        return self.embedded.records

    @property
    def index(self) -> FullTextIndex:
        return self.embedded.index

    def close(self) -> None:
        """Its threads and connections end, and its model is let go: whoever still holds a closed
        library (aiohttp's middleware cache keeps every app it served, and its state with it)
        then holds a few objects, not the model's 250 MB."""
        self.threads.close()
        self.ingest_threads.close()
        if self._beside is not None:
            self._beside.shutdown()
        self.store.close()
        self.encoder = self._query_vectors = self._text_vectors = None

    # -- writing ------------------------------------------------------------------------------

    def add_documents(
        self, user_id: str, documents: Iterable[Document], on_progress: Progress | None = None
    ) -> IngestOutcome:
        """Store documents in one transaction (unchanged ones are left alone, changed ones replaced).

        Embedding runs before the transaction, so a crash at any point leaves either the old
        state or the new one; the index catches up from the store on the next write.
        """
        documents = list(documents)
        for document in documents:
            if document.kind not in KINDS:
                raise ValueError(f"unknown kind {document.kind!r}")
        known = self.store.hashes(user_id, [d.source for d in documents])
        fresh = [d for d in documents if known.get(d.source) != d.content_hash]
        chunked = [(d, chunk_sections(d.sections)) for d in fresh]
        texts = [embedding_text(d.title, c.heading, c.text) for d, chunks in chunked for c in chunks]
        vectors = iter(self._embed(texts, on_progress))
        prepared = [Prepared(d, chunks, [next(vectors) for _ in chunks]) for d, chunks in chunked]
        added, replaced = self.store.store(user_id, prepared)
        self._embed_missing(user_id, on_progress)
        return IngestOutcome(added=added, replaced=replaced, unchanged=len(documents) - len(fresh))

    def _embed(self, texts: list[str], on_progress: Progress | None) -> list[bytes | None]:
        if self.encoder is None:
            return [None] * len(texts)
        blobs: list[bytes | None] = []
        for start in range(0, len(texts), 64):
            batch = texts[start : start + 64]
            blobs.extend(vector.tobytes() for vector in self.encoder.encode(batch, batch_size=8))
            if on_progress is not None:
                on_progress(len(batch))
        return blobs

    def _embed_missing(self, user_id: str, on_progress: Progress | None) -> None:
        """Passages stored without a vector (before the model was installed) get one on the next ingest."""
        if self.encoder is None:
            return
        rows = self.store.without_vectors(user_id)
        if not rows:
            return
        vectors = self._embed([embedding_text(r["title"], r["heading"], r["text"]) for r in rows], on_progress)
        self.store.set_vectors(user_id, [(v, r["id"]) for v, r in zip(vectors, rows, strict=True)])

    def document_passages(self, user_id: str, document_id: int) -> list[Row]:
        """The user's document's passages in order (empty when it is not the user's)."""
        return self.store.document_passages(user_id, document_id)

    def delete_document(self, user_id: str, document_id: int) -> bool:
        return self.store.delete(user_id, document_id)

    # -- reading ------------------------------------------------------------------------------

    def list_documents(self, user_id: str) -> list[DocumentInfo]:
        return self.store.documents(user_id)

    def health(self) -> str:
        return self.store.health()

    def unavailable(self) -> str | None:
        return self.store.unavailable()

    def query_vector(self, query: str) -> np.ndarray:
        """The question's vector, read in English where it is Chinese (crosslingual.py): the encoder
        reads English, and the cosines reported beside a Chinese question mean what they do for English."""
        return self.text_vector(query_texts(query).dense)

    def text_vector(self, text: str) -> np.ndarray:
        """The encoder's vector of `text` as it is (cached like a question's)."""
        if self._query_vectors is None:
            raise RuntimeError("no embedding model: query vectors need it; see the README's install notes")
        return self._query_vectors(text)

    def text_vectors(self, texts: list[str], deadline: float | None = None) -> list[np.ndarray | None]:
        """Vectors of short texts, cached and batched across callers; None for those whose pass had
        not started by `deadline` (time.monotonic())."""
        if self._text_vectors is None:
            raise RuntimeError("no embedding model: text vectors need it; see the README's install notes")
        return self._text_vectors.many(texts, deadline)

    def search(
        self,
        user_id: str,
        query: str,
        kind: str | None = None,
        top_k: int = 10,
        mode: Mode = "hybrid",
        filters: SearchFilters | None = None,
        candidates: int = 100,
        documents: bool = False,
        aggregation: Aggregation = DEFAULT_AGGREGATION,
    ) -> list[Passage]:
        """The user's best passages for `query`: BM25, exact vectors, or both fused with RRF.

        With `documents`, each hit is a document (its best passage, scored as the document) and
        `top_k` counts documents: a paper's passages never take two places.
        """
        filters = filters or SearchFilters()
        if top_k < 1 or not query.strip():
            return []
        limit = max(candidates, top_k * 3 if documents else top_k)
        for attempt in range(_SEARCH_ATTEMPTS):
            bm25, dense, query_vector = self.rankings(user_id, query, kind, mode, filters, limit)
            if documents:
                wanted = list({chunk for chunk, _ in (*bm25, *dense)})
                found = self.store.passages(user_id, wanted)
                document_of = {chunk: row["document_id"] for chunk, row in found.items()}
                best = fuse_documents(bm25, dense, document_of, top_k, aggregation)
            else:
                best = fuse_rankings(bm25, dense, top_k)
                wanted = [hit.chunk_id for hit in best]
                found = self.store.passages(user_id, wanted)
            # a passage ranked but gone when read: its document was replaced (or deleted) between
            # the two reads, and its new version may have been ranked nowhere; rank again
            if len(found) == len(set(wanted)) or attempt == _SEARCH_ATTEMPTS - 1:
                break
        return self._passages(best, found, query_vector)

    def rankings(
        self, user_id: str, query: str, kind: str | None, mode: Mode, filters: SearchFilters, limit: int
    ) -> tuple[list[tuple[int, float]], list[tuple[int, float]], np.ndarray | None]:
        """The BM25 and the vector ranking of the user's passages (chunk id, score), and the query vector."""
        if mode == "dense" and self.encoder is None:
            raise RuntimeError("dense search needs the embedding model; see the README's install notes")
        vectors = mode != "bm25" and self.encoder is not None
        # a Chinese question searched in English too, in either store, each word in the sense the
        # user's library uses most
        texts = query_texts(query, counts=lambda words: self.store.term_counts(user_id, words))
        if mode == "dense":
            bm25: Future[Ranking] | Ranking = []
        elif vectors and self._beside is not None and self.store.concurrent_searches:
            bm25 = self._beside.submit(self.store.bm25, user_id, kind, texts.full_text, filters, limit)
        else:
            bm25 = self.store.bm25(user_id, kind, texts.full_text, filters, limit)
        dense: Ranking = []
        query_vector = None
        try:
            if vectors:
                query_vector = self.text_vector(texts.dense)
                dense = self.store.dense(user_id, query_vector, kind, filters, limit)
        finally:
            if isinstance(bm25, Future):
                bm25 = bm25.result()  # waited for even when the vector search failed: no search outlives the call
        return bm25, dense, query_vector

    @staticmethod
    def _passages(best: list[Ranked], found: dict[int, Row], query_vector: np.ndarray | None) -> list[Passage]:
        passages = []
        for hit in best:
            row = found.get(hit.chunk_id)
            if row is None:
                continue  # left in the index by a removed document
            if hit.cosine is None and query_vector is not None and row["vector"] is not None:
                hit.cosine = float(np.frombuffer(row["vector"], dtype=np.float32) @ query_vector)
            passages.append(Passage.of(row, hit))
        return passages


def embedding_text(title: str, heading: str, text: str) -> str:
    """What the encoder reads of a passage: its title, heading and text, Chinese read in English."""
    heading = heading if heading != title else ""
    return passage_reading("\n".join(part for part in (title, heading, text) if part))
