"""The adapter contract: what an upstream is (`About`), its settings (`UpstreamSettings`), and two pure
steps around the I/O.

As in SearxNG's engines, an adapter builds its request and parses the answer; it never opens a
connection, sets a deadline or retries. The runner (runner.py) owns all of that, so a new adapter
is one module of pure functions, tested with recorded answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Literal, Protocol

from pydantic import ValidationInfo, field_validator
from pydantic_settings import BaseSettings
from typing_extensions import TypeVar

from fedresearch.core.models import SearchResult, SourceKind
from fedresearch.core.settings import SETTINGS_SOURCES
from fedresearch.federation.ratelimit import Rate
from fedresearch.library.search import Passage


class UpstreamSettings(BaseSettings):
    """One upstream's operator settings, read from the environment and `.env` as the server's own are
    (core/settings.py): each upstream module declares a subclass with its fields, env names given as
    `validation_alias`, secrets as `SecretStr`, and its adapters see nothing else. This class itself
    has no fields: the settings of an upstream that needs none."""

    model_config = SETTINGS_SOURCES

    @field_validator("*", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object, info: ValidationInfo) -> object:
        # `NAME=` (in `.env` or the environment) leaves a setting that is unset by default unset
        unset_by_default = info.field_name is not None and cls.model_fields[info.field_name].default is None
        return None if value == "" and unset_by_default else value


# the settings class an About names; covariant, so that any upstream's About is an `About`
Own = TypeVar("Own", bound=UpstreamSettings, default=UpstreamSettings, covariant=True)
# About's default for it: `Own`'s own default, typed Any as mypy matches no class to a class-scoped TypeVar
_NO_SETTINGS: Any = UpstreamSettings


@dataclass(frozen=True)
class About(Generic[Own]):
    """What an upstream is. Every field is read: `kind` groups results in reports and decides how a
    score is calibrated and whether answers are cached; `credentials` names the per-request headers
    the adapter may read; `needs_user` makes `user_id` required; `results` is how the runner decodes
    the answer; `rate` is the upstream's published limit, which the runner keeps every task of the
    process under (ratelimit.py; None: no limit to keep); `website` and `needs_key` are shown to
    operators (GET /api/retrievers); `settings` is the upstream's settings class, whose instance the
    registry builds and hands to the module's adapter factory (federation/registry.py)."""

    website: str
    kind: SourceKind
    needs_key: bool
    needs_user: bool
    results: Literal["JSON", "XML", "text"] = "JSON"
    credentials: tuple[str, ...] = ()
    rate: Rate | None = None
    settings: type[Own] = _NO_SETTINGS


class RetrieverFailed(Exception):
    """The upstream could not answer; the message is safe to show (no secrets, no URLs with keys).

    `status` is the upstream's HTTP status when it answered; `transient` marks failures worth
    retrying (5xx, connection errors, timeouts); `retry_after` is the upstream's Retry-After.
    """

    def __init__(
        self, message: str, *, status: int | None = None, transient: bool = False, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.transient = transient or (status is not None and status >= 500)
        self.retry_after = retry_after


class RetrieverSkipped(Exception):
    """The retriever cannot run in this setup (e.g. no API key); the message says how to enable it."""


@dataclass(frozen=True)
class SearchOptions:
    """What one task asks of every adapter, already validated."""

    query: str
    max_results: int
    user_id: str | None = None
    internal_api_type: str = "biblio"
    internal_api_base_url: str | None = None
    query_domains: tuple[str, ...] = ()
    credentials: Mapping[str, str] = field(default_factory=dict, repr=False)
    # who asks (an API key and the user it acts for): the breaker counts errors per asker
    asker: str = ""

    def credential(self, name: str) -> str | None:
        """A per-request upstream key the client sent, if any."""
        return self.credentials.get(name)

    def for_adapter(self, about: About) -> SearchOptions:
        """The options one adapter sees: only the per-request keys it declares."""
        own = {name: value for name, value in self.credentials.items() if name in about.credentials}
        return self if own == self.credentials else replace(self, credentials=own)


@dataclass(frozen=True)
class HttpRequest:
    method: Literal["GET", "POST"]
    url: str
    params: Mapping[str, str] | None = None
    json: Any = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # may carry a key
    # the upstream's own deadline and the setting it comes from; None: RETRIEVER_TIMEOUT_S
    deadline: tuple[float, str] | None = None


@dataclass(frozen=True)
class LibraryRequest:
    """A search of the embedded library, answered in process with typed passages."""

    user_id: str
    kind: str | None
    query: str
    top_k: int
    documents: bool = False  # one hit per document (a paper), top_k counting documents


Request = HttpRequest | LibraryRequest


@dataclass(frozen=True)
class HttpAnswer:
    request: HttpRequest
    status: int
    headers: Mapping[str, str]
    payload: Any  # decoded as `About.results` says: JSON, or text; None for an undecodable error body
    large: bool = False  # the body was large enough that decoding and parsing it run off the event loop


@dataclass(frozen=True)
class LibraryAnswer:
    request: LibraryRequest
    passages: list[Passage]


Answer = HttpAnswer | LibraryAnswer


@dataclass
class Hits:
    """What one answer yields: results, warnings about skipped items, and the requests it calls for
    next (another page, the second step of a two-step API), which the runner sends."""

    results: list[SearchResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    follow: list[Request] = field(default_factory=list)


class Adapter(Protocol):
    """One retriever. Its upstream module's factory builds it from that upstream's settings alone
    (`About.settings`), so it holds whatever of them it reads; nothing else reaches it."""

    name: str  # the retriever name clients use
    label: str  # how messages name the upstream

    @property
    def about(self) -> About: ...  # read-only: an About of any upstream's settings class is an About

    def missing_setup(self) -> str | None:
        """What the operator must set before this adapter can run with no per-request key; None when ready."""
        ...

    def build_request(self, options: SearchOptions) -> Request:
        """Pure: the first request for `options`; raises RetrieverSkipped when it cannot run."""
        ...

    def parse_response(self, answer: Answer, options: SearchOptions) -> Hits:
        """Pure: the answer's results; raises RetrieverFailed when the answer is unusable."""
        ...

    def describe_error(self, answer: HttpAnswer) -> str:
        """Pure: a safe message for an answer with an HTTP error status."""
        ...


def first_text(mapping: Mapping[str, Any], keys: tuple[str, ...]) -> str | None:
    """The first of `keys` whose value is a non-blank string or a number, as text."""
    for key in keys:
        value = mapping.get(key)
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            return str(value)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def unit_score(value: object) -> float | None:
    """A source score if it is already a number in 0..1; anything else is not comparable."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if 0.0 <= number <= 1.0 else None


def http_error(label: str, answer: HttpAnswer) -> str:
    """The message for an error answer that says nothing more useful than its status."""
    return f"{label} answered HTTP {answer.status}"
