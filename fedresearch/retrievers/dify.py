"""Any Dify-compatible External Knowledge endpoint (Dify's own API, adbpg-endpoint, RAGFlow, another
fedresearch), configured by name in the TOML file named by DIFY_UPSTREAMS:

    [ragflow]
    endpoint = "https://ragflow.example.org/api/v1/dify"   # Dify appends /retrieval; so do we
    api_key = "env:RAGFLOW_KEY"
    knowledge_id = "kb-123"
    score_threshold = 0.0                                    # optional
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fedresearch.core.identifiers import doi_of, doi_url
from fedresearch.core.models import SearchResult
from fedresearch.core.secrets import resolve_secret
from fedresearch.core.settings import load_toml
from fedresearch.federation.contract import (
    About,
    Answer,
    Hits,
    HttpAnswer,
    HttpRequest,
    RetrieverFailed,
    SearchOptions,
    UpstreamSettings,
    first_text,
    unit_score,
)


class DifySettings(UpstreamSettings):
    """The TOML file naming the Dify-compatible endpoints (unset: none)."""

    dify_upstreams: Path | None = Field(None, validation_alias="DIFY_UPSTREAMS")


about = About(
    website="https://docs.dify.ai/guides/knowledge-base/api-documentation/external-knowledge-api-documentation",
    kind="knowledge",
    needs_key=True,
    needs_user=False,
    settings=DifySettings,
)

_HREF_KEYS = ("href", "url", "source_url", "link", "document_url")
_ID_KEYS = ("document_id", "doc_id", "id", "path", "source")
_ERRORS = {
    1001: "rejected the Authorization header",
    1002: "rejected the API key",
    2001: "does not know the knowledge_id",
}


class Upstream(BaseModel):
    model_config = ConfigDict(extra="forbid")

    endpoint: str
    api_key: str = Field(repr=False)
    knowledge_id: str
    score_threshold: float = Field(0.0, ge=0.0, le=1.0)


def build_request(upstream: Upstream, options: SearchOptions) -> HttpRequest:
    """Exactly the body and headers Dify sends."""
    body = {
        "knowledge_id": upstream.knowledge_id,
        "query": options.query,
        "retrieval_setting": {"top_k": options.max_results, "score_threshold": upstream.score_threshold},
    }
    headers = {"Authorization": f"Bearer {upstream.api_key}", "Content-Type": "application/json"}
    return HttpRequest("POST", upstream.endpoint.rstrip("/") + "/retrieval", json=body, headers=headers)


def describe_error(name: str, status: int, payload: Any) -> str:
    if isinstance(payload, dict) and "error_code" in payload:
        code = payload.get("error_code")
        reason = _ERRORS.get(code, "refused the request") if isinstance(code, int) else "refused the request"
        return f"{name} {reason} (HTTP {status}, error_code {code}: {str(payload.get('error_msg') or '').strip()})"
    return f"{name} answered HTTP {status}"


def _href(name: str, record: dict[str, Any], metadata: dict[str, Any]) -> str:
    doi = first_text(metadata, ("doi",))
    if doi and doi_of(doi):
        return doi_url(doi)
    link = first_text(metadata, _HREF_KEYS) or first_text(record, _HREF_KEYS)
    if link:
        return link
    identifier = first_text(metadata, _ID_KEYS)
    if identifier:
        return f"{name}:{identifier}"
    return f"{name}:{hashlib.sha1(str(record.get('content')).encode()).hexdigest()[:16]}"


def parse_response(name: str, payload: Any) -> Hits:
    if not isinstance(payload, dict) or not isinstance(payload.get("records"), list):
        keys = ", ".join(sorted(payload)) if isinstance(payload, dict) else type(payload).__name__
        raise RetrieverFailed(f"{name} answered without a records list ({keys})")
    hits = Hits()
    for record in payload["records"]:
        if not isinstance(record, dict) or not first_text(record, ("content",)):
            hits.warnings.append(f"skipped a {name} record without content")
            continue
        metadata: dict[str, Any] = record["metadata"] if isinstance(record.get("metadata"), dict) else {}
        hits.results.append(
            SearchResult(
                href=_href(name, record, metadata),
                body=str(record["content"]).strip(),
                title=str(record.get("title") or metadata.get("title") or "").strip(),
                score=unit_score(record.get("score")),
                retriever=name,
                rank=len(hits.results) + 1,
                metadata={**metadata, "type": metadata.get("type") or "knowledge"},
            )
        )
    return hits


class DifyKnowledge:
    about = about

    def __init__(self, name: str, upstream: Upstream) -> None:
        self.name = self.label = name
        self.upstream = upstream

    def missing_setup(self) -> str | None:
        return None  # configured by its table in DIFY_UPSTREAMS

    def build_request(self, options: SearchOptions) -> HttpRequest:
        return build_request(self.upstream, options)

    def parse_response(self, answer: Answer, options: SearchOptions) -> Hits:
        assert isinstance(answer, HttpAnswer)
        if isinstance(answer.payload, dict) and "error_code" in answer.payload:  # some answer errors with HTTP 200
            raise RetrieverFailed(describe_error(self.name, 200, answer.payload))
        return parse_response(self.name, answer.payload)

    def describe_error(self, answer: HttpAnswer) -> str:
        return describe_error(self.name, answer.status, answer.payload)


def adapters(settings: DifySettings) -> list[DifyKnowledge]:
    if settings.dify_upstreams is None:
        return []
    tables = load_toml(settings.dify_upstreams, "DIFY_UPSTREAMS")
    found = []
    for name, table in tables.items():
        where = f"DIFY_UPSTREAMS ({settings.dify_upstreams}), upstream {name!r}"
        if not isinstance(table, dict):
            raise ValueError(f"{where}: expected a table")
        try:
            upstream = Upstream(**{**table, "api_key": resolve_secret(str(table.get("api_key", "")), where)})
        except ValidationError as error:
            raise ValueError(f"{where}: {error}") from error
        found.append(DifyKnowledge(name.strip().lower(), upstream))
    return found
