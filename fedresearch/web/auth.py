"""Who is calling: the API key of an HTTP request or WebSocket, and the JSON errors that refuse one."""

from __future__ import annotations

import json

from aiohttp import web
from pydantic import ValidationError

from fedresearch.core.auth import Principal, bearer_token
from fedresearch.web.keys import KEYS


def json_error(kind: type[web.HTTPException], message: str, **headers: str) -> web.HTTPException:
    return kind(text=json.dumps({"error": message}), content_type="application/json", headers=headers or None)


def principal_of(request: web.Request) -> Principal:
    """Who the caller is; with keys configured, a missing or wrong key is refused here."""
    keys = request.app[KEYS]
    if not keys.enabled:
        return Principal(None, admin=True)
    token = bearer_token(request.headers.get("Authorization")) or request.query.get("token") or None
    principal = keys.authenticate(token)
    if principal is not None and principal.knowledge_bases is not None:
        raise json_error(web.HTTPForbidden, "this API key is for POST /retrieval on its knowledge base only")
    if principal is None:
        reason = "a valid API key is required" if token else "an API key is required"
        message = f"{reason}: send Authorization: Bearer KEY or ?token=KEY"
        raise json_error(web.HTTPUnauthorized, message, **{"WWW-Authenticate": "Bearer"})
    return principal


def validation_message(error: ValidationError) -> str:
    parts = []
    for issue in error.errors():
        where = ".".join(str(part) for part in issue["loc"]) or "request"
        parts.append(f"{where}: {'missing' if issue['type'] == 'missing' else issue['msg']}")
    return "invalid request: " + "; ".join(parts)
