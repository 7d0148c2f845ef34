"""Fake upstreams: real HTTP servers on 127.0.0.1 that answer as the real ones do (their shapes read
from their documentation and clients), errors, delays, 429s and malformed answers included; one
module per upstream. This module starts the usual sets of them."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.fakes.arxiv import FakeArxiv
from tests.fakes.base import FakeUpstream, ScholarlyFake
from tests.fakes.brave import FakeBrave
from tests.fakes.crossref import FakeCrossref
from tests.fakes.europepmc import FakeEuropePmc
from tests.fakes.google import FakeGoogle
from tests.fakes.literature_api import FakeLiteratureApi
from tests.fakes.openalex import FakeOpenAlex
from tests.fakes.pubmed import FakePubMed
from tests.fakes.searxng import FakeSearxng
from tests.fakes.semantic_scholar import FakeSemanticScholar
from tests.fakes.tavily import FakeTavily


async def start_all() -> dict[str, FakeUpstream]:
    return {
        "tavily": await FakeTavily().start(),
        "google": await FakeGoogle().start(),
        "internal": await FakeLiteratureApi().start(),
    }


async def start_scholarly() -> dict[str, ScholarlyFake]:
    fakes: list[tuple[str, ScholarlyFake]] = [
        ("openalex", FakeOpenAlex()),
        ("crossref", FakeCrossref()),
        ("arxiv", FakeArxiv()),
        ("semantic_scholar", FakeSemanticScholar()),
        ("pubmed", FakePubMed()),
        ("europepmc", FakeEuropePmc()),
        ("searxng", FakeSearxng()),
        ("brave", FakeBrave()),
    ]
    await asyncio.gather(*(fake.start() for _, fake in fakes))
    return dict(fakes)


def scholarly_settings(fakes: dict[str, ScholarlyFake]) -> dict[str, Any]:
    """Settings overrides that point every adapter at its fake (with keys where one is needed)."""
    return {
        "openalex_api_key": FakeOpenAlex.api_key,
        "openalex_api_base_url": fakes["openalex"].url,
        "crossref_api_base_url": fakes["crossref"].url,
        "arxiv_api_base_url": fakes["arxiv"].url,
        "semantic_scholar_api_base_url": fakes["semantic_scholar"].url,
        "pubmed_api_base_url": fakes["pubmed"].url,
        "europepmc_api_base_url": fakes["europepmc"].url,
        "searxng_url": fakes["searxng"].url,
        "brave_api_key": FakeBrave.api_key,
        "brave_api_base_url": fakes["brave"].url,
    }
