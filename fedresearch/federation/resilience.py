"""What stands between the federation and an upstream: a TTL cache, a circuit breaker, and retries.

In the spirit of SearxNG's engine suspension: an upstream that rate-limits or refuses (429, 401,
403, 432, 433) is suspended for BREAKER_SUSPEND_S, and one that keeps failing for a short while;
while suspended it is skipped at once, with its reason, instead of waited for. Only the upstream's
own faults count: a 4xx caused by the request (a 400 on an over-long question) says nothing about
the upstream's health, so it never suspends it for others. State is per (upstream, credential,
client-supplied base URL), so one client's bad key or dead URL never suspends the upstream for others.
Transient failures (5xx, connection errors, timeouts) are retried with jittered exponential
backoff, and a 429 once after its Retry-After, but only while the retriever's deadline leaves room.

`Breaker` and `AnswerCache` are the interfaces; `CircuitBreaker` and `UpstreamCache` keep their state
in this process, shared_state.py's Redis ones share it across processes and hosts.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from fedresearch.core.settings import Settings
from fedresearch.core.timed_cache import TimedCache
from fedresearch.federation.contract import Hits, RetrieverFailed, RetrieverSkipped, SearchOptions

_REFUSED = {401, 403, 432, 433}
T = TypeVar("T")


class _Abandoned(Exception):
    """A retry given up because the task's other retrievers are all done."""


_BACKOFF_S = 0.1
# a generator of its own: the global one is the embedding application's (seeded for reproducible
# runs, or watched by hypothesis, as in the fuzz test, whose server thread retried mid-example)
_JITTER = random.Random()
_CACHE_ENTRIES = 2048
_CACHE_CHARS = 16_000_000  # of results' text, titles and links, 16-64 MB (core/timed_cache.py)
# circuits are per credential and per client-supplied base URL, so clients sending a new failing
# key or URL each time made one each, kept for good: at most this many, the oldest forgotten
_CIRCUITS = 4096


def _chars(hits: Hits) -> int:
    return sum(len(result.body) + len(result.title) + len(result.href) for result in hits.results)


def failure_reason(failure: RetrieverFailed | None, timed_out: bool = False) -> str:
    """A small, fixed vocabulary for metrics labels."""
    if timed_out:
        return "timeout"
    if failure is None:
        return "error"
    if failure.status == 429:
        return "rate_limited"
    if failure.status in _REFUSED:
        return "refused"
    if failure.status is not None and failure.status >= 500:
        return "server_error"
    if failure.transient:
        return "unreachable"
    return "bad_answer"


def credential_of(credentials: tuple[str, ...], options: SearchOptions) -> str:
    """Which credential a call spends: the per-request keys the client sent for it, else the operator's."""
    sent = [value for name in credentials if (value := options.credential(name))]
    return hashlib.sha256("\0".join(sent).encode()).hexdigest()[:16] if sent else "operator"


def circuit_of(name: str, credentials: tuple[str, ...], options: SearchOptions) -> tuple[str, str]:
    """The breaker state a call shares: per upstream and credential, and per base URL a client chose."""
    credential = credential_of(credentials, options)
    if options.internal_api_base_url is None:
        return (name, credential)
    return (name, credential + "@" + hashlib.sha256(options.internal_api_base_url.encode()).hexdigest()[:16])


def upstream_fault(failure: RetrieverFailed) -> bool:
    """Whether a failure is the upstream's (or its key's) rather than the request's own doing."""
    status = failure.status
    return status is None or status == 429 or status in _REFUSED or not 400 <= status < 500


class Breaker(Protocol):
    async def check(self, key: tuple[str, str]) -> None:
        """Raise RetrieverSkipped, with the reason, while the circuit `key` is open."""
        ...

    async def succeeded(self, key: tuple[str, str]) -> None: ...

    async def failed(self, key: tuple[str, str], failure: RetrieverFailed) -> str | None:
        """Record a failure; the suspension's reason (a failure_reason) when this one opens the circuit."""
        ...


class AnswerCache(Protocol):
    async def get(self, key: tuple[object, ...]) -> Hits | None: ...

    async def put(self, key: tuple[object, ...], hits: Hits) -> None: ...


def suspension(failure: RetrieverFailed, failures: int, settings: Settings) -> float:
    """How long `failure`, the circuit's `failures`-th in a row, suspends it (0: not at all)."""
    if failure.status == 429 or failure.status in _REFUSED:
        return settings.breaker_suspend_s
    if failures >= settings.breaker_error_threshold:
        return settings.breaker_error_suspend_s
    return 0.0


def suspended_message(remaining_s: float, reason: str) -> str:
    return f"suspended for another {remaining_s:.0f} s after: {reason}"


@dataclass
class _Circuit:
    failures: int = 0
    open_until: float = 0.0
    reason: str = ""


class CircuitBreaker:
    def __init__(self, settings: Settings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.clock = clock
        self._circuits: dict[tuple[str, str], _Circuit] = {}

    async def check(self, key: tuple[str, str]) -> None:
        circuit = self._circuits.get(key)
        if circuit is not None and circuit.open_until > self.clock():
            raise RetrieverSkipped(suspended_message(circuit.open_until - self.clock(), circuit.reason))

    async def succeeded(self, key: tuple[str, str]) -> None:
        self._circuits.pop(key, None)

    async def failed(self, key: tuple[str, str], failure: RetrieverFailed) -> str | None:
        if not upstream_fault(failure):
            return None
        circuit = self._circuits.setdefault(key, _Circuit())
        if len(self._circuits) > _CIRCUITS:  # the oldest forgotten: its upstream is tried again
            del self._circuits[next(iter(self._circuits))]
        circuit.failures += 1
        seconds = suspension(failure, circuit.failures, self.settings)
        if seconds <= 0:
            return None
        circuit.open_until = self.clock() + seconds
        circuit.reason = f"{failure} (suspended {seconds:g} s)"
        return failure_reason(failure)


class UpstreamCache:
    """Answers of quota-spending upstreams, kept for UPSTREAM_CACHE_TTL_S."""

    def __init__(
        self, ttl_s: float, clock: Callable[[], float] = time.monotonic, max_chars: int = _CACHE_CHARS
    ) -> None:
        self._answers: TimedCache[tuple[object, ...], Hits] = TimedCache(
            ttl_s, _CACHE_ENTRIES, max_chars, _chars, clock
        )

    @staticmethod
    def key(name: str, credential: str, options: SearchOptions) -> tuple[object, ...]:
        return (
            name,
            credential,
            " ".join(options.query.split()).casefold(),
            options.max_results,
            options.query_domains,
            options.user_id,
            options.internal_api_type,
            options.internal_api_base_url,
        )

    @property
    def chars(self) -> int:
        """The characters of results held."""
        return self._answers.held

    async def get(self, key: tuple[object, ...]) -> Hits | None:
        return self._answers.get(key)

    async def put(self, key: tuple[object, ...], hits: Hits) -> None:
        self._answers.put(key, hits)


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
        await self.breaker.check(circuit)
        cache_key = UpstreamCache.key(name, credential, options)
        if cacheable and (hit := await self.cache.get(cache_key)) is not None:
            return Guarded(hit, cached=True, attempts=0)
        hits, attempts = await self._attempts(search, circuit, time.monotonic() + deadline_s, on_suspended, others_done)
        await self.breaker.succeeded(circuit)
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
        if (reason := await self.breaker.failed(circuit_of(name, credentials, options), failure)) is not None:
            on_suspended(reason)

    async def _attempts(
        self,
        search: Callable[[], Awaitable[Hits]],
        circuit: tuple[str, str],
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
                await self._pause_or_raise(failure, attempt, circuit, deadline, on_suspended, others_done)
                continue
            return hits, attempt
        raise AssertionError("unreachable")

    async def _pause_or_raise(
        self,
        failure: RetrieverFailed,
        attempt: int,
        circuit: tuple[str, str],
        deadline: float,
        on_suspended: Callable[[str], None],
        others_done: asyncio.Event | None,
    ) -> None:
        """Wait before the next try, or give up: record the failure with the breaker and raise it."""
        wait = self._wait_before_retry(failure, attempt, deadline - time.monotonic())
        if wait is None or (others_done is not None and others_done.is_set()):
            if (reason := await self.breaker.failed(circuit, failure)) is not None:
                on_suspended(reason)
            raise failure
        try:
            await _unless(others_done, lambda: asyncio.sleep(wait))
        except _Abandoned:
            await self.breaker.failed(circuit, failure)
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
