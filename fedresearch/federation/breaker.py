"""The circuit breaker: in the spirit of SearxNG's engine suspension, an upstream that rate-limits or
refuses (429, 401, 403, 432, 433) is suspended for BREAKER_SUSPEND_S, and one that keeps failing for
a short while; while suspended it is skipped at once, with its reason, instead of waited for. Only
the upstream's own faults count: a 4xx caused by the request (a 400 on an over-long question) says
nothing about the upstream's health, so it never suspends it for others. State is per (upstream,
credential, client-supplied base URL), so one client's bad key or dead URL never suspends the
upstream for others.

Errors (5xx, timeouts, dropped connections) are also counted per asker (an API key and the user it
acts for): a run of them suspends the upstream for that asker alone, and for everyone only once
BREAKER_ERROR_ASKERS different askers have failed in the run. Some questions make an upstream answer
500 every time; without this, three such questions from one user suspended it for every user.
A 429 or a refused key is the operator's key's state, whoever asked: it suspends for everyone.

`Breaker` is the interface; `CircuitBreaker` keeps its state in this process, `RedisBreaker` in Redis
for every process and host (falling back to its in-process twin while Redis fails; expiries run on
Redis's clock, so hosts whose clocks differ agree).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
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


def own_circuit(key: tuple[str, str], asker: str) -> tuple[str, str]:
    """The circuit of one asker's calls within `key`'s: errors suspend it before they suspend `key`'s."""
    return (key[0], f"{key[1]}#asker:{asker}")


def keys_state(failure: RetrieverFailed) -> bool:
    """Whether a failure is the state of the key itself (rate-limited, refused), whoever asked."""
    return failure.status == 429 or failure.status in _REFUSED


def upstream_fault(failure: RetrieverFailed) -> bool:
    """Whether a failure is the upstream's (or its key's) rather than the request's own doing."""
    status = failure.status
    return status is None or status == 429 or status in _REFUSED or not 400 <= status < 500


class Breaker(Protocol):
    async def check(self, key: tuple[str, str], asker: str = "") -> None:
        """Raise RetrieverSkipped, with the reason, while the circuit `key`, or `asker`'s within it, is open."""
        ...

    async def succeeded(self, key: tuple[str, str], asker: str = "") -> None: ...

    async def failed(self, key: tuple[str, str], failure: RetrieverFailed, asker: str = "") -> str | None:
        """Record `asker`'s failure; the suspension's reason (a failure_reason) when this one opens a circuit."""
        ...


def suspension(failure: RetrieverFailed, failures: int, settings: Settings, askers: int | None = None) -> float:
    """How long `failure`, the circuit's `failures`-th in a row, from `askers` different askers (None:
    an asker's own circuit), suspends it (0: not at all)."""
    if keys_state(failure):
        return settings.breaker_suspend_s
    if failures >= settings.breaker_error_threshold and (askers is None or askers >= settings.breaker_error_askers):
        return settings.breaker_error_suspend_s
    return 0.0


def suspended_message(remaining_s: float, reason: str) -> str:
    return f"suspended for another {remaining_s:.0f} s after: {reason}"


@dataclass
class _Circuit:
    failures: int = 0
    open_until: float = 0.0
    reason: str = ""
    askers: set[str] = field(default_factory=set)  # who failed in this run (up to BREAKER_ERROR_ASKERS)


class CircuitBreaker:
    def __init__(self, settings: Settings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.clock = clock
        self._circuits: dict[tuple[str, str], _Circuit] = {}

    async def check(self, key: tuple[str, str], asker: str = "") -> None:
        for circuit in (self._circuits.get(key), self._circuits.get(own_circuit(key, asker))):
            if circuit is not None and circuit.open_until > self.clock():
                raise RetrieverSkipped(suspended_message(circuit.open_until - self.clock(), circuit.reason))

    async def succeeded(self, key: tuple[str, str], asker: str = "") -> None:
        self._circuits.pop(key, None)
        self._circuits.pop(own_circuit(key, asker), None)

    async def failed(self, key: tuple[str, str], failure: RetrieverFailed, asker: str = "") -> str | None:
        if not upstream_fault(failure):
            return None
        opened = self._failed(key, failure, asker)
        if not keys_state(failure):
            opened = self._failed(own_circuit(key, asker), failure, None) or opened
        return opened

    def _failed(self, key: tuple[str, str], failure: RetrieverFailed, asker: str | None) -> str | None:
        """Count a failure on one circuit (`asker` None: an asker's own); its reason if it opens it."""
        circuit = self._circuits.setdefault(key, _Circuit())
        if len(self._circuits) > _CIRCUITS:  # the oldest forgotten: its upstream is tried again
            del self._circuits[next(iter(self._circuits))]
        circuit.failures += 1
        if asker is not None and len(circuit.askers) < self.settings.breaker_error_askers:
            circuit.askers.add(asker)
        seconds = suspension(failure, circuit.failures, self.settings, None if asker is None else len(circuit.askers))
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
    def _keys(key: tuple[str, str]) -> tuple[str, str, str]:
        base = f"{PREFIX}breaker:{{{digest(*key)}}}"  # a hash tag: one slot, for the transaction on all
        return base + ":failures", base + ":open", base + ":askers"

    async def check(self, key: tuple[str, str], asker: str = "") -> None:
        for circuit in (key, own_circuit(key, asker)):
            await self._check(circuit, asker)

    async def _check(self, key: tuple[str, str], asker: str) -> None:
        now = time.monotonic()
        if now - self._clean_since.get(key, now - _CLEAN_FOR_S) < _CLEAN_FOR_S:
            return
        counted, opened, _ = self._keys(key)

        async def read() -> list[Any]:
            async with self.shared.client.pipeline(transaction=False) as pipe:
                pipe.get(opened)
                pipe.pttl(opened)
                pipe.exists(counted)
                return list(await pipe.execute())

        reason, remaining_ms, failing = await self.shared.run(
            "checking a breaker", read, lambda: _local_check(self.local, key, asker)
        )
        # a success after a clean check has nothing to reset: it spares a round trip on nearly every call
        if reason is None and not failing:
            self._clean_since[key] = now
        else:
            self._clean_since.pop(key, None)
        if reason is not None and remaining_ms > 0:
            raise RetrieverSkipped(suspended_message(remaining_ms / 1000, reason.decode()))

    async def succeeded(self, key: tuple[str, str], asker: str = "") -> None:
        circuits = [circuit for circuit in (key, own_circuit(key, asker)) if circuit not in self._clean_since]
        if not circuits:
            return

        async def clear() -> None:
            await self.shared.client.delete(*(name for circuit in circuits for name in self._keys(circuit)))
            for circuit in circuits:
                self._clean_since[circuit] = time.monotonic()

        await self.shared.run("closing a breaker", clear, lambda: self.local.succeeded(key, asker))

    async def failed(self, key: tuple[str, str], failure: RetrieverFailed, asker: str = "") -> str | None:
        if not upstream_fault(failure):
            return None

        async def record() -> str | None:
            opened = await self._failed(key, failure, asker)
            if not keys_state(failure):
                opened = await self._failed(own_circuit(key, asker), failure, None) or opened
            return opened

        return await self.shared.run(
            "recording an upstream failure", record, lambda: self.local.failed(key, failure, asker)
        )

    async def _failed(self, key: tuple[str, str], failure: RetrieverFailed, asker: str | None) -> str | None:
        counted, opened, askers = self._keys(key)
        self._clean_since.pop(key, None)
        async with self.shared.client.pipeline(transaction=True) as pipe:
            pipe.incr(counted)
            pipe.pexpire(counted, _FAILURES_KEPT_MS)
            if asker is not None:
                pipe.sadd(askers, asker)
                pipe.pexpire(askers, _FAILURES_KEPT_MS)
                pipe.scard(askers)
            answers = await pipe.execute()
        seconds = suspension(failure, int(answers[0]), self.settings, None if asker is None else int(answers[-1]))
        if seconds <= 0:
            return None
        await self.shared.client.set(opened, f"{failure} (suspended {seconds:g} s)", px=max(1, int(seconds * 1000)))
        return failure_reason(failure)


async def _local_check(breaker: CircuitBreaker, key: tuple[str, str], asker: str) -> list[Any]:
    await breaker.check(key, asker)  # raises while open
    return [None, 0, 1]  # "failing": so that a success is passed on to the local breaker to reset
