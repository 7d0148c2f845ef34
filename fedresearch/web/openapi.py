"""`GET /openapi.json`: an OpenAPI 3.1 description of every HTTP route the app serves.

The list of operations is read from the app's router, so no route can be missing from it; each
takes its summary from its handler's docstring, and the routes with typed bodies carry their
schemas (the pydantic models the handlers parse with).
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from aiohttp import web

from fedresearch.knowledge.api import RetrievalRequest
from fedresearch.web.literature import LiteratureQuery

_PARAMETER = re.compile(r"\{(\w+)\}")
_WORDLESS = re.compile(r"\W+")
_BEARER: list[dict[str, list[str]]] = [{"bearer": []}]
_PAGED = [
    {"name": "offset", "in": "query", "schema": {"type": "integer", "minimum": 0, "default": 0}},
    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 200, "default": 50}},
]
_USER = {"name": "user_id", "in": "query", "description": "the user an admin key acts as", "schema": {"type": "string"}}
_UPLOAD = {
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "properties": {"file": {"type": "array", "items": {"type": "string", "format": "binary"}}},
            }
        }
    }
}
_RECORDS = {
    "type": "object",
    "required": ["records"],
    "properties": {
        "records": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["content", "score", "title", "metadata"],
                "properties": {
                    "content": {"type": "string"},
                    "score": {"type": "number", "minimum": 0, "maximum": 1},
                    "title": {"type": "string"},
                    "metadata": {"type": "object"},
                },
            },
        }
    },
}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


# what the router cannot tell: bodies, extra parameters, answers
DETAILS: dict[tuple[str, str], dict[str, Any]] = {
    ("post", "/retrieval"): {
        "tags": ["Dify"],
        "requestBody": _json(RetrievalRequest.model_json_schema()),
        "responses": {
            "200": {"description": "records, best first", **_json(_RECORDS)},
            "400": {"description": "malformed body"},
            "403": {"description": "error_code 1001 (malformed Authorization) or 1002 (wrong key)"},
            "404": {"description": "error_code 2001: unknown knowledge id"},
            "503": {"description": "no retriever of the knowledge base answered"},
        },
    },
    ("post", "/internal/biblios/vector_search/"): {
        "tags": ["literature"],
        "requestBody": _json(LiteratureQuery.model_json_schema()),
    },
    ("post", "/api/documents"): {"tags": ["documents"], "requestBody": _UPLOAD, "parameters": [_USER]},
    ("get", "/api/documents"): {"tags": ["documents"], "parameters": [*_PAGED, _USER]},
    ("get", "/api/documents/{id}"): {"tags": ["documents"], "parameters": [_USER]},
    ("delete", "/api/documents/{id}"): {"tags": ["documents"], "parameters": [_USER]},
}


def _operation(method: str, path: str, handler: Any) -> dict[str, Any]:
    doc = inspect.getdoc(handler) or handler.__name__.replace("_", " ")
    operation: dict[str, Any] = {
        "operationId": f"{method}_{_WORDLESS.sub('_', path).strip('_') or 'root'}",
        "summary": doc.splitlines()[0],
        "security": _BEARER,
        "responses": {"200": {"description": "OK"}},
    }
    details = DETAILS.get((method, path), {})
    operation.update({key: value for key, value in details.items() if key != "parameters"})
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in _PARAMETER.findall(path)
    ]
    if parameters or details.get("parameters"):
        operation["parameters"] = parameters + details.get("parameters", [])
    return operation


def describe(app: web.Application) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    used: set[str] = set()
    for route in app.router.routes():
        method = route.method.lower()
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        if method in ("head", "*") or not path:
            continue
        operation = _operation(method, path, route.handler)
        while operation["operationId"] in used:  # `//retrieval` is `/retrieval` for Dify's trailing slash
            operation["operationId"] += "_alias"
        used.add(operation["operationId"])
        paths.setdefault(path, {})[method] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "fedresearch", "version": "0.1.0"},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": paths,
    }


async def openapi_json(request: web.Request) -> web.Response:
    """This OpenAPI description of every HTTP route."""
    return web.json_response(describe(request.app))
