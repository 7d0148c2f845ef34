"""Reciprocal rank fusion, the one rule both the library (BM25 + vectors) and the federation
(retrievers) use to merge rankings whose scores live on different scales."""

from __future__ import annotations

RRF_K = 60


def rrf(rank: int, weight: float = 1.0, k: int = RRF_K) -> float:
    """One ranking's contribution for an item at 1-based `rank`: `weight / (k + rank)`."""
    return weight / (k + rank)
