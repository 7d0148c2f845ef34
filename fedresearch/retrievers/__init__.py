"""Adapters only: one module per upstream, each pure (build the request, parse the answer).

`ADAPTERS` is the registry: a new adapter is one module, its test, and one line here.
"""

from __future__ import annotations

from fedresearch.federation.registry import AdapterFactory
from fedresearch.retrievers import (
    arxiv,
    brave,
    crossref,
    dify,
    europepmc,
    google,
    internal_api,
    openalex,
    pubmed,
    searxng,
    semantic_scholar,
    tavily,
)

ADAPTERS: tuple[AdapterFactory, ...] = (
    internal_api.adapters,
    tavily.adapters,
    google.adapters,
    dify.adapters,
    openalex.adapters,
    crossref.adapters,
    arxiv.adapters,
    semantic_scholar.adapters,
    pubmed.adapters,
    europepmc.adapters,
    searxng.adapters,
    brave.adapters,
)
