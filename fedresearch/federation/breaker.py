"""The circuit breaker: in the spirit of SearxNG's engine suspension, an upstream that rate-limits or
refuses (429, 401, 403, 432, 433) is suspended for BREAKER_SUSPEND_S, and one that keeps failing for
a short while; while suspended it is skipped at once, with its reason, instead of waited for. Only
the upstream's own faults count: a 4xx caused by the request (a 400 on an over-long question) says
nothing about the upstream's health, so it never suspends it for others. State is per (upstream,
credential, client-supplied base URL), so one client's bad key or dead URL never suspends the
upstream for others.

`Breaker` is the interface; `CircuitBreaker` keeps its state in this process, `RedisBreaker` in Redis
for every process and host (falling back to its in-process twin while Redis fails; expiries run on
Redis's clock, so hosts whose clocks differ agree).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from fedresearch.core.redis import PREFIX, SharedRedis, digest
from fedresearch.core.settings import Settings
from fedresearch.federation.contract import RetrieverFailed, RetrieverSkipped, SearchOptions

_REFUSED = {401, 403, 432, 433}
# circuits are per credential and per client-supplied base URL, so clients sending a new failing
# key or URL each time made one each, kept for good: at most this many, the oldest forgotten
_CIRCUITS = 4096


# a run of failures older than this no longer counts toward the error threshold
_FAILURES_KEPT_MS = 3_600_000
# a breaker found clean is taken as clean for this long without asking Redis again: under load that
# spares a round trip per upstream call; another worker's suspension is seen at most this much later
_CLEAN_FOR_S = 1.0


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


class RedisBreaker:
    def __init__(self, shared: SharedRedis, settings: Settings) -> None:
        self.shared = shared
        self.settings = settings
        self.local = CircuitBreaker(settings)
        # breakers last found or left clean, and when: a success then has nothing to reset
        self._clean_since: dict[tuple[str, str], float] = {}

    @staticmethod
    def _keys(key: tuple[str, str]) -> tuple[str, str]:
        base = f"{PREFIX}breaker:{{{digest(*key)}}}"  # a hash tag: one slot, for the transaction on both
        return base + ":failures", base + ":open"

    async def check(self, key: tuple[str, str]) -> None:
        now = time.monotonic()
        if now - self._clean_since.get(key, now - _CLEAN_FOR_S) < _CLEAN_FOR_S:
            return
        counted, opened = self._keys(key)

        async def read() -> list[Any]:
            async with self.shared.client.pipeline(transaction=False) as pipe:
                pipe.get(opened)
                pipe.pttl(opened)
                pipe.exists(counted)
                return list(await pipe.execute())

        reason, remaining_ms, failing = await self.shared.run(
            "checking a breaker", read, lambda: _local_check(self.local, key)
        )
        # a success after a clean check has nothing to reset: it spares a round trip on nearly every call
        if reason is None and not failing:
            self._clean_since[key] = now
        else:
            self._clean_since.pop(key, None)
        if reason is not None and remaining_ms > 0:
            raise RetrieverSkipped(suspended_message(remaining_ms / 1000, reason.decode()))

    async def succeeded(self, key: tuple[str, str]) -> None:
        if key in self._clean_since:
            return

        async def clear() -> None:
            await self.shared.client.delete(*self._keys(key))
            self._clean_since[key] = time.monotonic()

        await self.shared.run("closing a breaker", clear, lambda: self.local.succeeded(key))

    async def failed(self, key: tuple[str, str], failure: RetrieverFailed) -> str | None:
        if not upstream_fault(failure):
            return None
        return await self.shared.run(
            "recording an upstream failure", lambda: self._failed(key, failure), lambda: self.local.failed(key, failure)
        )

    async def _failed(self, key: tuple[str, str], failure: RetrieverFailed) -> str | None:
        counted, opened = self._keys(key)
        self._clean_since.pop(key, None)
        async with self.shared.client.pipeline(transaction=True) as pipe:
            pipe.incr(counted)
            pipe.pexpire(counted, _FAILURES_KEPT_MS)
            failures, _ = await pipe.execute()
        seconds = suspension(failure, int(failures), self.settings)
        if seconds <= 0:
            return None
        await self.shared.client.set(opened, f"{failure} (suspended {seconds:g} s)", px=max(1, int(seconds * 1000)))
        return failure_reason(failure)


async def _local_check(breaker: CircuitBreaker, key: tuple[str, str]) -> list[Any]:
    await breaker.check(key)  # raises while open
    return [None, 0, 1]  # "failing": so that a success is passed on to the local breaker to reset
