"""A retrieval-only LangBot KnowledgeEngine backed by a fedresearch server's POST /retrieval."""

from __future__ import annotations

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

# Chroma-style operators, as LangBot hosts pass filters, to Dify's metadata_condition operators.
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


def _conditions(filters: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    if set(filters) == {"$or"}:
        return "or", [c for part in filters["$or"] for c in _conditions(part)[1]]
    if set(filters) == {"$and"}:
        return "and", [c for part in filters["$and"] for c in _conditions(part)[1]]
    conditions = []
    for name, test in filters.items():
        if name.startswith("$"):
            raise RetrievalError(f"fedresearch: unsupported filter operator {name!r} at this level")
        tests = test if isinstance(test, dict) else {"$eq": test}
        for operator, value in tests.items():
            if operator not in _OPERATORS:
                raise RetrievalError(f"fedresearch: unsupported filter operator {operator!r} on {name!r}")
            conditions.append({"name": [name], "comparison_operator": _OPERATORS[operator], "value": value})
    return "and", conditions


def metadata_condition(filters: dict[str, Any] | None) -> dict[str, Any] | None:
    """LangBot's filters (`{"year": 2020}`, `{"year": {"$gte": 2019}}`, `{"$or": [...]}`) for /retrieval."""
    if not filters:
        return None
    logical_operator, conditions = _conditions(filters)
    return {"logical_operator": logical_operator, "conditions": conditions}


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
        settings = context.retrieval_settings or {}
        top_k = int(settings.get("top_k") or config.get("top_k") or 5)
        body: dict[str, Any] = {
            "knowledge_id": str(context.creation_settings.get("knowledge_id") or config.get("knowledge_id") or ""),
            "query": context.query,
            "retrieval_setting": {"top_k": top_k, "score_threshold": float(settings.get("score_threshold") or 0.0)},
        }
        condition = metadata_condition(context.filters)
        if condition is not None:
            body["metadata_condition"] = condition
        headers = {"Authorization": f"Bearer {config.get('api_key') or ''}"}
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
                session.post(f"{server}/retrieval", json=body, headers=headers) as response,
            ):
                answer = await response.json(content_type=None)
                status = response.status
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            raise RetrievalError(f"fedresearch server at {server} did not answer: {type(error).__name__}") from error
        if status != 200 or not isinstance(answer, dict) or not isinstance(answer.get("records"), list):
            detail = answer.get("error_msg") if isinstance(answer, dict) else None
            code = answer.get("error_code") if isinstance(answer, dict) else None
            raise RetrievalError(f"fedresearch answered HTTP {status} (error_code {code}): {detail or answer}")
        entries = []
        for number, record in enumerate(answer["records"], start=1):
            metadata = dict(record.get("metadata") or {})
            metadata.setdefault("title", record.get("title"))
            score = float(record.get("score") or 0.0)
            entries.append(
                RetrievalResultEntry(
                    id=str(metadata.get("href") or f"record-{number}"),
                    content=[ContentElement.from_text(str(record.get("content") or ""))],
                    metadata=metadata,
                    distance=1.0 - score,
                    score=score,
                )
            )
        return RetrievalResponse(results=entries, total_found=len(entries))
