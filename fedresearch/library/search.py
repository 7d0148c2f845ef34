"""Hybrid search's pure parts: fusing the BM25 and vector rankings, and the typed passage it yields."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from fedresearch.core.ranking import RRF_K, rrf
from fedresearch.core.text import cjk_bigrams

Mode = Literal["hybrid", "bm25", "dense"]
# How a document's passages make one document score (bench/quality.py measures each):
# "max" its best fused passage, "top2" the sum of its two best, "rrf" ranks documents by their best
# passage inside each ranking first and fuses those document rankings.
Aggregation = Literal["max", "top2", "rrf"]
DEFAULT_AGGREGATION: Aggregation = "rrf"

# BM25 is unbounded; this saturating map is only used when no vector exists for the passage.
_BM25_HALF = 10.0


class Row(Protocol):
    """A stored row read by column name: sqlite3.Row, or a dict from PostgreSQL."""

    def __getitem__(self, key: str, /) -> Any: ...


def indexed_texts(title: str, heading: str, text: str) -> tuple[str, str]:
    """What full text indexes of a passage, in every store: the English body (title and heading
    first) and its CJK bigrams as space-separated words."""
    # The title is part of the body field: a separately weighted title field scored worse on
    # CISI at every weight tried and no better on MED (docs/benchmarks.md, The library).
    title = f"{title} {heading}".strip()
    return f"{title}\n{text}", " ".join(cjk_bigrams(f"{title} {text}"))


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


@dataclass
class Ranked:
    """One passage's standing in the rankings being fused."""

    chunk_id: int
    rrf: float = 0.0
    bm25: float | None = None
    cosine: float | None = None
    ranks: dict[str, int] = field(default_factory=dict)


def fuse_rankings(
    bm25: Sequence[tuple[int, float]], dense: Sequence[tuple[int, float]], top_k: int, k: int = RRF_K
) -> list[Ranked]:
    """Reciprocal rank fusion of (chunk id, score) rankings, best `top_k` first."""
    found: dict[int, Ranked] = {}
    for rank, (chunk_id, score) in enumerate(bm25, start=1):
        hit = found.setdefault(chunk_id, Ranked(chunk_id))
        hit.bm25, hit.ranks["bm25"] = score, rank
        hit.rrf += rrf(rank, k=k)
    for rank, (chunk_id, cosine) in enumerate(dense, start=1):
        hit = found.setdefault(chunk_id, Ranked(chunk_id))
        hit.cosine, hit.ranks["dense"] = cosine, rank
        hit.rrf += rrf(rank, k=k)
    return sorted(found.values(), key=lambda hit: hit.rrf, reverse=True)[:top_k]


def _best_per_document(ranking: Sequence[tuple[int, float]], document_of: dict[int, int]) -> list[tuple[int, float]]:
    """A passage ranking as a document ranking: each document at the place of its best passage."""
    seen: dict[int, float] = {}
    for chunk_id, score in ranking:
        document = document_of.get(chunk_id)
        if document is not None and document not in seen:
            seen[document] = score
    return list(seen.items())


def fuse_documents(
    bm25: Sequence[tuple[int, float]],
    dense: Sequence[tuple[int, float]],
    document_of: dict[int, int],
    top_k: int,
    aggregation: Aggregation = DEFAULT_AGGREGATION,
    k: int = RRF_K,
) -> list[Ranked]:
    """The best `top_k` documents, each as its best fused passage carrying the document's score.

    Passages whose document is unknown (left in the index by a removed document) are dropped.
    """
    passages = fuse_rankings(bm25, dense, len(document_of) or 1, k)
    best: dict[int, Ranked] = {}
    scores: dict[int, list[float]] = {}
    for hit in passages:
        document = document_of.get(hit.chunk_id)
        if document is not None:
            best.setdefault(document, hit)
            scores.setdefault(document, []).append(hit.rrf)
    if aggregation == "rrf":
        documents = fuse_rankings(
            _best_per_document(bm25, document_of), _best_per_document(dense, document_of), len(best), k
        )
        total = {ranked.chunk_id: ranked.rrf for ranked in documents}
    else:
        kept = 2 if aggregation == "top2" else 1
        total = {document: sum(values[:kept]) for document, values in scores.items()}
    ordered = sorted(best, key=lambda document: total[document], reverse=True)[:top_k]
    return [replace(best[document], rrf=total[document]) for document in ordered]


@dataclass(frozen=True)
class Passage:
    """One passage of a user's library as a search found it: the library's typed answer."""

    chunk_id: int
    document_id: int
    kind: str
    title: str
    heading: str
    text: str
    page: int | None
    position: int
    authors: list[str]
    year: int | None
    doi: str | None
    url: str | None
    tags: list[str]
    extra: dict[str, Any]
    cosine: float | None  # similarity to the question under the library's encoder
    bm25: float | None
    rrf: float
    source: str = ""  # where the document was read from (a path; `path#id` for one highlight of a file)

    @property
    def file(self) -> str | None:
        """The name of the file the passage was read from, as a reference names it (never the
        server's folders)."""
        name = self.source.rsplit("#", 1)[0] if self.kind == "highlight" else self.source
        return name.replace("\\", "/").rsplit("/", 1)[-1] or None

    @property
    def source_id(self) -> tuple[str, str]:
        """The id field and value naming the passage's source: a paper, a note section, a PDF page."""
        if self.kind == "highlight":
            return "highlight_id", str(self.chunk_id)
        value = str(self.document_id)
        if self.kind == "file" and self.page is not None:
            value += f"#page={self.page}"
        return f"{self.kind}_id", value

    @property
    def display_title(self) -> str:
        """One note's (or file's) sections are separate sources: their heading joins the title."""
        if self.kind != "biblio" and self.heading and self.heading != self.title:
            return f"{self.title} › {self.heading}"
        return self.title

    @property
    def score(self) -> float:
        """A 0..1 score that means the same across queries: the passage's cosine similarity to the query.

        Ranking uses RRF, whose values carry no meaning of their own; the reported score does not.
        """
        if self.cosine is not None:
            return float(min(1.0, max(0.0, self.cosine)))
        bm25 = self.bm25 or 0.0
        return bm25 / (bm25 + _BM25_HALF)

    @classmethod
    def of(cls, row: Row, hit: Ranked) -> Passage:
        return cls(
            chunk_id=row["id"],
            document_id=row["document_id"],
            kind=row["kind"],
            title=row["title"],
            heading=row["heading"],
            text=row["text"],
            page=row["page"],
            position=row["position"],
            authors=json.loads(row["authors"]),
            year=row["year"],
            doi=row["doi"],
            url=row["url"],
            tags=json.loads(row["tags"]),
            extra=json.loads(row["extra"]),
            cosine=hit.cosine,
            bm25=hit.bm25,
            rrf=hit.rrf,
            source=row["source"] or "",
        )
