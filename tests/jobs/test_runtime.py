"""What a server process opens at its start (jobs/runtime.py), before its first task needs it."""

from __future__ import annotations

from fedresearch.web.keys import RUNTIME
from tests.conftest import make_settings
from tests.fakes.openai_chat import FakeOpenAI


async def test_the_model_s_client_is_made_at_start_off_the_loop(tmp_path, start_server) -> None:
    """The SDK's import and the client's SSL context took the loop 0.7 s at a process's first task."""
    model = await FakeOpenAI().start()
    try:
        settings = make_settings(tmp_path, llm_base_url=model.url, llm_model="fake-model", embeddings=False)
        server = await start_server(settings)
        assert len(server.app[RUNTIME].tools.llm._made) == 1  # type: ignore[union-attr]
    finally:
        await model.stop()


async def test_without_a_model_no_client_is_made(tmp_path, start_server) -> None:
    server = await start_server(make_settings(tmp_path, embeddings=False))
    assert server.app[RUNTIME].tools.llm._made == {}  # type: ignore[union-attr]
