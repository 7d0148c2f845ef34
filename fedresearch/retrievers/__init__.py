"""Adapters only: one module per upstream, each pure (build the request, parse the answer).

`ADAPTERS` is the registry: a new adapter is one module, its test, and one line here.
"""

from __future__ import annotations

from fedresearch.federation.registry import AdapterFactory
from fedresearch.retrievers import dify, google, internal_api, tavily

ADAPTERS: tuple[AdapterFactory, ...] = (
    internal_api.adapters,
    tavily.adapters,
    google.adapters,
    dify.adapters,
)
