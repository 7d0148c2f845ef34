"""A retrieval-only LangBot KnowledgeEngine backed by a fedresearch server's POST /retrieval."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from langbot_plugin.api.definition.components.knowledge_engine.engine import KnowledgeEngine
from langbot_plugin.api.entities.builtin.provider.message import ContentElement
from langbot_plugin.api.entities.builtin.rag.context import (
    RetrievalContext,
    RetrievalResponse,
    RetrievalResultEntry,
)
from langbot_plugin.api.entities.builtin.rag.enums import DocumentStatus
from langbot_plugin.api.entities.builtin.rag.errors import RetrievalError
from langbot_plugin.api.entities.builtin.rag.models import IngestionContext, IngestionResult

# Chroma's `where` operators, as LangBot hosts pass filters, to /retrieval's (Dify's) operators.
_OPERATORS = {
    "$eq": "is",
    "$ne": "is not",
    "$gt": ">",
    "$gte": "≥",
    "$lt": "<",
    "$lte": "≤",
    "$in": "in",
    "$nin": "not in",
    "$contains": "contains",
    "$not_contains": "not contains",
}
_LISTED = {"$in", "$nin"}
# an expression becomes an OR of ANDs (one /retrieval request each): bound how many it may take
MAX_BRANCHES = 16

Conjunction = list[dict[str, Any]]


def _field_tests(name: str, test: Any) -> Conjunction:
    tests = test if isinstance(test, dict) else {"$eq": test}
    if not tests:
        raise RetrievalError(f"fedresearch: empty filter on {name!r}")
    conditions = []
    for operator, value in tests.items():
        if operator not in _OPERATORS:
            known = ", ".join(_OPERATORS)
            raise RetrievalError(f"fedresearch: unsupported filter operator {operator!r} on {name!r}; known: {known}")
        if (operator in _LISTED) != isinstance(value, list):
            shape = "a list" if operator in _LISTED else "a string, a number or a boolean"
            raise RetrievalError(f"fedresearch: {operator} on {name!r} takes {shape}, not {value!r}")
        conditions.append({"name": [name], "comparison_operator": _OPERATORS[operator], "value": value})
    return conditions


def _parts(operator: str, value: Any) -> list[Any]:
    if not isinstance(value, list) or not value or not all(isinstance(part, dict) for part in value):
        raise RetrievalError(f"fedresearch: {operator} takes a non-empty list of filters, not {value!r}")
    return value


def _bounded(branches: list[Conjunction]) -> list[Conjunction]:
    if len(branches) > MAX_BRANCHES:
        raise RetrievalError(f"fedresearch: the filter expands to more than {MAX_BRANCHES} alternatives; simplify it")
    return branches


def disjunction(where: dict[str, Any]) -> list[Conjunction]:
    """Chroma's `where` (keys side by side and `$and` conjoin, `$or` disjoins, nesting at any depth)
    as alternatives, each a flat conjunction that /retrieval's metadata_condition expresses exactly."""
    result: list[Conjunction] = [[]]
    for key, test in where.items():
        if key == "$or":
            alternatives = [branch for part in _parts(key, test) for branch in disjunction(part)]
        elif key == "$and":
            alternatives = [[]]
            for part in _parts(key, test):
                alternatives = _bounded([a + b for a in alternatives for b in disjunction(part)])
        elif key.startswith("$"):
            raise RetrievalError(f"fedresearch: unsupported filter operator {key!r}; use $and, $or or a field name")
        else:
            alternatives = [_field_tests(key, test)]
        result = _bounded([a + b for a in result for b in alternatives])
    return result


def metadata_conditions(filters: dict[str, Any] | None) -> list[dict[str, Any] | None]:
    """One /retrieval metadata_condition per alternative of LangBot's filters (`[None]`: no filter)."""
    if not filters:
        return [None]
    return [{"logical_operator": "and", "conditions": branch} if branch else None for branch in disjunction(filters)]


class FedresearchKnowledgeEngine(KnowledgeEngine):
    @classmethod
    def get_capabilities(cls) -> list[str]:
        return []  # retrieval only: no upload UI

    async def ingest(self, context: IngestionContext) -> IngestionResult:
        return IngestionResult(
            document_id=context.file_object.metadata.document_id,
            status=DocumentStatus.FAILED,
            error_message="fedresearch is retrieval-only here: add documents with `fedresearch ingest` on the server",
        )

    async def delete_document(self, kb_id: str, document_id: str) -> bool:
        return False

    async def retrieve(self, context: RetrievalContext) -> RetrievalResponse:
        config = self.get_plugin_config()
        server = str(config.get("server_url") or "").rstrip("/")
        if not server:
            raise RetrievalError("fedresearch: the plugin's server_url is not configured")
        # each LangBot knowledge base carries its own knowledge id and top_k (creation_schema)
        chosen = {**config, **{k: v for k, v in context.creation_settings.items() if v not in (None, "")}}
        knowledge_id = str(chosen.get("knowledge_id") or "")
        if not knowledge_id:
            raise RetrievalError("fedresearch: no knowledge id: set it when creating the LangBot knowledge base")
        settings = context.retrieval_settings or {}
        top_k = int(settings.get("top_k") or chosen.get("top_k") or 5)
        base = {
            "knowledge_id": knowledge_id,
            "query": context.query,
            "retrieval_setting": {"top_k": top_k, "score_threshold": float(settings.get("score_threshold") or 0.0)},
        }
        headers = {"Authorization": f"Bearer {config.get('api_key') or ''}"}
        conditions = metadata_conditions(context.filters)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            answers = await asyncio.gather(
                *(_records(session, server, headers, {**base, "metadata_condition": c}) for c in conditions)
            )
        best: dict[str, RetrievalResultEntry] = {}
        for entry in (entry for records in answers for entry in map(_entry, records)):
            if entry.id not in best or (entry.score or 0.0) > (best[entry.id].score or 0.0):
                best[entry.id] = entry
        entries = sorted(best.values(), key=lambda entry: entry.score or 0.0, reverse=True)[:top_k]
        return RetrievalResponse(results=entries, total_found=len(entries))


async def _records(
    session: aiohttp.ClientSession, server: str, headers: dict[str, str], body: dict[str, Any]
) -> list[dict[str, Any]]:
    if body.get("metadata_condition") is None:
        body.pop("metadata_condition", None)
    try:
        async with session.post(f"{server}/retrieval", json=body, headers=headers) as response:
            answer = await response.json(content_type=None)
            status = response.status
    except (aiohttp.ClientError, TimeoutError, ValueError) as error:
        raise RetrievalError(f"fedresearch server at {server} did not answer: {type(error).__name__}") from error
    if status != 200 or not isinstance(answer, dict) or not isinstance(answer.get("records"), list):
        detail = answer.get("error_msg") if isinstance(answer, dict) else None
        code = answer.get("error_code") if isinstance(answer, dict) else None
        raise RetrievalError(f"fedresearch answered HTTP {status} (error_code {code}): {detail or answer}")
    return [record for record in answer["records"] if isinstance(record, dict)]


def _entry(record: dict[str, Any]) -> RetrievalResultEntry:
    metadata = dict(record.get("metadata") or {})
    metadata.setdefault("title", record.get("title"))
    score = float(record.get("score") or 0.0)
    content = str(record.get("content") or "")
    return RetrievalResultEntry(
        id=str(metadata.get("href") or f"record-{abs(hash(content))}"),
        content=[ContentElement.from_text(content)],
        metadata=metadata,
        distance=1.0 - score,
        score=score,
    )
