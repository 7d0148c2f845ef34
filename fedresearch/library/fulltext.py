"""The full-text index: tantivy BM25 over passages, derived from the store of record.

English is stemmed with stopwords removed; CJK text is indexed a second time as character bigrams,
because no tokenizer here splits Chinese words. The user id is an exact-match term inside every
query, so matching starts inside one user's slice rather than filtering after it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tantivy

from fedresearch.core.text import STOPWORDS, cjk_bigrams
from fedresearch.library.locking import WRITER_WAIT_S, IndexBusy
from fedresearch.library.records import Records
from fedresearch.library.search import SearchFilters, indexed_texts

INDEX_VERSION = "3"  # bump when the schema changes: the index is then rebuilt from SQLite
_FAR = 2**62


def _schema() -> tantivy.Schema:
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
        .filter(tantivy.Filter.custom_stopword(sorted(STOPWORDS)))
        .filter(tantivy.Filter.stemmer("english"))
        .build()
    )
    words = tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.whitespace()).build()
    return {"en_stem": english, "raw_words": words}


class FullTextIndex:
    """`repaired` says what opening had to fix (None: the index was whole), for the caller to log."""

    def __init__(self, directory: Path, records: Records) -> None:
        self.directory = directory
        self.schema = _schema()
        self._english = _analyzers()["en_stem"]
        self.repaired: str | None = None
        self._index = self._open(records)

    def _open(self, records: Records) -> tantivy.Index:
        """The index, rebuilt from SQLite (the store of record) when it is missing, stale or unreadable."""
        if (problem := self._unusable()) is not None:
            self._reset(records, problem)
        try:
            index = self._create()
        except ValueError as error:  # tantivy's "Data corrupted" for a garbage meta.json, and the like
            self._reset(records, f"the index could not be opened ({error})")
            index = self._create()
        found, expected = index.searcher().num_docs, records.indexed_chunk_count()
        if found < expected:  # more is harmless: reads join against the store
            self._reset(records, f"the index holds {found} of the {expected} passages SQLite marks indexed")
            index = self._create()
        return index

    def _unusable(self) -> str | None:
        if not self.directory.exists() and not self.directory.is_symlink():
            return None  # a new library, or a deleted index: the count check below tells which
        if not self.directory.is_dir():
            return "a file stands where the index folder belongs"
        version = self.directory / "VERSION"
        if not version.is_file() or version.read_text(errors="replace").strip() != INDEX_VERSION:
            return f"the index is not version {INDEX_VERSION}"
        return None

    def _reset(self, records: Records, problem: str) -> None:
        # a link to a folder (an operator's index on another disk) stays: its folder is rebuilt there
        folder = self.directory.resolve() if self.directory.is_symlink() else self.directory
        if folder.is_dir():
            # Renamed first: a reader another Library or worker holds on this folder recreates its
            # lock file here by path when meta.json changes, which made rmtree in place fail with
            # "Directory not empty"; after the rename its late file lands in the new index, harmless.
            discarded = folder.with_name(f"{folder.name}.discarded-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            folder.rename(discarded)
            shutil.rmtree(discarded)
            if folder != self.directory:
                folder.mkdir()
        elif self.directory.exists() or self.directory.is_symlink():
            self.directory.unlink()  # a file, or a link to nothing: rebuilt in a folder of its own here
        records.mark_all_unindexed()  # derived data: rebuilt from SQLite by catch_up
        self.repaired = f"{problem}: rebuilding it from SQLite"

    def _create(self) -> tantivy.Index:
        self.directory.mkdir(exist_ok=True)
        index = tantivy.Index(self.schema, path=str(self.directory))
        (self.directory / "VERSION").write_text(INDEX_VERSION)
        for name, analyzer in _analyzers().items():
            index.register_tokenizer(name, analyzer)
        return index

    def catch_up(self, records: Records) -> None:
        """Index every document the store has not marked indexed (new, replaced, or after a rebuild).

        Removed documents may leave entries behind; reads join against the store, so they are
        never returned.
        """
        pending = records.unindexed()
        if not pending:
            return
        writer = self._writer(128_000_000)
        for document in pending:
            writer.delete_documents_by_term("document", document["id"])
            for chunk in records.chunks_of(document["id"]):
                writer.add_document(self._entry(document, chunk))
        writer.commit()
        writer.wait_merging_threads()
        records.mark_indexed([document["id"] for document in pending])

    def health(self, records: Records) -> str:
        """What opening found and did, and whether the index now holds every indexed passage."""
        self._index.reload()
        found, expected = self._index.searcher().num_docs, records.indexed_chunk_count()
        pending = len(records.unindexed())
        state = "repaired: " + self.repaired if self.repaired else "whole when opened"
        lines = [f"full-text index: {state}", f"passages in SQLite marked indexed: {expected}; in the index: {found}"]
        if pending:
            lines.append(f"{pending} documents still wait to be indexed (another process holds the index?)")
        return "\n".join(lines)

    def _writer(self, heap_size: int) -> tantivy.IndexWriter:
        """The index's one writer, waiting up to WRITER_WAIT_S while another process (an ingest) holds it."""
        deadline = time.monotonic() + WRITER_WAIT_S
        while True:
            try:
                return self._index.writer(heap_size=heap_size, num_threads=1)
            except ValueError as error:
                if "LockBusy" not in str(error):
                    raise
                if time.monotonic() > deadline:
                    raise IndexBusy(
                        f"another process (an ingest?) has been writing the full-text index for over "
                        f"{WRITER_WAIT_S:g} s; what is stored in SQLite is indexed by the next write or restart"
                    ) from None
            time.sleep(0.2)

    @staticmethod
    def _entry(document: Any, chunk: Any) -> tantivy.Document:
        body, cjk = indexed_texts(document["title"], chunk["heading"], chunk["text"])
        entry = tantivy.Document(
            user=chunk["user_id"],
            kind=chunk["kind"],
            document=document["id"],
            chunk=chunk["id"],
            body=body,
            cjk=cjk,
            year=document["year"] or 0,
        )
        for author in json.loads(document["authors"]):
            entry.add_text("author", author.lower())
        for tag in json.loads(document["tags"]):
            entry.add_text("tag", tag.lower())
        return entry

    def delete_document(self, document_id: int) -> None:
        writer = self._writer(16_000_000)
        writer.delete_documents_by_term("document", document_id)
        writer.commit()
        writer.wait_merging_threads()

    def search(
        self, user_id: str, kind: str | None, query: str, filters: SearchFilters, limit: int
    ) -> list[tuple[int, float]]:
        """(chunk id, BM25 score) of the user's best passages, best first."""
        q, occur = tantivy.Query, tantivy.Occur
        terms = [
            (occur.Should, q.term_query(self.schema, "body", t)) for t in dict.fromkeys(self._english.analyze(query))
        ]
        terms += [(occur.Should, q.term_query(self.schema, "cjk", g)) for g in dict.fromkeys(cjk_bigrams(query))]
        if not terms:
            return []
        full = q.boolean_query([*self._scope(user_id, kind, filters), (occur.Must, q.boolean_query(terms))])
        self._index.reload()
        searcher = self._index.searcher()
        return [(searcher.doc(address)["chunk"][0], score) for score, address in searcher.search(full, limit).hits]

    def term_counts(self, words: Sequence[str]) -> dict[str, int]:
        """Passages of the index holding each English word, stemmed as the body field stems it
        (every user's: the document frequencies BM25 ranks with); 0 for a stopword."""
        self._index.reload()
        searcher = self._index.searcher()
        counts = {}
        for word in words:
            stems = self._english.analyze(word)
            counts[word] = searcher.doc_freq("body", stems[0]) if len(stems) == 1 else 0
        return counts

    def _scope(self, user_id: str, kind: str | None, filters: SearchFilters) -> list[tuple[Any, tantivy.Query]]:
        q, must = tantivy.Query, tantivy.Occur.Must
        clauses = [(must, q.term_query(self.schema, "user", user_id))]
        if kind is not None:
            clauses.append((must, q.term_query(self.schema, "kind", kind)))
        if filters.year_min is not None or filters.year_max is not None:
            low = filters.year_min if filters.year_min is not None else -_FAR
            high = filters.year_max if filters.year_max is not None else _FAR
            clauses.append((must, q.range_query(self.schema, "year", tantivy.FieldType.Integer, low, high)))
        for name, values in (("author", filters.authors), ("tag", filters.tags)):
            if values:
                clauses.append((must, self._any(name, [value.lower() for value in values])))
        if filters.document_ids:
            clauses.append((must, self._any("document", list(filters.document_ids))))
        return clauses

    def _any(self, field: str, values: list[Any]) -> tantivy.Query:
        q = tantivy.Query
        return q.boolean_query([(tantivy.Occur.Should, q.term_query(self.schema, field, value)) for value in values])
