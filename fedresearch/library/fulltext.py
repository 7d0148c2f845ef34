"""The full-text index: tantivy BM25 over passages, derived from the store of record.

English is stemmed with stopwords removed; CJK text is indexed a second time as character bigrams,
because no tokenizer here splits Chinese words. The user id is an exact-match term inside every
query, so matching starts inside one user's slice rather than filtering after it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import tantivy

from fedresearch.core.text import STOPWORDS, cjk_bigrams
from fedresearch.library.records import Records
from fedresearch.library.search import SearchFilters

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
    def __init__(self, directory: Path, records: Records) -> None:
        self.directory = directory
        self.schema = _schema()
        self._english = _analyzers()["en_stem"]
        self._index = self._open(records)

    def _open(self, records: Records) -> tantivy.Index:
        version = self.directory / "VERSION"
        if self.directory.exists() and (not version.exists() or version.read_text().strip() != INDEX_VERSION):
            shutil.rmtree(self.directory)  # derived data: rebuilt from SQLite by catch_up
            records.mark_all_unindexed()
        self.directory.mkdir(exist_ok=True)
        index = tantivy.Index(self.schema, path=str(self.directory))
        version.write_text(INDEX_VERSION)
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
        writer = self._index.writer(heap_size=128_000_000, num_threads=1)
        for document in pending:
            writer.delete_documents_by_term("document", document["id"])
            for chunk in records.chunks_of(document["id"]):
                writer.add_document(self._entry(document, chunk))
        writer.commit()
        writer.wait_merging_threads()
        records.mark_indexed([document["id"] for document in pending])

    @staticmethod
    def _entry(document: Any, chunk: Any) -> tantivy.Document:
        # The title is part of the body field: a separately weighted title field scored worse on
        # CISI at every weight tried and no better on MED (README, The embedded library).
        title = f"{document['title']} {chunk['heading']}".strip()
        entry = tantivy.Document(
            user=chunk["user_id"],
            kind=chunk["kind"],
            document=document["id"],
            chunk=chunk["id"],
            body=f"{title}\n{chunk['text']}",
            cjk=" ".join(cjk_bigrams(f"{title} {chunk['text']}")),
            year=document["year"] or 0,
        )
        for author in json.loads(document["authors"]):
            entry.add_text("author", author.lower())
        for tag in json.loads(document["tags"]):
            entry.add_text("tag", tag.lower())
        return entry

    def delete_document(self, document_id: int) -> None:
        writer = self._index.writer(heap_size=16_000_000, num_threads=1)
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
