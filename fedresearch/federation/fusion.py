"""Canonicalize, merge duplicates and rank with weighted reciprocal rank fusion.

Every DOI form of a paper is one key, every arXiv form too (core/identifiers.py), and results that
share any key are one source: an arXiv preprint carrying its journal DOI, the journal's Crossref
record and a web page at the DOI become one reference. A merged source keeps the longest body, the
first real title and link, every retriever that found it, the library's cosine, and the best
metadata: a scholarly source's authors, year and venue beat the library's, which beat a web page's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fedresearch.core.identifiers import identity_keys
from fedresearch.core.models import FusedResult, SearchResult, SourceKind
from fedresearch.core.ranking import RRF_K, rrf

# whose metadata wins a field when several sources know it
_METADATA_ORDER: tuple[SourceKind, ...] = ("scholarly", "library", "knowledge", "web")
_KEY_ORDER = ("doi:", "arxiv:", "pmid:")


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


def _best_metadata(group: list[SearchResult]) -> dict[str, object]:
    """Each field from the most authoritative kind of source that has it (empty values never win)."""
    metadata: dict[str, object] = {}
    for result in sorted(group, key=lambda r: _METADATA_ORDER.index(r.kind)):
        for name, value in result.metadata.items():
            if value not in (None, "", [], {}):
                metadata.setdefault(name, value)
    return metadata


def _groups(results: list[SearchResult]) -> tuple[list[list[SearchResult]], list[list[str]]]:
    """Results joined when they share any identity key (union-find), in order of first appearance."""
    parent = list(range(len(results)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    keys = [identity_keys(result.href, result.metadata) for result in results]
    for i, own in enumerate(keys):
        for key in own:
            if key in owner:
                a, b = root(owner[key]), root(i)
                parent[max(a, b)] = min(a, b)
            else:
                owner[key] = i
    members: dict[int, list[int]] = {}
    for i in range(len(results)):
        members.setdefault(root(i), []).append(i)
    ordered = [members[r] for r in sorted(members)]
    return [[results[i] for i in group] for group in ordered], [[k for i in g for k in keys[i]] for g in ordered]


def _key(keys: list[str]) -> str:
    """The group's key: a DOI, else an arXiv id, else a PubMed id, else its first link's key."""
    return next((key for prefix in _KEY_ORDER for key in keys if key.startswith(prefix)), keys[0])


def fuse(
    results: Iterable[SearchResult], weights: Mapping[str, float] | None = None, k: int = RRF_K
) -> list[FusedResult]:
    weights = weights or {}
    fused: list[FusedResult] = []
    for group, keys in zip(*_groups(list(results)), strict=True):
        first = group[0]
        found = _first(first, _key(keys), rrf(first.rank, weights.get(first.retriever, 1.0), k))
        for result in group[1:]:
            _merge(found, result, weights.get(result.retriever, 1.0), k)
        found.metadata = _best_metadata(group)
        fused.append(found)
    return sorted(fused, key=lambda source: source.score, reverse=True)
