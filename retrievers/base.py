"""What every adapter is: a declaration of its upstream plus one `search` coroutine.

As in SearxNG's engines, each adapter module keeps two pure steps (build the request, parse
the answer) apart from the I/O, so parsing is testable with a recorded answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import aiohttp

from core.models import SearchResult
from core.settings import Settings

if TYPE_CHECKING:
    from library.store import Library


@dataclass(frozen=True)
class About:
    website: str
    kind: Literal["library", "web", "knowledge"]
    needs_key: bool
    needs_user: bool
    results: str = "JSON"


@dataclass
class Hits:
    results: list[SearchResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


class RetrieverFailed(Exception):
    """The upstream could not answer; the message is safe to show (no secrets, no URLs with keys)."""


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
    overrides: dict[str, str] = field(default_factory=dict, repr=False)

    def key(self, name: str, fallback: str | None) -> str | None:
        """A per-request upstream key if the client sent one, else the operator's."""
        return self.overrides.get(name) or fallback


@dataclass(frozen=True)
class Deps:
    """Everything an adapter may use, passed in explicitly."""

    session: aiohttp.ClientSession
    settings: Settings
    library: Library | None = None


class Retriever(Protocol):
    name: str
    about: About

    def configured(self, settings: Settings) -> bool:
        """Whether the operator gave it what it needs to run (keys, URLs)."""
        ...

    async def search(self, options: SearchOptions, deps: Deps) -> Hits: ...

    async def aclose(self) -> None: ...


def first_text(mapping: dict[str, Any], keys: tuple[str, ...]) -> str | None:
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
