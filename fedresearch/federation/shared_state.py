"""The breaker, answer cache and rate limiter in Redis, so that every server process and host sees the same.

Each is the Redis twin of an in-process one (resilience.py, ratelimit.py) and falls back to that one
while Redis fails (core/redis.py says so in the log). Expiries run on Redis's clock, so hosts whose
clocks differ agree. A rate-limit slot is reserved atomically (a Lua script moves the upstream's
next start forward), so N processes together keep to the upstream's published rate; a task whose
deadline cancels its wait leaves its reserved slot unused, which errs on the side of the upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any

from fedresearch.core.models import SearchResult
from fedresearch.core.redis import NOW_MS, PREFIX, Leases, SharedDown, SharedRedis
from fedresearch.core.settings import Settings
from fedresearch.federation.contract import Hits, RetrieverFailed, RetrieverSkipped
from fedresearch.federation.ratelimit import LocalRateLimiter, Rate, announced_rate, pause_after_429
from fedresearch.federation.resilience import (
    CircuitBreaker,
    UpstreamCache,
    failure_reason,
    suspended_message,
    suspension,
    upstream_fault,
)

# a run of failures older than this no longer counts toward the error threshold
_FAILURES_KEPT_MS = 3_600_000
_POLL_S = (0.01, 0.2)  # first and longest wait between tries for a connection of a capped upstream
# a breaker found clean is taken as clean for this long without asking Redis again: under load that
# spares a round trip per upstream call; another worker's suspension is seen at most this much later
_CLEAN_FOR_S = 1.0

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


def _digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, default=str, ensure_ascii=False).encode()).hexdigest()[:32]


def _rate_key(upstream: str, what: str) -> str:
    """An upstream's meter or pause, in one slot (a hash tag): the reserving script reads both."""
    return f"{PREFIX}rate:{{{upstream}}}:{what}"


class RedisBreaker:
    def __init__(self, shared: SharedRedis, settings: Settings) -> None:
        self.shared = shared
        self.settings = settings
        self.local = CircuitBreaker(settings)
        # breakers last found or left clean, and when: a success then has nothing to reset
        self._clean_since: dict[tuple[str, str], float] = {}

    @staticmethod
    def _keys(key: tuple[str, str]) -> tuple[str, str]:
        base = f"{PREFIX}breaker:{{{_digest(*key)}}}"  # a hash tag: one slot, for the transaction on both
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


class RedisAnswerCache:
    """Answers of quota-spending upstreams for UPSTREAM_CACHE_TTL_S; Redis's eviction bounds the size
    (set `maxmemory` and `maxmemory-policy volatile-lru`: every entry has a TTL).

    The lookups asked in one turn of the event loop go to Redis in one pipeline, and so do the answers
    stored in one turn (a task's retrievers start together; under load, several tasks' land in the
    same turn): a command alone cost the worker about 90 µs of CPU, 20-40 in a pipeline, and a task
    looked up and stored each of its retrievers' answers."""

    def __init__(self, shared: SharedRedis, ttl_s: float) -> None:
        self.shared = shared
        self.ttl_ms = int(ttl_s * 1000)
        self.local = UpstreamCache(ttl_s)
        self._asked: dict[str, list[asyncio.Future[bytes | None]]] = {}  # by entry: who waits for it
        # stored here: read from here until Redis has them (a lookup there could come first)
        self._due: dict[str, tuple[tuple[object, ...], Hits]] = {}
        self._unsent: dict[str, tuple[tuple[object, ...], Hits]] = {}  # of those, not yet sent
        self._sending: set[asyncio.Task[None]] = set()

    @staticmethod
    def _name(key: tuple[object, ...]) -> str:
        return f"{PREFIX}answers:{_digest(*key)}"

    async def get(self, key: tuple[object, ...]) -> Hits | None:
        name = self._name(key)
        if (due := self._due.get(name)) is not None:
            return due[1]

        async def read() -> Hits | None:
            stored = await self._ask(name)
            return None if stored is None else _hits_of(stored)

        return await self.shared.run("reading the answer cache", read, lambda: self.local.get(key))

    def _ask(self, name: str) -> asyncio.Future[bytes | None]:
        if not self._asked:  # sent in the next turn, with the lookups asked in this one
            self._send(self._read_asked())
        answer: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        self._asked.setdefault(name, []).append(answer)
        return answer

    async def _read_asked(self) -> None:
        asked, self._asked = self._asked, {}
        names = list(asked)
        try:
            async with self.shared.client.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.get(name)
                stored = await pipe.execute()
        except BaseException as error:
            for answer in (answer for answers in asked.values() for answer in answers if not answer.done()):
                if isinstance(error, asyncio.CancelledError):
                    answer.cancel()
                else:
                    answer.set_exception(error)  # each asker falls back on its own (SharedRedis.run)
            raise
        for name, value in zip(names, stored, strict=True):
            for answer in asked[name]:
                if not answer.done():  # an asker's deadline may have cancelled its wait
                    answer.set_result(value)

    async def put(self, key: tuple[object, ...], hits: Hits) -> None:
        """Written behind: the answer goes back to the task at once, not after a round trip to Redis."""
        if self.ttl_ms <= 0:
            return
        if not self._unsent:
            self._send(self._write_unsent())
        name = self._name(key)
        self._due[name] = self._unsent[name] = (key, hits)

    async def _write_unsent(self) -> None:
        sending, self._unsent = self._unsent, {}

        async def write() -> None:
            async with self.shared.client.pipeline(transaction=False) as pipe:
                for name, (_, hits) in sending.items():
                    pipe.set(name, _stored(hits), px=self.ttl_ms)
                await pipe.execute()

        async def keep_here() -> None:
            for key, hits in sending.values():
                await self.local.put(key, hits)

        try:
            await self.shared.run("writing the answer cache", write, keep_here)
        finally:
            for name, entry in sending.items():
                if self._due.get(name) is entry:  # not stored again meanwhile
                    del self._due[name]

    def _send(self, work: Coroutine[Any, Any, None]) -> None:
        sending = asyncio.get_running_loop().create_task(work)
        self._sending.add(sending)
        sending.add_done_callback(_settled(self._sending))


def _settled(tasks: set[asyncio.Task[None]]) -> Callable[[asyncio.Task[None]], None]:
    """A done callback that forgets the task and retrieves what it raised (its askers were given it)."""

    def forget(task: asyncio.Task[None]) -> None:
        tasks.discard(task)
        if not task.cancelled():
            task.exception()

    return forget


def _stored(hits: Hits) -> str:
    results = [result.model_dump(mode="json") for result in hits.results]
    return json.dumps({"results": results, "warnings": hits.warnings}, ensure_ascii=False)


def _hits_of(stored: bytes | str) -> Hits:
    body = json.loads(stored)
    return Hits(results=[SearchResult.model_validate(r) for r in body["results"]], warnings=list(body["warnings"]))


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
