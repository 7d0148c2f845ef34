"""From a request's headers to a validated plan: which retrievers run, for whom, with what options."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from core.errors import RequestError
from core.models import ReportSource, ResearchRequest, library_type
from core.settings import Settings
from retrievers.base import Retriever, SearchOptions

_KEY_HEADERS = ("tavily_api_key", "google_api_key", "google_cx_key")
_LIBRARY_DEFAULTS = ["internal_biblio"]


@dataclass(frozen=True)
class Plan:
    names: list[str]
    options: SearchOptions


def _names(raw: str) -> list[str]:
    names: list[str] = []
    for part in raw.split(","):
        name = part.strip().lower()
        if name and name not in names:
            names.append(name)
    return names


def choose_retrievers(request: ResearchRequest, settings: Settings, registry: dict[str, Retriever]) -> list[str]:
    named = request.header("retrievers") or request.header("retriever")
    if named:
        names, origin = _names(named), "headers.retrievers"
    elif request.report_source is not None:
        web = [name for name, r in registry.items() if r.about.kind == "web"]
        configured = [name for name in web if registry[name].configured(settings)]
        web = configured or web  # none configured: run them all so each says why it is skipped
        names = {
            ReportSource.local: _LIBRARY_DEFAULTS,
            ReportSource.web: web,
            ReportSource.hybrid: _LIBRARY_DEFAULTS + web,
        }[request.report_source]
        origin = f"report_source {request.report_source.value}"
    else:
        names, origin = list(settings.default_retrievers), "DEFAULT_RETRIEVERS"
    if not names:
        raise RequestError(f"no retriever named in {origin}; known retrievers: {', '.join(registry)}")
    unknown = [name for name in names if name not in registry]
    if unknown:
        raise RequestError(
            f"unknown retriever{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
            f"in {origin}; known retrievers: {', '.join(registry)}"
        )
    return names


def choose_user(
    request: ResearchRequest, settings: Settings, needed_by: list[str], bound_user: str | None
) -> str | None:
    asked = request.header("user_id")
    if bound_user is not None and asked is not None and asked != bound_user:
        raise RequestError(f"this API key acts as user {bound_user!r} and cannot act as {asked!r}")
    user = asked or bound_user or settings.default_user
    if user is None and needed_by:
        raise RequestError(
            f"user_id is required by {', '.join(needed_by)}: send it in headers.user_id, "
            "or set FEDRESEARCH_DEFAULT_USER on a single-user server"
        )
    return user


def allowed_base_url(url: str, settings: Settings) -> str:
    parts = urlsplit(url)
    host = (parts.hostname or "").lower().rstrip(".")  # "localhost." is localhost
    if parts.scheme not in ("http", "https") or not host:
        raise RequestError("headers.internal_api_base_url must be an http(s) URL")
    if host not in settings.internal_api_allowed_hosts:
        raise RequestError(
            f"headers.internal_api_base_url host {host!r} is not allowed: "
            "the operator must add it to INTERNAL_API_ALLOWED_HOSTS"
        )
    return url


def plan_request(
    request: ResearchRequest,
    settings: Settings,
    registry: dict[str, Retriever],
    bound_user: str | None = None,
) -> Plan:
    names = choose_retrievers(request, settings, registry)
    needed_by = [name for name in names if registry[name].about.needs_user]
    user = choose_user(request, settings, needed_by, bound_user)

    kind = library_type(request.header("internal_api_type"))
    if kind is None:
        raise RequestError(
            f"headers.internal_api_type {request.header('internal_api_type')!r} is not one of biblio, highlight, File"
        )
    base_url = request.header("internal_api_base_url")
    if base_url is not None:
        base_url = allowed_base_url(base_url, settings)

    overrides = {name: value for name in _KEY_HEADERS if (value := request.header(name))}
    options = SearchOptions(
        query=request.task,
        max_results=request.max_search_results or settings.max_search_results,
        user_id=user,
        internal_api_type=kind,
        internal_api_base_url=base_url,
        query_domains=tuple(request.query_domains),
        overrides=overrides,
    )
    return Plan(names=names, options=options)
