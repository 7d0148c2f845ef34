"""Runs inside AgentScope's own environment (`.venv-agentscope`: AgentScope 2.0.x pins an `mcp` older
than the server's), against a running fedresearch server and a fake OpenAI-compatible model:
`python tests/agentscope_scenario.py SERVER_URL LLM_URL`. Prints one JSON object of what it saw;
tests/integrations/test_agentscope.py starts the servers and checks it."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from agentscope.agent import Agent
from agentscope.credential import OpenAICredential
from agentscope.message import Msg, TextBlock
from agentscope.middleware import RAGMiddleware
from agentscope.model import OpenAIChatModel
from agentscope.rag import Chunk, KnowledgeBase

sys.path.insert(0, sys.argv[3])
from fedresearch_agentscope import FedresearchError, FedresearchKnowledgeBase

FUSION = [
    "Reciprocal rank fusion merges several rankings by summing 1/(60 + rank) for each document.",
    "It needs no score calibration between the systems it fuses, which is why hybrid search uses it.",
]
QUESTION = "How does reciprocal rank fusion combine rankings?"


def chunks_of(texts: list[str], source: str) -> list[Chunk]:
    return [
        Chunk(content=TextBlock(text=text), source=source, chunk_index=i, total_chunks=len(texts))
        for i, text in enumerate(texts)
    ]


def texts_of(results: list[Any]) -> list[str]:
    return [result.chunk.content.text for result in results]


async def main(server: str, llm: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    alice = FedresearchKnowledgeBase(
        "alice-notes", "Alice's reading notes", server, "alice-key", metadata_filter={"tenant_id": "alice"}
    )
    bob = FedresearchKnowledgeBase("bob-notes", "Bob's notes", server, "bob-key", user_id="bob")
    seen["is_knowledge_base"] = isinstance(alice, KnowledgeBase)

    meta = {"title": "Notes on rank fusion", "year": 2009, "authors": ["Cormack", "Clarke"]}
    first_id = await alice.insert_document(chunks_of(FUSION, "fusion.md"), "rrf-notes", meta)
    await bob.insert_document(chunks_of(["Bob's unpublished trick: quantize the embeddings."], "b.md"))
    seen["alice_documents"] = [d.model_dump() for d in await alice.list_documents()]
    seen["bob_documents"] = [d.model_dump() for d in await bob.list_documents()]

    results = await alice.search([QUESTION], top_k=3)
    seen["search"] = [r.model_dump(mode="json") for r in results]
    seen["alice_search_for_bob"] = texts_of(await alice.search(["quantize the embeddings trick"], top_k=5))
    seen["threshold_drops"] = len(await alice.search([QUESTION], top_k=3, score_threshold=0.999))

    revised = chunks_of([*FUSION, "Cormack et al. proposed it in 2009."], "fusion.md")
    again_id = await alice.insert_document(revised, "rrf-notes")
    listing = await alice.list_documents()
    seen["replaced_same_id"] = [first_id, again_id, len(listing)]
    seen["after_replace"] = [d.document_id for d in listing]

    agentic = RAGMiddleware([alice, bob])
    (tool,) = await agentic.list_tools()
    answer = await tool.call(query=QUESTION, knowledge_bases=["alice-notes"])
    seen["agentic_tool"] = {"name": tool.name, "text": " ".join(b.text for b in answer.content)}

    static = RAGMiddleware([alice], RAGMiddleware.Parameters(mode="static", top_k=2))
    model = OpenAIChatModel(OpenAICredential(api_key="sk-test", base_url=llm), model="gpt-4.1", max_retries=0)
    agent = Agent(name="assistant", system_prompt="Answer from the notes.", model=model, middlewares=[static])
    reply = await agent.reply(Msg(name="user", content=[TextBlock(text=QUESTION)], role="user"))
    seen["static_reply"] = " ".join(b.text for b in reply.content if isinstance(b, TextBlock))

    try:
        await FedresearchKnowledgeBase("x", "x", server, "alice-key", user_id="bob").list_documents()
        seen["cross_tenant"] = "allowed"
    except FedresearchError as error:
        seen["cross_tenant"] = str(error)

    await alice.delete_document("rrf-notes")
    seen["after_delete"] = len(await alice.list_documents())
    for kb in (alice, bob):
        await kb.aclose()
    return seen


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2]))))
