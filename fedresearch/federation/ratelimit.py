"""Per-upstream rate limits, shared by every task of the process.

Each adapter declares its upstream's published limit in `About.rate`; the runner takes a slot from
the limiter before every request to that upstream, so fifty concurrent tasks together never send
arXiv more than one request per three seconds. Requests are spaced (a token bucket of depth one:
no bursts), so a window of `per_s` seconds never holds more than `requests` starts, which is what
upstreams that ban addresses count. An upstream that announces its own limit in answer headers
(Crossref's `x-rate-limit-limit`, `x-rate-limit-interval`, `x-concurrency-limit`) is held to the
announced one, and a 429 pauses the upstream for every task (its Retry-After, or a backoff that
doubles while 429s keep coming).

`RateLimiter` is the interface; `LocalRateLimiter` keeps its state in this process,
`RedisRateLimiter` in Redis for every process and host: a slot is reserved atomically (a Lua script
moves the upstream's next start forward), so N processes together keep to the upstream's published
rate; a task whose deadline cancels its wait leaves its reserved slot unused, which errs on the side
of the upstream. While Redis fails it falls back to its in-process twin.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from fedresearch.core.redis import NOW_MS, PREFIX, Leases, SharedDown, SharedRedis

_MAX_BACKOFF_S = 60.0
# spacing a little wider than the published rate: the network's jitter may bunch arrivals, and an
# upstream counts arrivals (measured: at exactly 1/rate, 21 of 50 requests reached a 20/s fake within one second)
_HEADROOM = 1.05
_POLL_S = (0.01, 0.2)  # first and longest wait between tries for a connection of a capped upstream

_RESERVE = (
    NOW_MS
    + """
local start = math.max(tonumber(redis.call('GET', KEYS[1]) or '0'), now)
local paused = redis.call('PTTL', KEYS[2])
if paused > 0 then start = math.max(start, now + paused) end
local interval = tonumber(ARGV[1])
redis.call('SET', KEYS[1], start + interval, 'PX', start - now + interval + 1000)
return start - now
"""
)

_PAUSE = """
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], '1', 'PX', ARGV[1]) end
return 0
"""


@dataclass(frozen=True)
class Rate:
    """An upstream's published limit: at most `requests` per `per_s` seconds, `connections` at once
    (None: no cap); `backoff_s` is the first pause after a 429 that names no Retry-After."""

    requests: float
    per_s: float = 1.0
    connections: int | None = None
    backoff_s: float = 1.0

    @property
    def interval_s(self) -> float:
        return self.per_s / self.requests * _HEADROOM

    def __str__(self) -> str:
        unit = "request" if self.requests == 1 else "requests"
        per = "s" if self.per_s == 1 else f"{self.per_s:g} s"
        text = f"{self.requests:g} {unit} per {per}"
        return text + (f", {self.connections} at a time" if self.connections else "")


class RateLimiter(Protocol):
    def slot(self, upstream: str, rate: Rate) -> AbstractAsyncContextManager[None]:
        """Wait for the upstream's next free slot (and connection); held while the request runs."""
        ...

    def observe(self, upstream: str, status: int, headers: Mapping[str, str]) -> float | None:
        """Learn from an answer: an announced limit, or a 429. Returns how long the upstream is now
        paused for every task (Retry-After, or the backoff), None when it is not paused."""
        ...


def announced_rate(rate: Rate, headers: Mapping[str, str]) -> Rate:
    """`rate` as the answer's `x-rate-limit-limit` / `x-rate-limit-interval` / `x-concurrency-limit`
    headers restate it (Crossref's convention, e.g. 50, "1s", 5); unchanged when they are absent."""
    lowered = {name.lower(): value for name, value in headers.items()}
    requests = _number(lowered.get("x-rate-limit-limit"))
    interval = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m)?\s*", lowered.get("x-rate-limit-interval", ""))
    connections = _number(lowered.get("x-concurrency-limit"))
    if requests and requests > 0:
        rate = replace(rate, requests=requests)
        if interval:
            scale = {"ms": 0.001, "m": 60.0}.get(interval.group(2) or "s", 1.0)
            rate = replace(rate, per_s=float(interval.group(1)) * scale or rate.per_s)
    if connections and connections >= 1:
        rate = replace(rate, connections=int(connections))
    return rate


def pause_after_429(rate: Rate, strikes: int, headers: Mapping[str, str]) -> float:
    """How long the `strikes`-th 429 in a row pauses the upstream: its Retry-After, or a doubling backoff."""
    retry_after = _number(next((v for k, v in headers.items() if k.lower() == "retry-after"), None))
    if retry_after is not None and retry_after >= 0:
        return retry_after
    return min(_MAX_BACKOFF_S, rate.backoff_s * 2.0 ** (strikes - 1))


def _number(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


@dataclass
class _Upstream:
    rate: Rate
    next_start: float = 0.0
    paused_until: float = 0.0
    strikes: int = 0
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)
    gate: asyncio.Semaphore | None = None
    gate_size: int = 0
    announced: Rate | None = None

    @property
    def current(self) -> Rate:
        return self.announced or self.rate


class LocalRateLimiter:
    """One per app: every task's requests to an upstream share its meter, connection cap and pause."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._upstreams: dict[str, _Upstream] = {}

    def _state(self, upstream: str, rate: Rate) -> _Upstream:
        state = self._upstreams.get(upstream)
        if state is None or state.rate != rate:  # a changed declaration (e.g. a key was set) starts afresh
            state = self._upstreams[upstream] = _Upstream(rate)
        return state

    @contextlib.asynccontextmanager
    async def slot(self, upstream: str, rate: Rate) -> AsyncIterator[None]:
        state = self._state(upstream, rate)
        current = state.current
        if current.connections and current.connections != state.gate_size:
            # requests already holding the old gate finish on it; new ones queue on the new size
            state.gate, state.gate_size = asyncio.Semaphore(current.connections), current.connections
        gate = state.gate if current.connections else None
        async with gate if gate is not None else contextlib.nullcontext():
            async with state.turn:
                # one waiter at a time (FIFO), and a slot is spent only when its request starts: a task
                # whose deadline cancels its wait leaves no gap; a 429 meanwhile extends the wait
                target = max(state.next_start, state.paused_until, self.clock())
                while target > self.clock():
                    await asyncio.sleep(target - self.clock())
                    target = max(target, state.paused_until)
                # from the scheduled start, not the wake-up: a late wake-up must not slow the meter
                state.next_start = target + current.interval_s
            yield

    def observe(self, upstream: str, status: int, headers: Mapping[str, str]) -> float | None:
        state = self._upstreams.get(upstream)
        if state is None:
            return None
        announced = announced_rate(state.rate, headers)
        if announced != state.rate:
            state.announced = announced
        if status != 429:
            state.strikes = 0
            return None
        state.strikes += 1
        pause = pause_after_429(state.current, state.strikes, headers)
        state.paused_until = max(state.paused_until, self.clock() + pause)
        return pause


def _rate_key(upstream: str, what: str) -> str:
    """An upstream's meter or pause, in one slot (a hash tag): the reserving script reads both."""
    return f"{PREFIX}rate:{{{upstream}}}:{what}"


class RedisRateLimiter:
    """The RateLimiter whose meter, connection cap and 429 pauses every process shares."""

    def __init__(self, shared: SharedRedis, leases: Leases) -> None:
        self.shared = shared
        self.leases = leases
        self.local = LocalRateLimiter()
        self._reserve: Any = shared.client.register_script(_RESERVE)
        self._pause: Any = shared.client.register_script(_PAUSE)
        self._learned: dict[str, tuple[Rate, Rate | None, int]] = {}  # declared, announced, 429s in a row
        self._pushing: set[asyncio.Task[Any]] = set()

    def _current(self, upstream: str, rate: Rate) -> Rate:
        declared, announced, _ = self._learned.get(upstream, (None, None, 0))
        if declared != rate:  # a changed declaration (e.g. a key was set) starts afresh
            self._learned[upstream] = (rate, None, 0)
            return rate
        return announced or rate

    @contextlib.asynccontextmanager
    async def slot(self, upstream: str, rate: Rate) -> AsyncIterator[None]:
        current = self._current(upstream, rate)
        try:
            lease = await self.shared.attempt(f"pacing {upstream}", lambda: self._turn(upstream, current))
        except SharedDown:
            async with self.local.slot(upstream, rate):
                yield
            return
        try:
            yield
        finally:
            if lease is not None:
                self.leases.release(lease[0], lease[1])

    async def _turn(self, upstream: str, rate: Rate) -> tuple[str, str] | None:
        """Wait for a connection (if capped) and the upstream's next start; the connection's lease."""
        lease = await self._connection(upstream, rate.connections) if rate.connections else None
        try:
            meter, paused = _rate_key(upstream, "next"), _rate_key(upstream, "paused")
            wait_ms = int(await self._reserve(keys=[meter, paused], args=[max(1, int(rate.interval_s * 1000))]))
            if wait_ms > 0:  # the script saw no pause now; one may come while we wait
                await asyncio.sleep(wait_ms / 1000)
                while (late_ms := await self.shared.client.pttl(paused)) > 0:
                    await asyncio.sleep(late_ms / 1000)
        except BaseException:
            if lease is not None:
                self.leases.release(*lease)
            raise
        return lease

    async def _connection(self, upstream: str, cap: int) -> tuple[str, str]:
        name, poll = f"rate:{upstream}:connections", _POLL_S[0]
        while (token := (await self.leases.take(name, cap))[0]) is None:
            await asyncio.sleep(poll)
            poll = min(_POLL_S[1], poll * 2)
        return name, token

    def observe(self, upstream: str, status: int, headers: Mapping[str, str]) -> float | None:
        self.local.observe(upstream, status, headers)  # the fallback stays current
        declared, announced, strikes = self._learned.get(upstream, (None, None, 0))
        if declared is None:
            return None
        learned = announced_rate(declared, headers)
        announced = learned if learned != declared else announced
        strikes = strikes + 1 if status == 429 else 0
        self._learned[upstream] = (declared, announced, strikes)
        if status != 429:
            return None
        pause = pause_after_429(announced or declared, strikes, headers)
        task = asyncio.get_running_loop().create_task(self._share_pause(upstream, pause))
        self._pushing.add(task)
        task.add_done_callback(self._pushing.discard)
        return pause

    async def _share_pause(self, upstream: str, pause_s: float) -> None:
        async def push() -> None:
            await self._pause(keys=[_rate_key(upstream, "paused")], args=[max(1, int(pause_s * 1000))])

        with contextlib.suppress(SharedDown):
            await self.shared.attempt(f"pausing {upstream} after a 429", push)
