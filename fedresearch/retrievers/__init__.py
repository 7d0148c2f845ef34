"""Adapters only: one module per upstream, each pure (build the request, parse the answer), each with
its own settings (a `UpstreamSettings` class its `About` names).

`ADAPTERS` is the registry: a new adapter is one module, its test, and one line here.
"""

from __future__ import annotations

from fedresearch.federation.registry import Upstream
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

ADAPTERS: tuple[Upstream, ...] = (
    Upstream.of(internal_api.about, internal_api.adapters),
    Upstream.of(tavily.about, tavily.adapters),
    Upstream.of(google.about, google.adapters),
    Upstream.of(dify.about, dify.adapters),
    Upstream.of(openalex.about, openalex.adapters),
    Upstream.of(crossref.about, crossref.adapters),
    Upstream.of(arxiv.about, arxiv.adapters),
    Upstream.of(semantic_scholar.about, semantic_scholar.adapters),
    Upstream.of(pubmed.about, pubmed.adapters),
    Upstream.of(europepmc.about, europepmc.adapters),
    Upstream.of(searxng.about, searxng.adapters),
    Upstream.of(brave.about, brave.adapters),
)
