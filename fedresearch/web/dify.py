"""Dify's External Knowledge API at `POST /retrieval`: records from one knowledge base's federation,
with Dify's own error codes (403 1001/1002, 404 2001) and its registration probes answered."""

from __future__ import annotations

import json

from aiohttp import web
from pydantic import ValidationError

from fedresearch.core.auth import Principal, bearer_token
from fedresearch.knowledge.api import RetrievalRequest
from fedresearch.knowledge.bases import may_read
from fedresearch.knowledge.retrieval import NothingAnswered, retrieve
from fedresearch.web.auth import validation_message
from fedresearch.web.keys import KEYS, RUNTIME
from fedresearch.web.limits import query_slot, query_too_long

_MALFORMED = "Invalid Authorization header format. Expected 'Bearer <api-key>' format."


def dify_error(
    kind: type[web.HTTPException], code: int, message: str, headers: dict[str, str] | None = None
) -> web.HTTPException:
    body = json.dumps({"error_code": code, "error_msg": message})
    return kind(text=body, content_type="application/json", headers=headers)


def _too_many(message: str, headers: dict[str, str]) -> web.HTTPException:
    return dify_error(web.HTTPTooManyRequests, 429, message, headers)


def caller(request: web.Request) -> Principal | None:
    """The caller of /retrieval, or None when no key was sent (403s use Dify's error codes)."""
    header = request.headers.get("Authorization")
    if header is None:
        return None
    token = bearer_token(header)
    if token is None:
        raise dify_error(web.HTTPForbidden, 1001, _MALFORMED)
    keys = request.app[KEYS]
    if not keys.enabled:
        return Principal(None, admin=True)  # a loopback-only server without keys accepts any
    principal = keys.authenticate(token)
    if principal is None:
        raise dify_error(web.HTTPForbidden, 1002, "Authorization failed")
    return principal


async def retrieval(request: web.Request) -> web.Response:
    principal = caller(request)
    with query_slot(request, principal.key_id if principal else "local", _too_many):
        return await _answer(request, principal)


async def _answer(request: web.Request, principal: Principal | None) -> web.Response:
    raw = await request.read()
    try:
        body = RetrievalRequest.model_validate_json(raw) if raw.strip() else None
    except ValidationError as error:
        raise dify_error(web.HTTPBadRequest, 400, validation_message(error)) from None
    if body is None or body.is_probe:
        return web.json_response({"records": []})
    if (refusal := query_too_long(body.query, request)) is not None:
        raise dify_error(web.HTTPBadRequest, 400, refusal)
    if principal is None:
        if request.app[KEYS].enabled:
            raise dify_error(web.HTTPForbidden, 1001, _MALFORMED)
        principal = Principal(None, admin=True)
    runtime = request.app[RUNTIME]
    base = runtime.knowledge_bases.get(body.knowledge_id)
    # one answer for "no such id" and "not yours": a valid key cannot probe for other tenants' ids
    if base is None or not may_read(principal, base):
        raise dify_error(web.HTTPNotFound, 2001, "The knowledge does not exist")
    try:
        records = await retrieve(base, body, runtime.registry, runtime.deps)
    except NothingAnswered as failure:
        raise dify_error(web.HTTPServiceUnavailable, 503, str(failure)) from None
    return web.json_response({"records": [record.as_json() for record in records]})
