"""Fault injection: every upstream fault leaves a finished task, the other retrievers' results in the
report, the reason at the client, and the breaker, retries and cache behaving as specified."""

from __future__ import annotations

import aiohttp
import pytest
import websockets

from fedresearch.core.models import SearchResult
from fedresearch.federation.answer_cache import UpstreamCache
from fedresearch.federation.breaker import CircuitBreaker
from fedresearch.federation.contract import Hits, RetrieverFailed, RetrieverSkipped
from tests.conftest import logs, make_settings, report_of, run_task

LIMITS = {"retriever_timeout_s": 1.5, "upstream_max_bytes": 200_000, "retry_attempts": 2}


async def ask(server, question="rank fusion", retrievers="tavily,google"):
    async with websockets.connect(server.ws_url) as ws:
        return await run_task(ws, {"task": question, "headers": {"retrievers": retrievers}})


def outcome(frames, name):
    for step in ("retriever_done", "retriever_failed", "retriever_skipped"):
        for frame in logs(frames, step):
            if frame["metadata"]["name"] == name:
                return step, frame["metadata"]
    raise AssertionError(f"no outcome for {name}")


@pytest.mark.parametrize(
    ("mode", "retry_after", "reason", "requests", "suspended"),
    [
        ("500", None, "HTTP 500", 3, False),  # transient: tried 1 + RETRY_ATTEMPTS times
        ("reset", None, "unreachable", 3, False),
        ("429", "0.2", "usage limit exceeded (429)", 2, True),  # waits out Retry-After once, then suspends
        ("432", None, "403/432/433", 1, True),  # refused: no retry, suspended
        ("401", None, "rejected the API key (401)", 1, True),
        ("malformed", None, "malformed JSON", 1, False),  # a bad answer is not retried
        ("oversized", None, "UPSTREAM_MAX_BYTES", 1, False),
        ("drip", None, "no answer within 1.5 s", 1, False),
    ],
)
async def test_tavily_faults(tmp_path, fakes, start_server, mode, retry_after, reason, requests, suspended):
    fakes["google"].behaviour.delay_s = 1.0  # leaves room for retries: they never outlast the other retrievers
    fakes["tavily"].behaviour.mode = mode
    fakes["tavily"].behaviour.retry_after = retry_after
    server = await start_server(make_settings(tmp_path, fakes, **LIMITS))
    frames = await ask(server)
    assert frames[-1]["type"] == "path"
    step, metadata = outcome(frames, "tavily")
    assert step == "retriever_failed" and reason in metadata["error"]
    assert "example.com/google/1" in report_of(frames) and "tavily: failed" in report_of(frames)
    assert len(fakes["tavily"].requests) == requests

    again = await ask(server, "another question")
    step, metadata = outcome(again, "tavily")
    if suspended:
        assert step == "retriever_skipped" and "suspended for another" in metadata["error"]
        assert len(fakes["tavily"].requests) == requests  # skipped at once: nothing sent
    else:
        assert step == "retriever_failed"
    assert outcome(again, "google")[0] == "retriever_done"


async def test_google_faults_too(tmp_path, fakes, start_server):
    fakes["google"].behaviour.mode = "429"
    server = await start_server(make_settings(tmp_path, fakes, **LIMITS))
    frames = await ask(server)
    step, metadata = outcome(frames, "google")
    assert step == "retriever_failed" and "quota exceeded (429 RESOURCE_EXHAUSTED)" in metadata["error"]
    assert "AIza-test-key" not in str(frames)
    assert outcome(await ask(server, "next"), "google")[0] == "retriever_skipped"


async def test_transient_failure_recovers_by_retry(tmp_path, fakes, start_server):
    fakes["tavily"].behaviour.mode = "500"
    fakes["tavily"].behaviour.fail_times = 1
    fakes["google"].behaviour.mode = "429"
    fakes["google"].behaviour.retry_after = "0.2"
    fakes["google"].behaviour.fail_times = 1
    server = await start_server(make_settings(tmp_path, fakes, **LIMITS))
    for name in ("tavily", "google"):  # alone in its task, a retriever keeps its whole retry budget
        step, metadata = outcome(await ask(server, retrievers=name), name)
        assert step == "retriever_done" and metadata["attempts"] == 2 and metadata["count"] == 3


async def test_a_retry_never_makes_the_task_wait(tmp_path, fakes, start_server):
    fakes["tavily"].behaviour.mode = "500"
    fakes["tavily"].behaviour.delay_s = 0.1
    fakes["google"].behaviour.delay_s = 0.15
    server = await start_server(make_settings(tmp_path, fakes, **{**LIMITS, "retry_attempts": 5}))
    frames = await ask(server)
    step, metadata = outcome(frames, "tavily")
    assert step == "retriever_failed" and "HTTP 500" in metadata["error"]
    assert logs(frames, "merging")[0]["metadata"]["retrieval_ms"] < 400  # ~google's 150 ms, not 5 retries
    assert 1 <= len(fakes["tavily"].requests) <= 2


async def test_retry_after_longer_than_the_deadline_is_not_waited_for(tmp_path, fakes, start_server):
    fakes["tavily"].behaviour.mode = "429"
    fakes["tavily"].behaviour.retry_after = "30"
    server = await start_server(make_settings(tmp_path, fakes, **LIMITS))
    frames = await ask(server)
    step, metadata = outcome(frames, "tavily")
    assert step == "retriever_failed" and metadata["elapsed_ms"] < 1000 and len(fakes["tavily"].requests) == 1


async def test_repeated_errors_suspend_briefly(tmp_path, fakes, start_server):
    fakes["tavily"].behaviour.mode = "500"
    server = await start_server(
        make_settings(tmp_path, fakes, **{**LIMITS, "retry_attempts": 0}, breaker_error_threshold=2)
    )
    assert outcome(await ask(server, "a"), "tavily")[0] == "retriever_failed"
    assert outcome(await ask(server, "b"), "tavily")[0] == "retriever_failed"
    step, metadata = outcome(await ask(server, "c"), "tavily")
    assert step == "retriever_skipped" and "suspended 30 s" in metadata["error"]
    assert len(fakes["tavily"].requests) == 2


async def test_an_upstream_that_never_answers_is_suspended_too(tmp_path, fakes, start_server):
    fakes["tavily"].behaviour.mode = "drip"  # bytes too slow to ever finish within the deadline
    server = await start_server(
        make_settings(tmp_path, fakes, **{**LIMITS, "retry_attempts": 0}, breaker_error_threshold=2)
    )
    for question in ("a", "b"):
        step, metadata = outcome(await ask(server, question), "tavily")
        assert step == "retriever_failed" and "no answer within 1.5 s" in metadata["error"]
    step, metadata = outcome(await ask(server, "c"), "tavily")
    assert (
        step == "retriever_skipped"
        and "no answer within 1.5 s (RETRIEVER_TIMEOUT_S) (suspended 30 s)" in metadata["error"]
    )
    assert len(fakes["tavily"].requests) == 2


async def test_a_bad_per_request_key_does_not_suspend_the_upstream_for_others(tmp_path, fakes, start_server):
    server = await start_server(make_settings(tmp_path, fakes, **LIMITS))
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(ws, {"task": "q", "headers": {"retrievers": "tavily", "tavily_api_key": "bad"}})
    assert "401" in outcome(frames, "tavily")[1]["error"]
    assert outcome(await ask(server, "q"), "tavily")[0] == "retriever_done"


async def test_cache_spends_no_quota_on_a_repeated_question(tmp_path, fakes, start_server):
    server = await start_server(make_settings(tmp_path, fakes, **LIMITS))
    first = await ask(server, "What is rank fusion?")
    second = await ask(server, "what is  rank fusion?")
    assert outcome(second, "tavily")[1]["cached"] and outcome(second, "google")[1]["cached"]
    assert len(fakes["tavily"].requests) == 1 and len(fakes["google"].requests) == 1
    assert report_of(first).split("## References")[1] == report_of(second).split("## References")[1]
    await ask(server, "a different question")
    assert len(fakes["tavily"].requests) == 2


async def test_metrics_count_requests_failures_suspensions_and_cache_hits(tmp_path, fakes, start_server):
    fakes["google"].behaviour.mode = "403"
    server = await start_server(make_settings(tmp_path, fakes, **LIMITS))
    await ask(server, "q")
    await ask(server, "q")
    async with aiohttp.ClientSession() as session, session.get(f"{server.url}/metrics") as response:
        text = await response.text()
    assert response.status == 200
    assert 'fedresearch_retriever_requests_total{retriever="tavily"} 2.0' in text
    assert 'fedresearch_retriever_cache_hits_total{retriever="tavily"} 1.0' in text
    assert 'fedresearch_retriever_failures_total{reason="refused",retriever="google"} 1.0' in text
    assert 'fedresearch_retriever_suspensions_total{reason="refused",retriever="google"} 1.0' in text
    assert 'fedresearch_retriever_latency_seconds_count{retriever="tavily"} 2.0' in text
    assert "fedresearch_active_sockets 0.0" in text and "fedresearch_active_tasks 0.0" in text


async def test_the_answer_cache_is_bounded_in_characters_least_recently_used_first():
    """Counted in answers alone (2,048), the cache kept 50 results of 20,000 characters an answer
    if upstreams sent them: gigabytes. Now its results' text is bounded too (1,000 here)."""
    cache = UpstreamCache(ttl_s=600, max_chars=1_000)

    def answer(text: str) -> Hits:
        return Hits([SearchResult(href=f"https://e.org/{text}", body=text * 300, retriever="tavily", rank=1)])

    size = len("a" * 300) + len("https://e.org/a")  # 315 characters an answer
    for key in "abc":
        await cache.put((key,), answer(key))
    assert cache.chars == 3 * size
    assert await cache.get(("a",)) is not None  # read: now the most recently used
    await cache.put(("d",), answer("d"))  # over 1,000: b, the least recently used, goes
    assert cache.chars == 3 * size <= 1_000
    assert [await cache.get((key,)) is not None for key in "abcd"] == [True, False, True, True]
    await cache.put(("a",), answer("a"))  # stored again: counted once
    assert cache.chars == 3 * size
    await cache.put(("huge",), Hits([SearchResult(href="https://e.org/", body="x" * 5_000, retriever="t", rank=1)]))
    assert await cache.get(("huge",)) is None  # over the whole bound: not kept, and nothing pushed out
    assert cache.chars == 3 * size and [await cache.get((key,)) is not None for key in "acd"] == [True] * 3


async def test_the_breakers_circuits_are_bounded_the_oldest_forgotten(tmp_path):
    """A circuit is per credential and per client-supplied base URL: clients sending a new refused
    key each time made one each, kept for good. At most 4,096 now; the oldest is forgotten."""
    breaker = CircuitBreaker(make_settings(tmp_path))
    refused = RetrieverFailed("Tavily refused the key (HTTP 401)", status=401)
    for number in range(4_100):
        await breaker.failed(("tavily", f"key-{number}"), refused)
    assert len(breaker._circuits) == 4_096
    await breaker.check(("tavily", "key-0"))  # forgotten: its upstream is tried again
    with pytest.raises(RetrieverSkipped):
        await breaker.check(("tavily", "key-4099"))


async def test_a_retrys_jitter_leaves_the_global_random_generator_alone(tmp_path) -> None:
    """The process's `random` belongs to whoever embeds the server (seeded for a reproducible run,
    or watched by hypothesis, as in the fuzz test, whose server retries on its own thread)."""
    import random

    from fedresearch.federation.contract import SearchOptions
    from fedresearch.federation.resilience import Guard

    answers = [RetrieverFailed("upstream answered 503", status=503), Hits()]

    async def search() -> Hits:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    random.seed(7)
    before = random.getstate()
    options = SearchOptions(query="q", max_results=5)
    guarded = await Guard(make_settings(tmp_path)).call("tavily", False, (), options, 5.0, search)
    assert guarded.attempts == 2  # retried once, after a jittered pause
    assert random.getstate() == before
