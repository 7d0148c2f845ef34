"""State shared by several server processes (and hosts) through Redis, when FEDRESEARCH_REDIS_URL is set.

Every shared structure has an in-process twin. A Redis one falls back to its twin while Redis cannot
be reached and says so in the log, once per outage: each command has a 1 s timeout and is not
retried, and after a failure Redis is left alone for a few seconds, so no task ever waits on it.

A `redis+sentinel://` URL names Redis Sentinels and the master they watch: the client asks them
where the master is, and again after a failover (a demoted master answers READONLY).

With FEDRESEARCH_REDIS_CLUSTER the client is a cluster client, and every script and transaction
touches keys of one slot only (a hash tag, `{…}`, in their names): a cluster refuses a command
whose keys sit in two slots (CROSSSLOT).

`Leases` counts holders that cannot leak: each holder is a member of a sorted set scored by its
expiry, renewed by the process that holds it; a process killed with SIGKILL stops renewing, and its
leases lapse within `lease_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast
from urllib.parse import parse_qs, unquote, urlsplit

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster

log = logging.getLogger("fedresearch")

T = TypeVar("T")
PREFIX = "fedresearch:"
_TIMEOUT_S = 1.0
_REST_S = 5.0

# the server's clock, so that hosts whose clocks differ still agree on every expiry
NOW_MS = "local t = redis.call('TIME') local now = t[1] * 1000 + math.floor(t[2] / 1000)\n"

_TAKE = (
    NOW_MS
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZCARD', KEYS[1])
if held >= tonumber(ARGV[2]) then return {0, held} end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
return {1, held + 1}
"""
)

_RENEW = (
    NOW_MS
    + """
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[1]), ARGV[i]) end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]))
return 0
"""
)


def digest(*parts: object) -> str:
    """A short, stable name for `parts` (a key's suffix: never the text itself, which may hold a key)."""
    return hashlib.sha256(json.dumps(parts, default=str, ensure_ascii=False).encode()).hexdigest()[:32]


_SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
_SENTINEL_PORT = 26379


@dataclass(frozen=True)
class SentinelAddress:
    """`redis+sentinel://[[user]:password@]host[:port][,host[:port]…]/master[/db][?sentinel_password=…]`:
    the sentinels, the name of the master they watch, and how to reach that master (`rediss+`: TLS).
    The password is the master's; sentinels that require one of their own take `sentinel_password`."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None
    tls: bool = False

    @classmethod
    def parse(cls, url: str) -> SentinelAddress:
        scheme, _, rest = url.partition("://")
        rest, _, query = rest.partition("?")
        located, _, path = rest.partition("/")
        userinfo, _, hosts = located.rpartition("@")
        username, _, password = userinfo.partition(":") if userinfo else ("", "", "")
        sentinels = tuple(_host_port(host) for host in hosts.split(",") if host.strip())
        master, _, db = path.strip("/").partition("/")
        if not sentinels or not master or (db and not db.isdigit()):
            raise ValueError(
                "a Sentinel URL is redis+sentinel://[:password@]host:26379[,host:26379…]/master[/db] "
                "(the master's name as the sentinels know it)"
            )
        options = parse_qs(query)
        return cls(
            sentinels,
            unquote(master),
            int(db or 0),
            unquote(username) or None,
            unquote(password) or None,
            options["sentinel_password"][0] if "sentinel_password" in options else None,
            scheme == "rediss+sentinel",
        )


def _host_port(text: str) -> tuple[str, int]:
    host, colon, port = text.strip().rpartition(":")
    if not colon or (":" in host.strip("[]") and not host.endswith("]")):  # no port: a name, or IPv6 alone
        host, port = text.strip(), str(_SENTINEL_PORT)
    if not port.isdigit():
        raise ValueError(f"a sentinel's port must be a number: {text.strip()!r}")
    return host.strip("[]"), int(port)


def is_sentinel_url(url: str) -> bool:
    return url.partition("://")[0] in _SENTINEL_SCHEMES


def connect(url: str, cluster: bool = False) -> Redis:
    """A client for `url` that fails fast: 1 s timeouts, no retries (the callers fall back instead);
    with `cluster`, a cluster client that learns the other nodes from this one (typed as Redis: the
    commands used here are the same on both)."""
    try:
        from redis.asyncio import Redis
        from redis.asyncio.cluster import RedisCluster
        from redis.backoff import NoBackoff
        from redis.retry import Retry
    except ImportError:
        raise RuntimeError(
            "FEDRESEARCH_REDIS_URL is set but the redis package is not installed: pip install 'fedresearch[redis]'"
        ) from None
    fail_fast: dict[str, Any] = {
        "socket_timeout": _TIMEOUT_S,
        "socket_connect_timeout": _TIMEOUT_S,
        "retry": Retry(NoBackoff(), 0),
    }
    if cluster:
        return cast("Redis", RedisCluster.from_url(url, **fail_fast))
    if is_sentinel_url(url):
        return _through_sentinels(SentinelAddress.parse(url), fail_fast)
    return Redis.from_url(url, **fail_fast, retry_on_timeout=False, health_check_interval=30)


def _through_sentinels(address: SentinelAddress, fail_fast: dict[str, Any]) -> Redis:
    from redis.asyncio.sentinel import Sentinel

    sentinels = Sentinel(  # type: ignore[no-untyped-call]
        list(address.sentinels),
        sentinel_kwargs={**fail_fast, "password": address.sentinel_password},
        **fail_fast,
    )
    master: Redis = sentinels.master_for(
        address.master,
        db=address.db,
        username=address.username,
        password=address.password,
        ssl=address.tls,
        retry_on_timeout=False,
        health_check_interval=30,
    )
    return master


def failures() -> tuple[type[BaseException], ...]:
    """What a Redis command raises when Redis, or the network, fails: a cluster client's own errors
    (no node answers for a slot) are not RedisErrors."""
    from redis.exceptions import RedisClusterException, RedisError

    return RedisError, RedisClusterException, OSError, TimeoutError


def where(url: str) -> str:
    """`url` fit for a log: host, port and database, never the password."""
    if is_sentinel_url(url):
        address = SentinelAddress.parse(url)
        hosts = ",".join(f"{host}:{port}" for host, port in address.sentinels)
        return f"{url.partition('://')[0]}://{hosts}/{address.master}/{address.db}"
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    return f"{parts.scheme}://{parts.hostname or 'localhost'}:{parts.port or 6379}{parts.path or ''}"


_CANCEL_AGAIN_S = 0.1


async def cancelled(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel the background loops given (None: none running) and wait until they have stopped.

    A cancellation can be lost: on Python 3.11 `asyncio.wait_for`, which wraps each of redis-py's
    writes, returns the write's result when it finished as the cancellation came (CPython
    gh-86296), and a loop that renews a lease then renews it for ever and its closing waits for
    ever. A loop still running a moment later is cancelled again; so this is for loops with
    nothing to finish once cancelled, not for tasks that clean up."""
    given = [task for task in tasks if task is not None]
    running = set(given)
    while running:
        for task in running:
            task.cancel()
        _, running = await asyncio.wait(running, timeout=_CANCEL_AGAIN_S)
    await asyncio.gather(*given, return_exceptions=True)


def _stop_if_cancelled(task: asyncio.Task[Any] | None, asked: int) -> None:
    """Raise the cancellation `task` was asked for during a Redis command and did not get: lost by
    redis-py's `asyncio.wait_for` on Python 3.11 (see `cancelled`), it would leave a cancelled
    job running to its end (its upstreams paid for), or a timeout that never fires."""
    if task is not None and task.cancelling() > asked:
        raise asyncio.CancelledError


class SharedDown(Exception):
    """Redis failed just now, or recently; the caller uses this process's own state instead."""


class SharedRedis:
    """One Redis client and its health, for every shared structure of a process."""

    def __init__(self, client: Redis, url: str, clock: Callable[[], float] = time.monotonic) -> None:
        from redis.asyncio.cluster import RedisCluster

        self.client = client
        self.cluster = isinstance(client, RedisCluster)  # scripts and transactions keep to one slot
        # a cluster client learns the slots on its first command; when dozens of tasks sent theirs at
        # once, before it knew them, some went to the wrong node for good (redis-py 8.1: 2-8 of 50
        # commands a round failed, "Connection closed by server"), so it learns them first, alone
        self._learned = not self.cluster
        self._learning = asyncio.Lock()
        self.where = where(url)
        self.clock = clock
        self._down_until = 0.0
        self._down = False
        self._probing: asyncio.Task[None] | None = None

    async def attempt(self, what: str, operation: Callable[[], Awaitable[T]]) -> T:
        """`operation` on Redis; SharedDown (logged once per outage) when Redis fails or failed recently."""
        if self._down and self.clock() < self._down_until:
            raise SharedDown(f"Redis at {self.where} does not answer")
        task = asyncio.current_task()
        asked = task.cancelling() if task is not None else 0
        try:
            if not self._learned:
                await self._learn_slots()
            result = await operation()
        except failures() as error:
            _stop_if_cancelled(task, asked)  # the failure is the cancellation's (a write cut short)
            self._failed(what, error)
            raise SharedDown(f"Redis at {self.where} does not answer") from error
        _stop_if_cancelled(task, asked)
        if self._down:
            self._down = False
            log.warning("Redis at %s answers again: shared state is back in use", self.where)
        return result

    async def _learn_slots(self) -> None:
        async with self._learning:
            if not self._learned:
                await cast("RedisCluster", self.client).initialize()
                self._learned = True

    async def run(self, what: str, operation: Callable[[], Awaitable[T]], fallback: Callable[[], Awaitable[T]]) -> T:
        """`operation` on Redis, or `fallback` (this process's own state) while Redis is failing."""
        try:
            return await self.attempt(what, operation)
        except SharedDown:
            return await fallback()

    @property
    def trouble(self) -> str | None:
        """Why this process keeps its own state instead, while Redis fails (for `/healthz`, which
        anyone may read: where Redis is stays in the log)."""
        return "Redis does not answer: each process uses its own state" if self._down else None

    def _failed(self, what: str, error: BaseException) -> None:
        if not self._down:
            log.warning(
                "Redis at %s failed while %s (%s: %s%s): each process uses its own state until it answers again",
                self.where,
                what,
                type(error).__name__,
                error,
                self._hint(error),
            )
        self._down = True
        self._down_until = self.clock() + _REST_S
        self._probe_until_answered()

    def _probe_until_answered(self) -> None:
        """While Redis fails, a PING once a rest: a process with no command of its own to send (an
        idle worker) learns that Redis answers again, says so in the log and in `/healthz`, which
        said it failed for as long as nothing else asked (a minute and more, measured)."""
        if self._probing is not None and not self._probing.done():
            return
        self._probing = asyncio.get_running_loop().create_task(self._probe())

    async def _probe(self) -> None:
        while self._down:
            await asyncio.sleep(_REST_S)
            with contextlib.suppress(SharedDown):
                await self.attempt("checking that it answers", self.client.ping)

    def _hint(self, error: BaseException) -> str:
        """What to do when a single server's client is answered by a cluster (MOVED: the key's slot
        is on another node)."""
        from redis.exceptions import AskError, ClusterCrossSlotError, ClusterDownError

        if not self.cluster and isinstance(error, (AskError, ClusterCrossSlotError, ClusterDownError)):
            return "; this Redis is a cluster: set FEDRESEARCH_REDIS_CLUSTER=true"
        return ""

    async def close(self) -> None:
        await cancelled(self._probing)
        await self.client.aclose()
        pool = getattr(self.client, "connection_pool", None)  # a cluster client has one per node
        sentinels = getattr(pool, "sentinel_manager", None)
        if sentinels is not None:  # its own connections to the sentinels
            await sentinels.aclose()


class Leases:
    """Counted holders per name, each lasting `lease_s` unless renewed; renewed here while held."""

    def __init__(self, redis: Redis, lease_s: float = 10.0) -> None:
        self.redis = redis
        self.lease_ms = max(1, int(lease_s * 1000))
        self._take: Any = redis.register_script(_TAKE)
        self._renew: Any = redis.register_script(_RENEW)
        self._held: dict[str, set[str]] = {}
        self._renewing: asyncio.Task[None] | None = None
        self._releasing: set[asyncio.Task[None]] = set()
        self._given_back: list[tuple[str, str]] = []  # released, not yet removed in Redis

    async def take(self, name: str, cap: int) -> tuple[str | None, int]:
        """A lease on one of `cap` places under `name`: (its token, holders now), or (None, holders) when full."""
        token = uuid.uuid4().hex
        taken, held = await self._take(keys=[PREFIX + name], args=[token, cap, self.lease_ms])
        if not taken:
            return None, int(held)
        self._held.setdefault(name, set()).add(token)
        if self._renewing is None or self._renewing.done():
            self._renewing = asyncio.create_task(self._renew_while_held())
        return token, int(held)

    def release(self, name: str, token: str) -> None:
        """Give the lease back now (it is no longer renewed) and in Redis soon: safe in a done callback
        or a cancelled task; should Redis not answer, the lease lapses by itself."""
        tokens = self._held.get(name, set())
        tokens.discard(token)
        if not tokens:
            self._held.pop(name, None)
        # the leases given back in one turn of the event loop go to Redis in one pipeline, sent in
        # the next turn as one alone was: a command alone costs the worker several times its share
        # of a pipeline's CPU
        if not self._given_back:
            task = asyncio.get_running_loop().create_task(self._remove_given_back())
            self._releasing.add(task)
            task.add_done_callback(self._releasing.discard)
        self._given_back.append((name, token))

    async def _remove_given_back(self) -> None:
        given, self._given_back = self._given_back, []
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for name, token in given:
                    pipe.zrem(PREFIX + name, token)
                await pipe.execute()
        except failures() as error:
            names = ", ".join(sorted({name for name, _ in given}))
            log.warning("could not give back a lease on %s in Redis (it lapses by itself): %s", names, error)

    async def _renew_while_held(self) -> None:
        while self._held:
            await asyncio.sleep(self.lease_ms / 3000)
            for name, tokens in list(self._held.items()):
                try:
                    await self._renew(keys=[PREFIX + name], args=[self.lease_ms, *tokens])
                except failures() as error:
                    log.warning("could not renew leases on %s in Redis: %s", name, error)

    async def close(self) -> None:
        # waited for, not only cancelled: a renewal under way would reach a client closed after this
        await cancelled(self._renewing)
        self._renewing = None
        if self._releasing:
            await asyncio.wait(self._releasing, timeout=_TIMEOUT_S)
