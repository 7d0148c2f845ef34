"""The internal literature API, `POST /internal/biblios/vector_search/`, answered by the embedded
library. This is the only place the API's JSON shape is built; in process, the library's typed
passages go straight to the internal adapter."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import BaseModel, Field, ValidationError, field_validator

from fedresearch.core.auth import Principal
from fedresearch.core.models import checked_user_id, library_type
from fedresearch.library.search import Passage
from fedresearch.web.auth import json_error, principal_of, validation_message
from fedresearch.web.keys import RUNTIME
from fedresearch.web.limits import query_slot, query_too_long


class LiteratureQuery(BaseModel):
    """The request body the literature API takes (what `internal_*` adapters send)."""

    type: str = "biblio"
    user_id: str = Field(min_length=1)
    query: str = Field(min_length=1)
    top_k: int = Field(10, ge=1, le=100)

    @field_validator("type", mode="before")
    @classmethod
    def _known_type(cls, value: object) -> object:
        kind = library_type(value)
        if kind is None:
            raise ValueError("must be biblio, highlight or file")
        return kind

    @field_validator("query", mode="before")
    @classmethod
    def _strip(cls, value: object) -> object:
        return value.strip() if isinstance(value, str) else value

    @field_validator("user_id", mode="before")
    @classmethod
    def _user_id(cls, value: object) -> object:
        return checked_user_id(value)


def item_of(passage: Passage) -> dict[str, Any]:
    """A passage in the literature API's item shape."""
    id_field, identifier = passage.source_id
    structured: dict[str, Any] = {
        "title": passage.title if passage.kind != "highlight" else None,
        "year": passage.year,
        "authors": [{"name": name} for name in passage.authors],
    }
    if passage.doi and passage.kind != "highlight":
        structured["doi"] = passage.doi
    metadata: dict[str, Any] = {
        id_field: identifier,
        "document_id": str(passage.document_id),
        "title": passage.display_title,
        "structured_data": structured,
        "section": passage.heading or None,
        "file": passage.file,
        "page": passage.page,
        "position": passage.position,
        "tags": passage.tags,
        **passage.extra,
    }
    prefix = id_field.removesuffix("_id")
    item = {"id": f"{prefix}:{identifier}", "content": passage.text, "score": round(passage.score, 6)}
    item["metadata"] = metadata
    if passage.url:
        item["url"] = passage.url
    return item


def _too_many(message: str, headers: dict[str, str]) -> web.HTTPException:
    return json_error(web.HTTPTooManyRequests, message, **headers)


async def literature_api(request: web.Request) -> web.Response:
    principal = principal_of(request)
    with query_slot(request, principal.key_id, _too_many):
        return await _answer(request, principal)


async def _answer(request: web.Request, principal: Principal) -> web.Response:
    try:
        body = LiteratureQuery.model_validate_json(await request.read())
    except ValidationError as error:
        raise json_error(web.HTTPBadRequest, validation_message(error)) from None
    if (refusal := query_too_long(body.query, request)) is not None:
        raise json_error(web.HTTPBadRequest, refusal)
    if not principal.admin and principal.user_id != body.user_id:
        raise json_error(web.HTTPForbidden, f"this API key acts as user {principal.user_id!r} only")
    library = request.app[RUNTIME].library
    if library is None:
        raise json_error(web.HTTPServiceUnavailable, "the embedded library is not open on this server")
    # a paper is one result however many of its passages match; notes' sections and files' pages
    # are sources of their own
    passages = await library.threads.run(
        library.search, body.user_id, body.query, body.type, body.top_k, documents=body.type == "biblio"
    )
    return web.json_response([item_of(passage) for passage in passages])
