"""Counting a request's tokens without the model's tokenizer, and the budget every request to the model
fits: never below what a server counts, never sent when over, and each server's refusal of a request
longer than its context read with the context it says it has. No network."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedresearch.report.llm import ContextExceeded, LlmConfig, WriterFailure, complete, stream_paragraphs
from fedresearch.report.tokens import Budget, cut_to_tokens, message_tokens, text_tokens
from tests.fakes.openai_chat import Answer, ContextError, FakeOpenAI, prompt_tokens, server_tokens


async def test_a_request_that_does_not_fit_is_never_sent() -> None:
    fake = await FakeOpenAI().start()
    try:
        config = LlmConfig(fake.url, "sk-test", "small-model", timeout_s=5.0, max_retries=0, context_tokens=2048)
        messages: Any = [{"role": "user", "content": "word " * 2000}]
        with pytest.raises(WriterFailure, match="LLM_CONTEXT_TOKENS"):
            await complete(config, messages)
        with pytest.raises(WriterFailure, match="LLM_CONTEXT_TOKENS"):
            async for _ in stream_paragraphs(config, messages):
                pass
    finally:
        await fake.stop()
    assert fake.requests == []


@pytest.mark.parametrize("style", ["openai", "vllm", "llamacpp"])
async def test_each_servers_refusal_reads_as_context_exceeded_with_its_context(style: ContextError) -> None:
    fake = await FakeOpenAI(context_tokens=2048, context_error=style).start()
    fake.script = [lambda body: Answer(pieces=["never sent"])]
    try:
        config = LlmConfig(fake.url, "sk-test", "small-model", timeout_s=5.0, max_retries=0, context_tokens=8192)
        messages: Any = [{"role": "user", "content": "word " * 2500}]  # within 8k as the writer counts, over 2k
        with pytest.raises(ContextExceeded) as refused:
            await complete(config, messages)
    finally:
        await fake.stop()
    assert refused.value.limit == 2048 and fake.refused == [0]
    assert fake.prompts[0] > 2048  # the fake refused what its own count put over its context


PIECES = st.sampled_from(
    [
        *"abcXYZ019.,;:!?()[]-'\"",
        " ",
        "\n",
        "\t",
        "  ",
        "排",
        "序",
        "。",
        "，",
        "é",
        "ß",
        "α",
        "я",
        "the ",
        "retrieval",
        "[12]",
    ]
)


@given(st.lists(PIECES, max_size=200).map("".join))
def test_the_writers_count_is_never_below_the_servers(text: str) -> None:
    assert text_tokens(text) >= server_tokens(text)


@given(st.lists(st.lists(PIECES, max_size=60).map("".join), min_size=1, max_size=4))
def test_a_request_counts_at_least_what_the_server_counts(contents: list[str]) -> None:
    messages = [{"role": "user", "content": content} for content in contents]
    assert message_tokens(messages) >= prompt_tokens({"messages": messages})


def test_a_cjk_character_counts_a_token_and_english_prose_about_a_third_of_its_letters() -> None:
    assert text_tokens("倒数排名融合") == 6
    prose = "Reciprocal rank fusion combines the rankings of several retrieval systems."
    assert server_tokens(prose) <= text_tokens(prose) <= len(prose) // 2


def test_the_budget_holds_prompt_and_answer_within_the_context() -> None:
    for context in (2048, 4096, 8192, 32768):
        budget = Budget.of(context)
        assert budget.prompt + budget.answer < context and budget.prompt > context // 2
    assert Budget.of(8192).answer == 2048 and Budget.of(2048).answer == 512
    assert Budget.of(8192).within(4096) == Budget.of(4096) and Budget.of(4096).within(8192) == Budget.of(4096)


def test_a_text_cut_to_a_count_fits_it_and_ends_in_an_ellipsis() -> None:
    text = "Reciprocal rank fusion combines the rankings of several retrieval systems. " * 20
    for tokens in (5, 40, 300):
        cut = cut_to_tokens(text, tokens)
        assert text_tokens(cut) <= tokens and cut.endswith("…") and text.startswith(cut[:-1])
    assert cut_to_tokens("short", 10) == "short"
