"""The LangBot plugin, loaded by the real langbot-plugin SDK, retrieving from a running server."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from langbot_plugin.api.entities.builtin.rag.context import RetrievalContext
from langbot_plugin.api.entities.builtin.rag.errors import RetrievalError
from langbot_plugin.cli.run.controller import PluginRuntimeController
from langbot_plugin.cli.utils.page_components import discover_plugin_components
from langbot_plugin.utils.discover.engine import ComponentDiscoveryEngine

from fedresearch.library.facade import Library
from fedresearch.library.ingest import ingest
from tests.conftest import EXAMPLES, make_settings

PLUGIN = Path(__file__).resolve().parents[2] / "integrations" / "langbot"


@pytest.fixture
async def server_url(tmp_path, fakes, start_server, encoder):
    bases = tmp_path / "kb.toml"
    bases.write_text('[knowledge_bases.lab]\nuser_id = "alice"\nretrievers = ["internal_biblio", "tavily"]\n')
    settings = make_settings(tmp_path, fakes, api_keys="lb-key:alice", knowledge_bases=bases)
    ingest(Library(settings.library_dir, encoder=encoder), "alice", [EXAMPLES])
    return (await start_server(settings)).url


@pytest.fixture
def load_engine(monkeypatch):
    """Load the plugin exactly as `lbp run` does, and inject its config as the SDK does."""
    monkeypatch.chdir(PLUGIN)
    loaded = set(sys.modules)

    async def load(config):
        discovery = ComponentDiscoveryEngine()
        manifest = discovery.load_component_manifest("manifest.yaml", owner="builtin", no_save=True)
        components = discover_plugin_components(manifest, discovery)
        controller = PluginRuntimeController(manifest, components, stdio=True, ws_debug_url="")
        # what controller.initialize() does once a LangBot runtime has connected (there is none here)
        settings = {"enabled": True, "priority": 0, "plugin_config": config}
        await controller._initialize_container(controller.plugin_container, None, settings)
        (engine,) = [c for c in controller.plugin_container.components if c.manifest.kind == "KnowledgeEngine"]
        return engine

    yield load
    for name in set(sys.modules) - loaded:  # the plugin's `main` and `components` must not leak
        if name == "main" or name.startswith("components"):
            del sys.modules[name]


async def test_retrieve_through_the_sdk(server_url, load_engine):
    container = await load_engine({"server_url": server_url, "api_key": "lb-key", "knowledge_id": "lab", "top_k": 5})
    assert container.manifest.get_python_component_class().get_capabilities() == []
    engine = container.component_instance
    response = await engine.retrieve(
        RetrievalContext(query="reciprocal rank fusion", knowledge_base_id="lb-1", retrieval_settings={"top_k": 3})
    )
    assert len(response.results) == 3 and response.total_found == 3
    first = response.results[0]
    assert first.content[0].type == "text" and first.content[0].text
    assert first.score is not None and first.distance == pytest.approx(1 - first.score)
    assert first.metadata["retrievers"] and first.id == first.metadata["href"]
    scores = [entry.score for entry in response.results]
    assert scores == sorted(scores, reverse=True)

    filtered = await engine.retrieve(
        RetrievalContext(query="retrieval", retrieval_settings={"top_k": 10}, filters={"year": {"$gte": 2020}})
    )
    assert filtered.results and all(entry.metadata["year"] >= 2020 for entry in filtered.results)
    either = await engine.retrieve(
        RetrievalContext(
            query="retrieval", retrieval_settings={"top_k": 10}, filters={"$or": [{"year": 1975}, {"year": 1970}]}
        )
    )
    assert {entry.metadata["year"] for entry in either.results} == {1975, 1970}


def chroma_holds(where, metadata):
    """Chroma's `where` semantics, written out independently of the plugin, to check its answers."""
    tests = {
        "$eq": lambda a, b: a == b,
        "$ne": lambda a, b: a != b,
        "$gt": lambda a, b: a is not None and a > b,
        "$gte": lambda a, b: a is not None and a >= b,
        "$lt": lambda a, b: a is not None and a < b,
        "$lte": lambda a, b: a is not None and a <= b,
        "$in": lambda a, b: a in b,
        "$nin": lambda a, b: a not in b,
    }
    for key, test in where.items():
        if key == "$and" and not all(chroma_holds(part, metadata) for part in test):
            return False
        if key == "$or" and not any(chroma_holds(part, metadata) for part in test):
            return False
        if not key.startswith("$"):
            for operator, value in (test if isinstance(test, dict) else {"$eq": test}).items():
                if not tests[operator](metadata.get(key), value):
                    return False
    return True


NESTED = [
    {"$or": [{"year": 2009, "type": "highlight"}, {"year": 2021}]},
    {"$and": [{"year": {"$gte": 2000}}, {"$or": [{"type": "highlight"}, {"year": {"$lt": 2005}}]}]},
    {"$or": [{"$and": [{"year": {"$gt": 2019}}, {"type": {"$ne": "biblio"}}]}, {"year": {"$in": [1970, 1975]}}]},
    {"type": "biblio", "year": {"$nin": [2020, 2021], "$lte": 2010}},
]


@pytest.mark.parametrize("where", NESTED)
async def test_nested_chroma_filters_are_exact(server_url, load_engine, where):
    container = await load_engine({"server_url": server_url, "api_key": "lb-key"})
    engine = container.component_instance
    context = RetrievalContext(
        query="retrieval ranking search",
        retrieval_settings={"top_k": 30},
        creation_settings={"knowledge_id": "lab"},
        filters=where,
    )
    response = await engine.retrieve(context)
    assert response.results, where
    violating = [entry.metadata for entry in response.results if not chroma_holds(where, entry.metadata)]
    assert violating == []
    ids = [entry.id for entry in response.results]
    assert len(ids) == len(set(ids))


async def test_unsupported_operators_are_clear_errors(server_url, load_engine):
    container = await load_engine({"server_url": server_url, "api_key": "lb-key", "knowledge_id": "lab"})
    engine = container.component_instance
    for where, message in [
        ({"year": {"$regex": "20.*"}}, "unsupported filter operator '\\$regex' on 'year'"),
        ({"$not": {"year": 2020}}, "unsupported filter operator '\\$not'"),
        ({"year": {"$in": 2020}}, "\\$in on 'year' takes a list"),
        ({"$or": {"year": 2020}}, "\\$or takes a non-empty list"),
        ({"$and": [{"$or": [{"year": y}, {"type": "x"}]} for y in range(5)]}, "more than 16 alternatives"),
    ]:
        with pytest.raises(RetrievalError, match=message):
            await engine.retrieve(RetrievalContext(query="q", filters=where))


async def test_each_langbot_knowledge_base_chooses_its_knowledge_id_and_top_k(
    tmp_path, fakes, start_server, encoder, load_engine
):
    bases = tmp_path / "kb.toml"
    bases.write_text(
        '[knowledge_bases.papers]\nuser_id = "alice"\nretrievers = ["internal_biblio"]\n'
        '[knowledge_bases.notes]\nuser_id = "alice"\nretrievers = ["internal_highlight"]\n'
    )
    settings = make_settings(tmp_path, fakes, api_keys="lb-key:alice", knowledge_bases=bases)
    ingest(Library(settings.library_dir, encoder=encoder), "alice", [EXAMPLES])
    url = (await start_server(settings)).url
    container = await load_engine({"server_url": url, "api_key": "lb-key"})  # one install, no knowledge id
    engine = container.component_instance
    papers = await engine.retrieve(
        RetrievalContext(query="rank fusion", creation_settings={"knowledge_id": "papers", "top_k": 2})
    )
    notes = await engine.retrieve(
        RetrievalContext(query="rank fusion", creation_settings={"knowledge_id": "notes", "top_k": 4})
    )
    assert len(papers.results) == 2 and {e.metadata["type"] for e in papers.results} == {"biblio"}
    assert len(notes.results) == 4 and {e.metadata["type"] for e in notes.results} == {"highlight"}
    with pytest.raises(RetrievalError, match="no knowledge id"):
        await engine.retrieve(RetrievalContext(query="rank fusion"))


def test_the_sdk_range_is_declared():
    requirements = (PLUGIN / "requirements.txt").read_text()
    assert "langbot-plugin>=0.7,<0.8" in requirements


async def test_server_errors_reach_langbot_as_clear_exceptions(server_url, load_engine):
    container = await load_engine({"server_url": server_url, "api_key": "wrong", "knowledge_id": "lab"})
    with pytest.raises(RetrievalError, match="HTTP 403 \\(error_code 1002\\)"):
        await container.component_instance.retrieve(RetrievalContext(query="q"))
    container = await load_engine({"server_url": server_url, "api_key": "lb-key", "knowledge_id": "missing"})
    with pytest.raises(RetrievalError, match="HTTP 404 \\(error_code 2001\\)"):
        await container.component_instance.retrieve(RetrievalContext(query="q"))
    container = await load_engine({"server_url": "http://127.0.0.1:9", "api_key": "k", "knowledge_id": "lab"})
    with pytest.raises(RetrievalError, match="did not answer"):
        await container.component_instance.retrieve(RetrievalContext(query="q"))
