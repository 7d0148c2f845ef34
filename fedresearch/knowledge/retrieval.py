"""Answer a knowledge base query: federate its retrievers, fuse, score on one scale, filter, cut.

Scores mean the same thing in every answer: the cosine similarity between the query and the
record's text under the library's embedding model (all-MiniLM-L6-v2), whichever retriever found
the record, times the weight of the best retriever that found it relative to the knowledge base's
largest weight (so with equal weights, the score is the cosine). Passages from the embedded
library already carry that cosine; web and remote records are embedded here (snippets are short).
Without the embedding model, the cosine is replaced by the best 0..1 score a retriever gave the
record, or else by its RRF score as a fraction of the best attainable one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedresearch.core.events import discard
from fedresearch.core.identifiers import string_ids
from fedresearch.core.models import FusedResult, RetrieverOutcome, RetrieverStatus
from fedresearch.core.ranking import rrf
from fedresearch.federation.contract import Adapter, SearchOptions
from fedresearch.federation.fusion import fuse
from fedresearch.federation.runner import Deps, federate
from fedresearch.knowledge.api import RetrievalRequest
from fedresearch.knowledge.bases import KnowledgeBase
from fedresearch.knowledge.conditions import MetadataCondition

log = logging.getLogger(__name__)

# Dify gives up after 5 s and retries: everything after the request arrives fits in this
ANSWER_WITHIN_S = 4.5

# Embedding records to score them happens after retrieval, inside Dify's 5 s: bound that work.
_MAX_EMBEDDED = 20
_SCORED_CHARS = 600
# Past this many seconds into a request, records still waiting for the shared encoder are scored
# without it (see calibrated_scores): 20 questions at once stay well inside Dify's 5 s.
_EMBED_UNTIL_S = 0.75


@dataclass(frozen=True)
class Record:
    content: str
    score: float
    title: str
    metadata: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {"content": self.content, "score": round(self.score, 6), "title": self.title, "metadata": self.metadata}


def _metadata(source: FusedResult) -> dict[str, Any]:
    metadata = {key: value for key, value in source.metadata.items() if value is not None}
    metadata.update(href=source.href, retrievers=list(source.retrievers), retriever=list(source.retrievers))
    return string_ids(metadata)


class NothingAnswered(Exception):
    """No retriever of the knowledge base answered: an error for the caller, never an empty answer."""


def _answered(base: KnowledgeBase, outcomes: list[RetrieverOutcome]) -> None:
    if any(outcome.status == RetrieverStatus.done for outcome in outcomes):
        return
    reasons = "; ".join(f"{outcome.name}: {outcome.error or outcome.status.value}" for outcome in outcomes)
    raise NothingAnswered(f"no retriever of knowledge base {base.id!r} answered ({reasons})")


def _filtered(sources: list[FusedResult], condition: MetadataCondition) -> list[FusedResult]:
    return [source for source in sources if condition.holds(_metadata(source))]


async def _scores(
    query: str, sources: list[FusedResult], deps: Deps, base: KnowledgeBase, budget_s: float, embed_until: float
) -> list[float]:
    """Calibrated scores if they come within `budget_s`; else each record's own score, so the answer
    still reaches Dify inside its 5 s with what the retrievers found."""
    scoring = asyncio.to_thread(calibrated_scores, query, sources, deps, base.weights, base.retrievers, embed_until)
    try:
        return await asyncio.wait_for(scoring, max(budget_s, 0.05))
    except TimeoutError:
        log.warning("knowledge base %r: scoring passed its budget; answering with the retrievers' scores", base.id)
        return [_fallback_score(source, base.weights, base.retrievers) for source in sources]


def _fallback_score(source: FusedResult, weights: dict[str, float], names: list[str]) -> float:
    if source.source_scores:
        return max(source.source_scores.values())
    best = sum(rrf(1, weights.get(name, 1.0)) for name in names)
    return min(1.0, source.score / best) if best else 0.0


def _bounded(sources: list[FusedResult]) -> list[FusedResult]:
    """All records that carry a cosine already, and the best-fused _MAX_EMBEDDED of the others."""
    kept, embedded = [], 0
    for source in sources:  # in fused order
        if _calibrated(source) is None:
            if embedded >= _MAX_EMBEDDED:
                continue
            embedded += 1
        kept.append(source)
    return kept


def _calibrated(source: FusedResult) -> float | None:
    """The score a record carries already on the common scale: the library's cosine, which only
    library-kind adapters report; every other kind is embedded here."""
    return source.cosine if "library" in source.kinds else None


def calibrated_scores(
    query: str,
    sources: list[FusedResult],
    deps: Deps,
    weights: dict[str, float],
    names: list[str],
    deadline: float | None = None,
) -> list[float]:
    """Each record's cosine to the query. Records whose embedding pass had not started by `deadline`
    (time.monotonic(); many requests at once share the encoder) are not embedded: their score is
    their retriever's own 0..1 score (or RRF fraction) capped at the lowest cosine of this answer."""
    library = deps.library
    if library is None or library.encoder is None:
        return [_fallback_score(source, weights, names) for source in sources]
    scores: list[float | None] = [_calibrated(source) for source in sources]
    missing = [i for i, score in enumerate(scores) if score is None]
    if missing:
        query_vector = library.query_vector(query)
        texts = [f"{sources[i].title}\n{sources[i].body[:_SCORED_CHARS]}".strip() for i in missing]
        for i, vector in zip(missing, library.text_vectors(texts, deadline), strict=True):
            scores[i] = None if vector is None else float(vector @ query_vector)
        known = [score for score in scores if score is not None]
        floor = min(known) if known else 1.0
        for i in missing:
            if scores[i] is None:
                scores[i] = min(floor, _fallback_score(sources[i], weights, names))
    return [float(np.clip(score, 0.0, 1.0)) for score in scores]  # type: ignore[arg-type]


def weight_factor(source: FusedResult, weights: dict[str, float], names: list[str]) -> float:
    largest = max(weights.get(name, 1.0) for name in names)
    return max(weights.get(name, 1.0) for name in source.retrievers) / largest if largest > 0 else 1.0


async def retrieve(
    base: KnowledgeBase,
    request: RetrievalRequest,
    registry: dict[str, Adapter],
    deps: Deps,
) -> list[Record]:
    embed_until = time.monotonic() + _EMBED_UNTIL_S
    top_k = request.retrieval_setting.top_k or base.top_k
    threshold = request.retrieval_setting.score_threshold or 0.0
    # Ask for more than top_k so the threshold still leaves enough; conditions are applied to the
    # candidates, so with one the pool is as wide as a retriever allows.
    wanted = 50 if request.metadata_condition is not None else min(50, max(10, top_k * 2))
    options = SearchOptions(
        query=request.query, max_results=wanted, user_id=base.user_id, asker=f"knowledge-base:{base.id}"
    )
    cap = (base.timeout_s, f"timeout_s of knowledge base {base.id!r}")
    started = time.monotonic()
    federated = await federate(base.retrievers, registry, options, deps, discard, cap)
    _answered(base, federated.outcomes)
    sources = fuse(federated.results, base.weights)
    if request.metadata_condition is not None and request.metadata_condition.active:
        sources = await asyncio.to_thread(_filtered, sources, request.metadata_condition)
    sources = _bounded(sources)
    budget = ANSWER_WITHIN_S - (time.monotonic() - started)
    scores = await _scores(request.query, sources, deps, base, budget, embed_until)
    records = [
        Record(content=source.body, score=score, title=source.title or source.href, metadata=_metadata(source))
        for source, cosine in zip(sources, scores, strict=True)
        if (score := cosine * weight_factor(source, base.weights, base.retrievers)) >= threshold
    ]
    records.sort(key=lambda record: record.score, reverse=True)
    return records[:top_k]
