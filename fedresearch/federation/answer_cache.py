"""The answer cache: answers of quota-spending upstreams, kept for UPSTREAM_CACHE_TTL_S, so a
question asked again (a chat's follow-up, a retried task) spends no quota.

`AnswerCache` is the interface; `UpstreamCache` keeps the answers in this process, `RedisAnswerCache`
in Redis for every process and host (falling back to its in-process twin while Redis fails).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from fedresearch.core.models import SearchResult
from fedresearch.core.redis import PREFIX, SharedRedis, digest
from fedresearch.core.timed_cache import TimedCache
from fedresearch.federation.contract import Hits, SearchOptions

_CACHE_ENTRIES = 2048
_CACHE_CHARS = 16_000_000  # of results' text, titles and links, 16-64 MB (core/timed_cache.py)


def _chars(hits: Hits) -> int:
    return sum(len(result.body) + len(result.title) + len(result.href) for result in hits.results)


class AnswerCache(Protocol):
    async def get(self, key: tuple[object, ...]) -> Hits | None: ...

    async def put(self, key: tuple[object, ...], hits: Hits) -> None: ...


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
        return f"{PREFIX}answers:{digest(*key)}"

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
