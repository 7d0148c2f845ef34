"""The internal literature API (`internal_biblio`, `internal_highlight`, `internal_file`).

With `INTERNAL_API_BASE_URL` unset, the same contract is answered by the embedded library in
process, and its answer goes through the very same parser as a remote one.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import aiohttp

from core.identifiers import doi_of, doi_url
from core.models import SearchResult
from core.settings import Settings, secret
from retrievers.base import About, Deps, Hits, RetrieverFailed, SearchOptions, fetch_json, first_text, unit_score

about = About(
    website="(your literature API, or the embedded library)",
    kind="library",
    needs_key=False,
    needs_user=True,
)

ENDPOINT_PATH = "/internal/biblios/vector_search/"
_ID_KEYS = ("href", "url", "id", "source", "link")
_METADATA_ID_KEYS = ("biblio_id", "highlight_id", "file_id", "doc_id", "document_id", "id")
_CONTENT_KEYS = ("body", "content", "text", "abstract", "description", "snippet")
_WRAPPER_KEYS = ("results", "data", "items")


@dataclass(frozen=True)
class ApiRequest:
    url: str
    body: dict[str, Any]
    headers: dict[str, str]


def build_request(base_url: str, kind: str, user_id: str, query: str, top_k: int, api_key: str | None) -> ApiRequest:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["x-api-key"] = api_key
    return ApiRequest(
        url=base_url.rstrip("/") + ENDPOINT_PATH,
        body={"type": kind, "user_id": user_id, "query": query, "top_k": top_k},
        headers=headers,
    )


def _items_of(payload: Any) -> list[Any]:
    if isinstance(payload, list):
        return payload
    if isinstance(payload, dict):
        for key in _WRAPPER_KEYS:
            if isinstance(payload.get(key), list):
                return payload[key]
        raise RetrieverFailed(
            "literature API answered an object without a results/data/items list "
            f"(keys: {', '.join(sorted(map(str, payload))) or 'none'})"
        )
    raise RetrieverFailed(f"literature API answered JSON {type(payload).__name__}, not a list")


def _authors(structured: dict[str, Any]) -> list[str]:
    names = []
    for author in structured.get("authors") or []:
        name = author.get("name") if isinstance(author, dict) else author
        if isinstance(name, str) and name.strip():
            names.append(name.strip())
    return names


def parse_item(item: Any, retriever: str, kind: str, rank: int) -> SearchResult | str:
    """One normalized result, or a warning saying why the item was skipped."""
    if not isinstance(item, dict):
        return f"skipped a {type(item).__name__} item: not an object"
    metadata = item.get("metadata") if isinstance(item.get("metadata"), dict) else {}
    structured = metadata.get("structured_data") if isinstance(metadata.get("structured_data"), dict) else {}
    identifier = first_text(item, _ID_KEYS) or first_text(metadata, _METADATA_ID_KEYS)
    doi = first_text(structured, ("doi",)) or first_text(metadata, ("doi",))
    body = first_text(item, _CONTENT_KEYS) or first_text(metadata, ("content", "text"))
    if not (identifier or doi) or not body:
        missing = " and ".join(
            part for part, value in (("identifier", identifier or doi), ("content", body)) if not value
        )
        return f"skipped an item without {missing} (keys: {', '.join(sorted(item)) or 'none'})"

    href = doi_url(doi) if doi and doi_of(doi) else identifier or doi
    extra: dict[str, Any] = {"type": kind}
    for key in (*_METADATA_ID_KEYS, "page", "section", "tags", "url", "score_kind", "paper_doi"):
        if key in metadata and metadata[key] not in (None, "", []):
            extra[key] = metadata[key]
    if doi:
        extra["doi"] = doi_of(doi) or doi
    if structured.get("year") not in (None, ""):
        extra["year"] = structured["year"]
    if authors := _authors(structured):
        extra["authors"] = authors
    score = unit_score(item.get("score"))
    if score is None and item.get("score") is not None:
        extra["raw_score"] = item["score"]
    title = first_text(structured, ("title",)) or first_text(metadata, ("title",)) or first_text(item, ("title",)) or ""
    return SearchResult(href=href, body=body, title=title, score=score, retriever=retriever, rank=rank, metadata=extra)


def parse_response(payload: Any, retriever: str, kind: str) -> Hits:
    hits = Hits()
    for item in _items_of(payload):
        parsed = parse_item(item, retriever, kind, rank=len(hits.results) + 1)
        if isinstance(parsed, str):
            hits.warnings.append(parsed)
        else:
            hits.results.append(parsed)
    return hits


class InternalApiRetriever:
    """One of the three names; `fixed_type` None means the `internal_api_type` header decides."""

    about = about

    def __init__(self, name: str, fixed_type: str | None) -> None:
        self.name = name
        self.fixed_type = fixed_type

    def configured(self, settings: Settings) -> bool:
        return True

    async def search(self, options: SearchOptions, deps: Deps) -> Hits:
        kind = self.fixed_type or options.internal_api_type
        if options.user_id is None:
            raise RetrieverFailed("no user_id: the literature API is always searched for one user")
        base_url = options.internal_api_base_url or deps.settings.internal_api_base_url
        if base_url is None:
            if deps.library is None:
                raise RetrieverFailed("the embedded library is not open on this server")
            items = await asyncio.to_thread(
                deps.library.search_items, options.user_id, kind, options.query, options.max_results
            )
            return parse_response(items, self.name, kind)

        request = build_request(
            base_url,
            kind,
            options.user_id,
            options.query,
            options.max_results,
            secret(deps.settings.internal_api_key),
        )
        payload = await fetch_json(
            deps.session,
            "POST",
            request.url,
            json=request.body,
            headers=request.headers,
            timeout=aiohttp.ClientTimeout(total=deps.settings.internal_api_timeout_s),
            upstream="literature API",
            limit=deps.settings.upstream_max_bytes,
        )
        return parse_response(payload, self.name, kind)

    async def aclose(self) -> None:
        return None


def retrievers(settings: Settings) -> list[InternalApiRetriever]:
    return [
        InternalApiRetriever("internal_biblio", None),
        InternalApiRetriever("internal_highlight", "highlight"),
        InternalApiRetriever("internal_file", "file"),
    ]
