"""The per-upstream rate limiter: shared by every task of the process, at each upstream's published
rate, counted where it matters (requests per second arriving at the fake), and its waiting counted
against the retriever's deadline."""

from __future__ import annotations

import asyncio
import itertools

import aiohttp

from fedresearch.federation.contract import SearchOptions
from fedresearch.federation.ratelimit import LocalRateLimiter, Rate, announced_rate
from fedresearch.federation.resilience import Guard
from fedresearch.federation.runner import DeadlineExceeded, Deps, search_one
from tests.conftest import make_settings, registry_of
from tests.fakes import scholarly_settings

OPTIONS = SearchOptions(query="dense passage retrieval", max_results=3)


async def run_tasks(adapter, settings, count, guard=None):
    """`count` concurrent tasks of one process: one shared Deps (session, limiter), as the app has."""
    async with aiohttp.ClientSession() as session:
        deps = Deps(session, settings, guard=guard)
        return await asyncio.gather(*(search_one(adapter, OPTIONS, deps) for _ in range(count)), return_exceptions=True)


def settings_for(tmp_path, upstreams, **overrides):
    return make_settings(tmp_path, **{**scholarly_settings(upstreams), "retry_attempts": 0, **overrides})


async def test_fifty_tasks_together_keep_to_the_upstreams_rate(tmp_path, upstreams):
    settings = settings_for(tmp_path, upstreams, brave_requests_per_s=20, retriever_timeout_s=30)
    outcomes = await run_tasks(registry_of(settings)["brave"], settings, 50)
    assert all(not isinstance(outcome, BaseException) for outcome in outcomes)
    fake = upstreams["brave"]
    arrivals = [entry["at"] for entry in fake.requests]
    # 50 requests at 20/s: spread over at least ~2.45 s, never more than 20 in a second (+2: a loaded box)
    assert len(arrivals) == 50 and max(arrivals) - min(arrivals) >= 2.2
    assert fake.per_second() <= 22

    fake.requests.clear()  # the same fifty without a limit to keep arrive at once: the limiter did it
    unlimited = settings_for(tmp_path, upstreams, brave_requests_per_s=100_000, retriever_timeout_s=30)
    await run_tasks(registry_of(unlimited)["brave"], unlimited, 50)
    assert fake.per_second() >= 40


async def test_pubmed_keyless_tasks_never_exceed_three_requests_a_second(tmp_path, upstreams):
    settings = settings_for(tmp_path, upstreams, retriever_timeout_s=30)
    outcomes = await run_tasks(registry_of(settings)["pubmed"], settings, 5)  # 10 requests: esearch + efetch each
    assert all(not isinstance(outcome, BaseException) for outcome in outcomes)
    assert len(upstreams["pubmed"].requests) == 10
    assert upstreams["pubmed"].per_second() <= 4  # 3 by design, +1 for arrival jitter on a loaded box


async def test_arxiv_gets_one_request_every_three_seconds_over_one_connection(tmp_path, upstreams):
    upstreams["arxiv"].behaviour.delay_s = 0.3
    settings = settings_for(tmp_path, upstreams, retriever_timeout_s=30)
    outcomes = await run_tasks(registry_of(settings)["arxiv"], settings, 3)
    assert all(not isinstance(outcome, BaseException) for outcome in outcomes)
    arrivals = sorted(entry["at"] for entry in upstreams["arxiv"].requests)
    assert [round(b - a, 1) >= 2.9 for a, b in itertools.pairwise(arrivals)] == [True, True]
    assert upstreams["arxiv"].most_in_flight == 1


async def test_waiting_for_the_rate_limit_counts_against_the_deadline_and_says_so(tmp_path, upstreams):
    settings = settings_for(tmp_path, upstreams, retriever_timeout_s=1.0)
    first, second = await run_tasks(registry_of(settings)["arxiv"], settings, 2)
    assert not isinstance(first, BaseException)
    assert isinstance(second, DeadlineExceeded)
    assert str(second) == (
        "no answer within 1 s (RETRIEVER_TIMEOUT_S) while waiting for the rate limit of arXiv "
        "(1 request per 3 s, 1 at a time)"
    )
    assert len(upstreams["arxiv"].requests) == 1


async def test_a_429_without_retry_after_pauses_the_upstream_then_is_retried(tmp_path, upstreams):
    upstreams["arxiv"].behaviour.mode, upstreams["arxiv"].behaviour.fail_times = "429", 1
    settings = settings_for(tmp_path, upstreams, retry_attempts=2, retriever_timeout_s=10)
    (guarded,) = await run_tasks(registry_of(settings)["arxiv"], settings, 1, guard=Guard(settings))
    assert not isinstance(guarded, BaseException)
    assert guarded.attempts == 2 and guarded.hits.results
    first, second = (entry["at"] for entry in upstreams["arxiv"].requests)
    assert second - first >= 2.9  # arXiv's backoff (3 s), not an immediate hammering retry


def test_a_429_pause_doubles_while_they_keep_coming_and_resets_on_success():
    now = [100.0]
    limiter = LocalRateLimiter(clock=lambda: now[0])
    rate = Rate(1, backoff_s=2)
    limiter._state("s2", rate)
    assert [limiter.observe("s2", 429, {}) for _ in range(3)] == [2, 4, 8]
    assert limiter.observe("s2", 429, {"Retry-After": "30"}) == 30
    assert limiter.observe("s2", 200, {}) is None and limiter.observe("s2", 429, {}) == 2
    assert limiter.observe("unknown", 429, {}) is None


def test_crossref_announced_limits_replace_the_declared_ones():
    declared = Rate(5, connections=1)
    headers = {"X-Rate-Limit-Limit": "50", "X-Rate-Limit-Interval": "1s", "X-Concurrency-Limit": "5"}
    assert announced_rate(declared, headers) == Rate(50, per_s=1, connections=5)
    assert announced_rate(declared, {"x-rate-limit-limit": "100", "x-rate-limit-interval": "2m"}) == Rate(
        100, per_s=120, connections=1
    )
    assert announced_rate(declared, {"x-rate-limit-limit": "junk"}) == declared
    limiter = LocalRateLimiter()
    limiter._state("crossref", declared)
    limiter.observe("crossref", 200, headers)
    assert limiter._upstreams["crossref"].current == Rate(50, per_s=1, connections=5)


async def test_crossref_polite_pool_answers_tune_the_limiter(tmp_path, upstreams):
    settings = settings_for(tmp_path, upstreams, crossref_mailto="ops@example.org")
    adapter = registry_of(settings)["crossref"]
    assert adapter.about.rate == Rate(10, connections=3)
    async with aiohttp.ClientSession() as session:
        deps = Deps(session, settings)
        await search_one(adapter, OPTIONS, deps)
        assert isinstance(deps.limiter, LocalRateLimiter)
        assert deps.limiter._upstreams["crossref"].current == Rate(10, per_s=1, connections=3)


def test_rates_read_as_their_documentation_says():
    assert str(Rate(1, per_s=3, connections=1)) == "1 request per 3 s, 1 at a time"
    assert str(Rate(10)) == "10 requests per s"


async def test_a_wait_cancelled_by_its_deadline_spends_no_slot():
    limiter = LocalRateLimiter()
    rate = Rate(1, per_s=1)

    async def take():
        async with limiter.slot("slow", rate):
            return asyncio.get_running_loop().time()

    first = await take()
    waiters = [asyncio.create_task(take()) for _ in range(5)]
    await asyncio.sleep(0.2)
    for waiter in waiters:
        waiter.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    # the five abandoned waits left no reservations: the next request goes at the next slot, not 5 s on
    assert await take() - first < 2.0
