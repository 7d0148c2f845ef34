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

from fedresearch.library.embedded import Library
from fedresearch.library.ingest import ingest
from tests.conftest import EXAMPLES, make_settings

PLUGIN = Path(__file__).resolve().parent.parent / "integrations" / "langbot"


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
