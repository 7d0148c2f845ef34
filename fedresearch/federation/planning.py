"""From a request's headers to a validated plan: which retrievers run, for whom, with what options."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedresearch.core.auth import Principal
from fedresearch.core.errors import RequestError
from fedresearch.core.identifiers import split_url
from fedresearch.core.models import ReportSource, ResearchRequest, SourceKind, library_type
from fedresearch.core.settings import Settings
from fedresearch.core.text import unique_names
from fedresearch.federation.contract import Adapter, SearchOptions

# names that stand for several retrievers, by the kind their About declares
ALIASES: dict[str, SourceKind] = {"library": "library", "scholar": "scholarly", "web": "web"}


# GPT-Researcher's own document stores, which a client cannot hand over a socket: the user's library
# is where their documents are here
_MY_DOCUMENTS = (ReportSource.azure, ReportSource.langchain_documents, ReportSource.langchain_vectorstore)


@dataclass(frozen=True)
class Plan:
    names: list[str]
    options: SearchOptions
    urls: tuple[str, ...] = ()  # pages to read whatever the retrievers find (source_urls, document_urls)
    notes: tuple[str, ...] = ()  # how the request was read, said to the client as warnings


def expand(name: str, registry: Mapping[str, Adapter]) -> list[str]:
    """A retriever name, or the names an alias stands for. `web` means the configured web retrievers
    (all of them when none is configured, so that each says why it is skipped)."""
    kind = ALIASES.get(name)
    if kind is None:
        return [name]
    members = [n for n, adapter in registry.items() if adapter.about.kind == kind]
    if kind == "web":
        configured = [n for n in members if registry[n].missing_setup() is None]
        return configured or members
    return members


def _defaults(request: ResearchRequest, settings: Settings) -> tuple[list[str], str]:
    source = request.report_source
    if only_urls(request):
        return [], "source_urls without complement_source_urls" if source is None else f"report_source {source}"
    if source is None:
        return list(settings.default_retrievers), "DEFAULT_RETRIEVERS"
    if source in _MY_DOCUMENTS:
        return ["library"], f"report_source {source.value}"
    names = {ReportSource.local: ["library"], ReportSource.web: ["web"], ReportSource.hybrid: ["library", "web"]}
    return names[source], f"report_source {source.value}"


def only_urls(request: ResearchRequest) -> bool:
    """GPT-Researcher reads only the given pages for `static`, and for source_urls without complement."""
    urls = bool(request.source_urls or request.document_urls)
    return request.report_source is ReportSource.static or (urls and not request.complement_source_urls)


def _notes(request: ResearchRequest) -> tuple[str, ...]:
    source = request.report_source
    if source in _MY_DOCUMENTS:
        return (f"report_source {source}: your documents live in your fedresearch library, which was searched",)
    return ()


def known_names(registry: Mapping[str, Adapter]) -> str:
    return f"{', '.join(registry)} (aliases: {', '.join(ALIASES)})"


def choose_retrievers(request: ResearchRequest, settings: Settings, registry: Mapping[str, Adapter]) -> list[str]:
    named = request.header("retrievers") or request.header("retriever")
    names, origin = (unique_names(named), "headers.retrievers") if named else _defaults(request, settings)
    if not names and only_urls(request):
        if not (request.source_urls or request.document_urls):
            raise RequestError(f"{origin} reads only the pages in source_urls, and none was given")
        return []
    if not names:
        raise RequestError(f"no retriever named in {origin}; known retrievers: {known_names(registry)}")
    unknown = [name for name in names if name not in registry and name not in ALIASES]
    if unknown:
        raise RequestError(
            f"unknown retriever{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
            f"in {origin}; known retrievers: {known_names(registry)}"
        )
    chosen = list(dict.fromkeys(member for name in names for member in expand(name, registry)))
    if not chosen:
        raise RequestError(f"{origin} names no retriever this server offers; known retrievers: {known_names(registry)}")
    return chosen


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
    parts = split_url(url)
    host = ((parts.hostname if parts else None) or "").lower().rstrip(".")  # "localhost." is localhost
    if parts is None or parts.scheme not in ("http", "https") or not host:
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
    registry: Mapping[str, Adapter],
    bound_user: str | None = None,
    principal: Principal | None = None,
) -> Plan:
    """What `request` runs: its retrievers and the options they see, for `principal` (who asks:
    the breaker counts an upstream's errors per asker)."""
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

    declared = {header for name in names for header in registry[name].about.credentials}
    credentials = {header: value for header in sorted(declared) if (value := request.header(header))}
    options = SearchOptions(
        query=request.task,
        max_results=request.max_search_results or settings.max_search_results,
        user_id=user,
        internal_api_type=kind,
        internal_api_base_url=base_url,
        query_domains=tuple(request.query_domains),
        credentials=credentials,
        asker=principal.asker(user) if principal is not None else "",
    )
    urls = tuple(dict.fromkeys([*request.source_urls, *request.document_urls]))
    return Plan(names=names, options=options, urls=urls, notes=_notes(request))


def scope_of(plan: Plan, registry: Mapping[str, Adapter]) -> dict[str, Any]:
    """What a follow-up search about this plan's report asks again, to keep with its job (in a file
    or in Redis) so a chat about it on another worker, or later, searches as the task did: its
    retrievers and how it read the library, never a key. A base URL that carries credentials is not
    kept, and neither are the library retrievers it served, which would search another library."""
    options = plan.options
    names, base_url = list(plan.names), options.internal_api_base_url
    parts = split_url(base_url) if base_url else None
    if base_url and (parts is None or parts.username or parts.password or parts.query):
        names, base_url = [name for name in names if registry[name].about.kind != "library"], None
    scope: dict[str, Any] = {"retrievers": names, "internal_api_type": options.internal_api_type}
    if base_url:
        scope["internal_api_base_url"] = base_url
    if options.query_domains:
        scope["query_domains"] = list(options.query_domains)
    scope["max_search_results"] = options.max_results
    return scope


def follow_up_request(question: str, scope: Mapping[str, Any], user: str | None) -> ResearchRequest:
    """A follow-up search for `question` within a job's kept scope (`scope_of`), as `user`; an
    empty scope (a job from before scopes were kept, a client's own report) asks the defaults."""
    headers: dict[str, Any] = {"user_id": user} if user else {}
    if scope.get("retrievers"):
        headers["retrievers"] = ",".join(scope["retrievers"])
    for name in ("internal_api_type", "internal_api_base_url"):
        if scope.get(name):
            headers[name] = scope[name]
    return ResearchRequest(
        task=question[:2000] or "?",
        headers=headers,
        query_domains=list(scope.get("query_domains", ())),
        max_search_results=scope.get("max_search_results"),
    )
