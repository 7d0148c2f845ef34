"""The internal literature API (`internal_biblio`, `internal_highlight`, `internal_file`).

With `INTERNAL_API_BASE_URL` unset (and no allowed `internal_api_base_url` header), the embedded
library answers in process with typed passages; otherwise a remote literature API is called with
`POST /internal/biblios/vector_search/` and its JSON is read as the contract describes it.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, SecretStr

from fedresearch.core.identifiers import doi_of, doi_url, string_ids
from fedresearch.core.models import SearchResult
from fedresearch.core.settings import secret
from fedresearch.core.text import author_names
from fedresearch.federation.contract import (
    About,
    Answer,
    Hits,
    HttpAnswer,
    HttpRequest,
    LibraryAnswer,
    LibraryRequest,
    Request,
    RetrieverFailed,
    SearchOptions,
    UpstreamSettings,
    first_text,
    http_error,
    unit_score,
)
from fedresearch.library.search import Passage


class InternalApiSettings(UpstreamSettings):
    """A remote literature API in place of the embedded library (the hosts a client may name instead
    are the server's INTERNAL_API_ALLOWED_HOSTS: request planning checks them)."""

    internal_api_base_url: str | None = Field(None, validation_alias="INTERNAL_API_BASE_URL")
    internal_api_key: SecretStr | None = Field(None, validation_alias="INTERNAL_API_KEY")
    internal_api_timeout_s: float = Field(30.0, gt=0, validation_alias="INTERNAL_API_TIMEOUT_S")


about = About(
    website="(your literature API, or the embedded library)",
    kind="library",
    needs_key=False,
    needs_user=True,
    settings=InternalApiSettings,
)

ENDPOINT_PATH = "/internal/biblios/vector_search/"
_ID_KEYS = ("href", "url", "id", "source", "link")
_METADATA_ID_KEYS = ("biblio_id", "highlight_id", "file_id", "doc_id", "document_id", "id")
_CONTENT_KEYS = ("body", "content", "text", "abstract", "description", "snippet")
_WRAPPER_KEYS = ("results", "data", "items")
# metadata kept from an item, beside its ids, DOI, year and authors
_KEPT = ("page", "section", "file", "tags", "url", "paper_doi", "paper_title", "venue", "journal")


def passage_result(passage: Passage, retriever: str, rank: int) -> SearchResult:
    """A library passage as a normalized result, exactly as the same passage read from the API's JSON."""
    id_field, identifier = passage.source_id
    doi = doi_of(passage.doi) if passage.doi and passage.kind != "highlight" else None
    metadata: dict[str, Any] = {"type": passage.kind, id_field: identifier, "document_id": str(passage.document_id)}
    fields = {"page": passage.page, "section": passage.heading or None, "file": passage.file, "tags": passage.tags}
    fields |= passage.extra
    metadata.update({key: fields[key] for key in _KEPT if fields.get(key) not in (None, "", [])})
    if doi:
        metadata["doi"] = doi
    if passage.year is not None:
        metadata["year"] = passage.year
    if passage.authors:
        metadata["authors"] = list(passage.authors)
    prefix = id_field.removesuffix("_id")
    return SearchResult(
        href=doi_url(doi) if doi else passage.url or f"{prefix}:{identifier}",
        body=passage.text,
        title=passage.title if passage.kind != "highlight" else passage.display_title,
        score=round(passage.score, 6),
        retriever=retriever,
        rank=rank,
        kind="library",
        cosine=passage.cosine,
        metadata=metadata,
    )


def _items_of(payload: Any) -> list[Any]:
    if isinstance(payload, list):
        return payload
    if isinstance(payload, dict):
        for key in _WRAPPER_KEYS:
            if isinstance(payload.get(key), list):
                return list(payload[key])
        raise RetrieverFailed(
            "literature API answered an object without a results/data/items list "
            f"(keys: {', '.join(sorted(map(str, payload))) or 'none'})"
        )
    raise RetrieverFailed(f"literature API answered JSON {type(payload).__name__}, not a list")


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def parse_item(item: Any, retriever: str, kind: str, rank: int) -> SearchResult | str:
    """One normalized result, or a warning saying why the item was skipped."""
    if not isinstance(item, dict):
        return f"skipped a {type(item).__name__} item: not an object"
    metadata = _dict(item.get("metadata"))
    structured = _dict(metadata.get("structured_data"))
    identifier = first_text(item, _ID_KEYS) or first_text(metadata, _METADATA_ID_KEYS)
    doi = first_text(structured, ("doi",)) or first_text(metadata, ("doi",))
    body = first_text(item, _CONTENT_KEYS) or first_text(metadata, ("content", "text"))
    if not (identifier or doi) or not body:
        missing = " and ".join(
            part for part, value in (("identifier", identifier or doi), ("content", body)) if not value
        )
        return f"skipped an item without {missing} (keys: {', '.join(sorted(item)) or 'none'})"
    extra: dict[str, Any] = {"type": kind}
    for key in (*_METADATA_ID_KEYS, *_KEPT):
        if metadata.get(key) not in (None, "", []):
            extra[key] = metadata[key]
    if doi:
        extra["doi"] = doi_of(doi) or doi
    if structured.get("year") not in (None, ""):
        extra["year"] = structured["year"]
    if authors := author_names(structured.get("authors") or []):
        extra["authors"] = authors
    score = unit_score(item.get("score"))
    if score is None and item.get("score") is not None:
        extra["raw_score"] = item["score"]
    title = first_text(structured, ("title",)) or first_text(metadata, ("title",)) or first_text(item, ("title",))
    href = doi_url(doi) if doi and doi_of(doi) else str(identifier or doi)
    return SearchResult(
        href=href, body=body, title=title or "", score=score, retriever=retriever, rank=rank, metadata=string_ids(extra)
    )


def parse_response(payload: Any, retriever: str, kind: str) -> Hits:
    hits = Hits()
    for item in _items_of(payload):
        parsed = parse_item(item, retriever, kind, rank=len(hits.results) + 1)
        if isinstance(parsed, str):
            hits.warnings.append(parsed)
        else:
            hits.results.append(parsed)
    return hits


class LiteratureApi:
    """One of the three names; `fixed_type` None means the `internal_api_type` header decides."""

    about = about
    label = "literature API"

    def __init__(self, name: str, fixed_type: str | None, settings: InternalApiSettings) -> None:
        self.name = name
        self.fixed_type = fixed_type
        self.settings = settings

    def missing_setup(self) -> str | None:
        return None  # the embedded library is always there

    def build_request(self, options: SearchOptions) -> Request:
        kind = self.fixed_type or options.internal_api_type
        if options.user_id is None:
            raise RetrieverFailed("no user_id: the literature API is always searched for one user")
        base_url = options.internal_api_base_url or self.settings.internal_api_base_url
        if base_url is None:
            return LibraryRequest(options.user_id, kind, options.query, options.max_results, documents=kind == "biblio")
        api_key = secret(self.settings.internal_api_key)
        return HttpRequest(
            "POST",
            base_url.rstrip("/") + ENDPOINT_PATH,
            json={"type": kind, "user_id": options.user_id, "query": options.query, "top_k": options.max_results},
            headers={"Content-Type": "application/json", **({"x-api-key": api_key} if api_key else {})},
            deadline=(self.settings.internal_api_timeout_s, "INTERNAL_API_TIMEOUT_S"),
        )

    def parse_response(self, answer: Answer, options: SearchOptions) -> Hits:
        if isinstance(answer, LibraryAnswer):
            return Hits([passage_result(p, self.name, rank) for rank, p in enumerate(answer.passages, start=1)])
        return parse_response(answer.payload, self.name, answer.request.json["type"])

    def describe_error(self, answer: HttpAnswer) -> str:
        return http_error(self.label, answer)


def adapters(settings: InternalApiSettings) -> list[LiteratureApi]:
    return [
        LiteratureApi("internal_biblio", None, settings),
        LiteratureApi("internal_highlight", "highlight", settings),
        LiteratureApi("internal_file", "file", settings),
    ]
