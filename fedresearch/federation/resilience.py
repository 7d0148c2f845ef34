"""What stands between the federation and an upstream: the answer cache (answer_cache.py), the
circuit breaker (breaker.py), and retries: transient failures (5xx, connection errors, timeouts)
are retried with jittered exponential backoff, and a 429 once after its Retry-After, but only while
the retriever's deadline leaves room.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from fedresearch.core.settings import Settings
from fedresearch.federation.answer_cache import AnswerCache, UpstreamCache
from fedresearch.federation.breaker import Breaker, CircuitBreaker, circuit_of, credential_of
from fedresearch.federation.contract import Hits, RetrieverFailed, SearchOptions

T = TypeVar("T")


class _Abandoned(Exception):
    """A retry given up because the task's other retrievers are all done."""


_BACKOFF_S = 0.1
# a generator of its own: the global one is the embedding application's (seeded for reproducible
# runs, or watched by hypothesis, as in the fuzz test, whose server thread retried mid-example)
_JITTER = random.Random()


@dataclass
class Guarded:
    hits: Hits
    cached: bool
    attempts: int


class Guard:
    """One per app: the breaker and cache shared by every task (in this process unless others are given)."""

    def __init__(self, settings: Settings, breaker: Breaker | None = None, cache: AnswerCache | None = None) -> None:
        self.settings = settings
        self.breaker = breaker or CircuitBreaker(settings)
        self.cache = cache or UpstreamCache(settings.upstream_cache_ttl_s)

    async def call(
        self,
        name: str,
        cacheable: bool,
        credentials: tuple[str, ...],
        options: SearchOptions,
        deadline_s: float,
        search: Callable[[], Awaitable[Hits]],
        on_suspended: Callable[[str], None] = lambda reason: None,
        others_done: asyncio.Event | None = None,
    ) -> Guarded:
        """`others_done` set: the task's other retrievers have all answered, so a retry would only
        make the task wait; one still pending is then abandoned and the failure reported."""
        credential = credential_of(credentials, options)
        circuit = circuit_of(name, credentials, options)
        await self.breaker.check(circuit, options.asker)
        cache_key = UpstreamCache.key(name, credential, options)
        if cacheable and (hit := await self.cache.get(cache_key)) is not None:
            return Guarded(hit, cached=True, attempts=0)
        hits, attempts = await self._attempts(
            search, circuit, options.asker, time.monotonic() + deadline_s, on_suspended, others_done
        )
        await self.breaker.succeeded(circuit, options.asker)
        if cacheable:
            await self.cache.put(cache_key, hits)
        return Guarded(hits, cached=False, attempts=attempts)

    async def overran(
        self,
        name: str,
        credentials: tuple[str, ...],
        options: SearchOptions,
        failure: RetrieverFailed,
        on_suspended: Callable[[str], None] = lambda reason: None,
    ) -> None:
        """A call that outlasted the upstream's deadline (cancelled, so `call` could not count it):
        a failure for the breaker like any other."""
        reason = await self.breaker.failed(circuit_of(name, credentials, options), failure, options.asker)
        if reason is not None:
            on_suspended(reason)

    async def _attempts(
        self,
        search: Callable[[], Awaitable[Hits]],
        circuit: tuple[str, str],
        asker: str,
        deadline: float,
        on_suspended: Callable[[str], None],
        others_done: asyncio.Event | None,
    ) -> tuple[Hits, int]:
        """The first answer of up to RETRY_ATTEMPTS + 1 tries, and how many it took."""
        failure: RetrieverFailed | None = None
        for attempt in itertools.count(1):
            try:
                hits = await (search() if failure is None else _unless(others_done, search))
            except _Abandoned:
                assert failure is not None
                raise failure from None
            except RetrieverFailed as error:
                failure = error
                await self._pause_or_raise(failure, attempt, circuit, asker, deadline, on_suspended, others_done)
                continue
            return hits, attempt
        raise AssertionError("unreachable")

    async def _pause_or_raise(
        self,
        failure: RetrieverFailed,
        attempt: int,
        circuit: tuple[str, str],
        asker: str,
        deadline: float,
        on_suspended: Callable[[str], None],
        others_done: asyncio.Event | None,
    ) -> None:
        """Wait before the next try, or give up: record the failure with the breaker and raise it."""
        wait = self._wait_before_retry(failure, attempt, deadline - time.monotonic())
        if wait is None or (others_done is not None and others_done.is_set()):
            if (reason := await self.breaker.failed(circuit, failure, asker)) is not None:
                on_suspended(reason)
            raise failure
        try:
            await _unless(others_done, lambda: asyncio.sleep(wait))
        except _Abandoned:
            await self.breaker.failed(circuit, failure, asker)
            raise failure from None

    def _wait_before_retry(self, failure: RetrieverFailed, attempt: int, remaining_s: float) -> float | None:
        if attempt > self.settings.retry_attempts:
            return None
        if failure.status == 429:
            wait = failure.retry_after
            if wait is None or attempt > 1:
                return None  # no Retry-After to honour, or already waited once: suspend instead
        elif failure.transient:
            wait = failure.retry_after or _BACKOFF_S * (2 ** (attempt - 1)) * (0.5 + _JITTER.random())
        else:
            return None
        # only when the wait and a second try still fit inside the retriever's deadline
        return wait if wait + 0.05 < remaining_s * 0.8 else None


async def _unless(others_done: asyncio.Event | None, work: Callable[[], Awaitable[T]]) -> T:
    """Run `work`, but give up (raise _Abandoned) as soon as `others_done` is set."""
    if others_done is None:
        return await work()
    job = asyncio.ensure_future(work())
    stop = asyncio.ensure_future(others_done.wait())
    try:
        await asyncio.wait({job, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if not job.done():
        job.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await job
        raise _Abandoned
    return job.result()
