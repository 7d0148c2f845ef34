"""Every module in this package that defines `retrievers(settings)` is an adapter and contributes its names."""

from __future__ import annotations

import importlib
import pkgutil

import retrievers as package
from core.settings import Settings
from retrievers.base import Retriever


def build_registry(settings: Settings) -> dict[str, Retriever]:
    registry: dict[str, Retriever] = {}
    for module_info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{package.__name__}.{module_info.name}")
        factory = getattr(module, "retrievers", None)
        if factory is None:
            continue
        for retriever in factory(settings):
            if retriever.name in registry:
                raise RuntimeError(f"two adapters are named {retriever.name!r}")
            registry[retriever.name] = retriever
    return registry


async def close_registry(registry: dict[str, Retriever]) -> None:
    for retriever in registry.values():
        await retriever.aclose()
