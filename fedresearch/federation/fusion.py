"""Canonicalize, merge duplicates and rank with weighted reciprocal rank fusion.

Every DOI form of a paper is one key (core/identifiers.py); a merged source keeps the longest body,
the first real title and link, every retriever that found it, and the library's cosine.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fedresearch.core.identifiers import canonical_key
from fedresearch.core.models import FusedResult, SearchResult
from fedresearch.core.ranking import RRF_K, rrf


def _better_title(current: str, candidate: str) -> str:
    """A real title beats none, and beats a bare URL or id standing in for one."""
    if not current.strip():
        return candidate
    if candidate.strip() and "://" in current and "://" not in candidate:
        return candidate
    return current


def _first(result: SearchResult, key: str, contribution: float) -> FusedResult:
    return FusedResult(
        key=key,
        href=result.href,
        title=result.title,
        body=result.body,
        score=contribution,
        retrievers=[result.retriever],
        ranks={result.retriever: result.rank},
        source_scores={result.retriever: result.score} if result.score is not None else {},
        kinds=[result.kind],
        cosine=result.cosine,
        metadata=dict(result.metadata),
    )


def _merge(found: FusedResult, result: SearchResult, weight: float, k: int) -> None:
    if result.retriever not in found.ranks:
        found.score += rrf(result.rank, weight, k)
        found.retrievers.append(result.retriever)
        found.ranks[result.retriever] = result.rank
    elif result.rank < found.ranks[result.retriever]:
        # the same retriever reached one source twice: count its better rank once
        found.score += rrf(result.rank, weight, k) - rrf(found.ranks[result.retriever], weight, k)
        found.ranks[result.retriever] = result.rank
    if result.score is not None:
        found.source_scores[result.retriever] = max(result.score, found.source_scores.get(result.retriever, 0.0))
    if result.kind not in found.kinds:
        found.kinds.append(result.kind)
    if result.cosine is not None:
        found.cosine = max(result.cosine, found.cosine if found.cosine is not None else result.cosine)
    if len(result.body) > len(found.body):
        found.body = result.body
    found.title = _better_title(found.title, result.title)
    if "://" not in found.href and "://" in result.href:
        found.href = result.href
    for name, value in result.metadata.items():
        found.metadata.setdefault(name, value)


def fuse(
    results: Iterable[SearchResult], weights: Mapping[str, float] | None = None, k: int = RRF_K
) -> list[FusedResult]:
    weights = weights or {}
    merged: dict[str, FusedResult] = {}
    for result in results:
        key = canonical_key(result.href, result.metadata.get("type"))
        weight = weights.get(result.retriever, 1.0)
        found = merged.get(key)
        if found is None:
            merged[key] = _first(result, key, rrf(result.rank, weight, k))
        else:
            _merge(found, result, weight, k)
    return sorted(merged.values(), key=lambda fused: fused.score, reverse=True)
