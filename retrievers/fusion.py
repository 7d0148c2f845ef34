"""Canonicalize, merge duplicates and rank with weighted reciprocal rank fusion (DESIGN.md, Fusion)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from core.identifiers import canonical_key
from core.models import FusedResult, SearchResult

RRF_K = 60


def _better_title(current: str, candidate: str) -> str:
    """A real title beats none, and beats a bare URL or id standing in for one."""
    if not current.strip():
        return candidate
    if candidate.strip() and "://" in current and "://" not in candidate:
        return candidate
    return current


def fuse(
    results: Iterable[SearchResult], weights: Mapping[str, float] | None = None, k: int = RRF_K
) -> list[FusedResult]:
    weights = weights or {}
    merged: dict[str, FusedResult] = {}
    for result in results:
        key = canonical_key(result.href, result.metadata.get("type"))
        contribution = weights.get(result.retriever, 1.0) / (k + result.rank)
        found = merged.get(key)
        if found is None:
            merged[key] = FusedResult(
                key=key,
                href=result.href,
                title=result.title,
                body=result.body,
                score=contribution,
                retrievers=[result.retriever],
                ranks={result.retriever: result.rank},
                source_scores={result.retriever: result.score} if result.score is not None else {},
                metadata=dict(result.metadata),
            )
            continue
        if result.retriever not in found.ranks:
            found.score += contribution
            found.retrievers.append(result.retriever)
            found.ranks[result.retriever] = result.rank
        elif result.rank < found.ranks[result.retriever]:
            # the same retriever reached one source twice: count its better rank once
            found.score += contribution - weights.get(result.retriever, 1.0) / (k + found.ranks[result.retriever])
            found.ranks[result.retriever] = result.rank
        if result.score is not None:
            found.source_scores[result.retriever] = max(result.score, found.source_scores.get(result.retriever, 0.0))
        if len(result.body) > len(found.body):
            found.body = result.body
        found.title = _better_title(found.title, result.title)
        if "://" not in found.href and "://" in result.href:
            found.href = result.href
        for name, value in result.metadata.items():
            found.metadata.setdefault(name, value)
    return sorted(merged.values(), key=lambda fused: fused.score, reverse=True)
