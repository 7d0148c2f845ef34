"""AgentScope's own classes against a running fedresearch: `KnowledgeBase` search, insert, list and
delete, `RAGMiddleware` in agentic mode (its `search_knowledge` tool) and static mode (a real `Agent`
whose `OpenAIChatModel` talks to a fake OpenAI-compatible model), tenants mapped to users and keys.

AgentScope 2.0.x pins `mcp<2` and the server needs `mcp>=2.3`, so the client side runs in its own
environment (`make test` builds `.venv-agentscope` from integrations/agentscope/requirements.txt),
as it would in an AgentScope user's process."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from tests.conftest import make_settings
from tests.fakes.openai_chat import Answer, FakeOpenAI

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-agentscope" / "bin" / "python"
INTEGRATION = ROOT / "integrations" / "agentscope"


@pytest.fixture
def agentscope_python() -> Path:
    if not PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{PYTHON} is missing: `make test` builds it")
        pytest.skip(f"AgentScope's environment is not built ({PYTHON}): run `make test`")
    return PYTHON


async def test_agentscope_knowledge_base_and_rag_middleware(tmp_path, start_server, encoder, agentscope_python):
    server = await start_server(make_settings(tmp_path, api_keys="alice-key:alice,bob-key:bob"))
    llm = await FakeOpenAI().start()
    llm.script = [lambda body: Answer(pieces=["Fusion sums ", "reciprocal ranks."])]
    try:
        process = await asyncio.create_subprocess_exec(
            str(agentscope_python),
            str(ROOT / "tests" / "agentscope_scenario.py"),
            server.url,
            llm.url,
            str(INTEGRATION),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), timeout=180)
    finally:
        await llm.stop()
    assert process.returncode == 0, err.decode()[-3000:]
    seen = json.loads(out.decode().strip().splitlines()[-1])

    assert seen["is_knowledge_base"]
    (alices,) = seen["alice_documents"]
    assert alices["source"] == "Notes on rank fusion" and alices["chunk_count"] >= 1
    assert alices["metadata"]["source"] == "upload:rrf-notes.md"
    assert [d["source"] for d in seen["bob_documents"]] != [alices["source"]]

    top = seen["search"][0]
    assert "1/(60 + rank)" in top["chunk"]["content"]["text"]
    assert top["document_id"] == alices["document_id"] and 0 < top["score"] <= 1
    assert top["chunk"]["metadata"]["tenant_id"] == "alice"
    assert top["chunk"]["total_chunks"] >= top["chunk"]["chunk_index"] + 1
    assert all("quantize" not in text for text in seen["alice_search_for_bob"])  # Bob's note stays Bob's
    assert seen["threshold_drops"] == 0

    first_id, again_id, count = seen["replaced_same_id"]
    assert count == 1 and first_id == alices["document_id"]  # the same id replaced it (under a new server id)
    assert seen["after_replace"] == [again_id]

    assert seen["agentic_tool"]["name"] == "search_knowledge"
    assert "reciprocal rank fusion" in seen["agentic_tool"]["text"].lower()
    # static mode: the middleware searched with the user's turn and put what it found in the prompt
    prompt = json.dumps(llm.requests[0]["messages"])
    assert "1/(60 + rank)" in prompt and "Cormack et al. proposed it in 2009" in prompt
    assert "quantize" not in prompt
    assert seen["static_reply"] == "Fusion sums reciprocal ranks."

    assert "403" in seen["cross_tenant"] and "alice" in seen["cross_tenant"]
    assert seen["after_delete"] == 0
