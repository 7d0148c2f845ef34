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
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core.identifiers import doi_of, doi_url
from core.models import SearchResult
from core.secrets import resolve_secret
from core.settings import Settings
from retrievers.base import About, Deps, Hits, RetrieverFailed, SearchOptions, fetch_json, first_text, unit_score

about = About(
    website="https://docs.dify.ai/guides/knowledge-base/api-documentation/external-knowledge-api-documentation",
    kind="knowledge",
    needs_key=True,
    needs_user=False,
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


def build_request(upstream: Upstream, options: SearchOptions) -> tuple[str, dict[str, Any], dict[str, str]]:
    """Exactly the body and headers Dify sends."""
    body = {
        "knowledge_id": upstream.knowledge_id,
        "query": options.query,
        "retrieval_setting": {"top_k": options.max_results, "score_threshold": upstream.score_threshold},
    }
    headers = {"Authorization": f"Bearer {upstream.api_key}", "Content-Type": "application/json"}
    return upstream.endpoint.rstrip("/") + "/retrieval", body, headers


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
        metadata = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
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


class DifyRetriever:
    about = about

    def __init__(self, name: str, upstream: Upstream) -> None:
        self.name = name
        self.upstream = upstream

    def configured(self, settings: Settings) -> bool:
        return True

    async def search(self, options: SearchOptions, deps: Deps) -> Hits:
        url, body, headers = build_request(self.upstream, options)
        payload = await fetch_json(
            deps.session,
            "POST",
            url,
            json=body,
            headers=headers,
            upstream=self.name,
            limit=deps.settings.upstream_max_bytes,
            describe=lambda status, answer: describe_error(self.name, status, answer),
        )
        if isinstance(payload, dict) and "error_code" in payload:  # some answer errors with HTTP 200
            raise RetrieverFailed(describe_error(self.name, 200, payload))
        return parse_response(self.name, payload)

    async def aclose(self) -> None:
        return None


def retrievers(settings: Settings) -> list[DifyRetriever]:
    if settings.dify_upstreams is None:
        return []
    path = Path(settings.dify_upstreams)
    try:
        tables = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ValueError(f"DIFY_UPSTREAMS ({path}): {error}") from error
    found = []
    for name, table in tables.items():
        where = f"DIFY_UPSTREAMS ({path}), upstream {name!r}"
        if not isinstance(table, dict):
            raise ValueError(f"{where}: expected a table")
        try:
            upstream = Upstream(**{**table, "api_key": resolve_secret(str(table.get("api_key", "")), where)})
        except ValidationError as error:
            raise ValueError(f"{where}: {error}") from error
        found.append(DifyRetriever(name.strip().lower(), upstream))
    return found
