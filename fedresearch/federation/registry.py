"""The retrievers this server offers, built from an explicit tuple of adapter factories
(`fedresearch.retrievers.ADAPTERS`), never by scanning packages."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from fedresearch.core.settings import Settings
from fedresearch.federation.contract import Adapter
from fedresearch.federation.planning import ALIASES

AdapterFactory = Callable[[Settings], Iterable[Adapter]]


def build_registry(settings: Settings, factories: Sequence[AdapterFactory]) -> dict[str, Adapter]:
    registry: dict[str, Adapter] = {}
    for factory in factories:
        for adapter in factory(settings):
            if adapter.name in registry or adapter.name in ALIASES:
                raise RuntimeError(f"two retrievers (or a retriever and an alias) are named {adapter.name!r}")
            registry[adapter.name] = adapter
    return registry
