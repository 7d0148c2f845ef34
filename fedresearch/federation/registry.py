"""The retrievers this server offers, built from an explicit tuple of upstream entries
(`fedresearch.retrievers.ADAPTERS`), never by scanning packages. Each upstream's adapters are built
from its own settings alone: the builder reads them (`Settings.upstream`) and hands them over."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from fedresearch.core.settings import Settings
from fedresearch.federation.contract import About, Adapter, UpstreamSettings
from fedresearch.federation.planning import ALIASES

S = TypeVar("S", bound=UpstreamSettings)


@dataclass(frozen=True)
class Upstream:
    """One entry of the registry tuple: what the upstream is, and how its adapters are built from the
    server's settings. Made with `Upstream.of`, which reads the upstream's own settings class from
    its About and passes the factory nothing else."""

    about: About
    build: Callable[[Settings], Iterable[Adapter]] = field(repr=False)

    @classmethod
    def of(cls, about: About[S], adapters: Callable[[S], Iterable[Adapter]]) -> Upstream:
        """The entry for an upstream module: its About and its adapter factory, which takes an
        instance of the About's settings class (the type checker holds the two to each other)."""
        return cls(about, lambda settings: adapters(settings.upstream(about.settings)))


def build_registry(settings: Settings, upstreams: Sequence[Upstream]) -> dict[str, Adapter]:
    registry: dict[str, Adapter] = {}
    for upstream in upstreams:
        for adapter in upstream.build(settings):
            if adapter.name in registry or adapter.name in ALIASES:
                raise RuntimeError(f"two retrievers (or a retriever and an alias) are named {adapter.name!r}")
            registry[adapter.name] = adapter
    return registry
