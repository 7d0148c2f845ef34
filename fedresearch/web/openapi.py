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
from fedresearch.web.jobs import ChatRequest, ReportRequest
from fedresearch.web.literature import LiteratureQuery
from fedresearch.web.status import RetrieversAnswer

_PARAMETER = re.compile(r"\{(\w+)\}")
_WORDLESS = re.compile(r"\W+")
_BEARER: list[dict[str, list[str]]] = [{"bearer": []}]
# answered to anyone, keys or not (the page asks for its key itself)
_PUBLIC = {"/", "/static/{name}", "/healthz", "/metrics", "/openapi.json", "/api/report_forms"}
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


_SAVED_REPORT = {
    "type": "object",
    "description": "GPT-Researcher's saved report",
    "properties": {
        "id": {"type": "string"},
        "question": {"type": "string"},
        "answer": {"type": ["string", "null"]},
        "orderedData": {"type": "array"},
        "chatMessages": {"type": "array"},
        "timestamp": {"type": "integer", "description": "Unix milliseconds"},
    },
}
_NOT_YOURS = {"description": "no such job or report for this key (another user's is not found either)"}
_REPORT_IDS = {"name": "report_ids", "in": "query", "description": "comma list of ids", "schema": {"type": "string"}}
_JOB_DETAILS: dict[tuple[str, str], dict[str, Any]] = {
    ("post", "/report/"): {
        "requestBody": _json(ReportRequest.model_json_schema()),
        "responses": {
            "200": {"description": "{message, research_id} in the background; else the report"},
            "400": {"description": "the task cannot run (the job is saved as failed)"},
            "422": {"description": "malformed body"},
            "429": {"description": "MAX_TASKS_PER_KEY tasks already run for this key"},
            "504": {"description": "TASK_TIMEOUT_S passed"},
        },
    },
    ("post", "/api/chat"): {"requestBody": _json(ChatRequest.model_json_schema())},
    ("post", "/api/reports"): {"requestBody": _json(_SAVED_REPORT)},
    ("put", "/api/reports/{research_id}"): {"requestBody": _json(_SAVED_REPORT)},
    ("get", "/api/reports"): {"parameters": [_REPORT_IDS, _USER]},
    ("get", "/api/jobs"): {"parameters": [_USER]},
}
for _route in (
    ("get", "/report/{research_id}"),
    ("get", "/api/jobs/{research_id}"),
    ("get", "/api/reports/{research_id}"),
    ("delete", "/api/reports/{research_id}"),
    ("get", "/api/reports/{research_id}/chat"),
    ("post", "/api/reports/{research_id}/chat"),
):
    _JOB_DETAILS.setdefault(_route, {})["responses"] = {"200": {"description": "OK"}, "404": _NOT_YOURS}
for _details in _JOB_DETAILS.values():
    _details["tags"] = ["jobs"]


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
    ("get", "/api/retrievers"): {
        "responses": {
            "200": {
                "description": "the retrievers, and the user and limits this key's tasks run with",
                **_json(RetrieversAnswer.model_json_schema()),
            },
            "401": {"description": "the server has keys and this request sent none or a wrong one"},
        },
    },
    ("post", "/api/documents"): {"tags": ["documents"], "requestBody": _UPLOAD, "parameters": [_USER]},
    ("get", "/api/documents"): {"tags": ["documents"], "parameters": [*_PAGED, _USER]},
    ("get", "/api/documents/{id}"): {"tags": ["documents"], "parameters": [_USER]},
    ("delete", "/api/documents/{id}"): {"tags": ["documents"], "parameters": [_USER]},
    **_JOB_DETAILS,
}


def _operation(method: str, path: str, handler: Any) -> dict[str, Any]:
    doc = inspect.getdoc(handler) or handler.__name__.replace("_", " ")
    operation: dict[str, Any] = {
        "operationId": f"{method}_{_WORDLESS.sub('_', path).strip('_') or 'root'}",
        "summary": doc.splitlines()[0],
        "security": [] if path in _PUBLIC else _BEARER,
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
        if method in ("head", "options", "*") or not path:  # options: CORS preflights, not operations
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
