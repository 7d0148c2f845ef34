"""Where the state every task shares lives, chosen once at app start: in this process, or in Redis
(FEDRESEARCH_REDIS_URL) so that every worker and host sees the same breakers, answer cache, rate
limits and per-key task counts."""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fedresearch.core.redis import Leases, SharedDown, SharedRedis, connect
from fedresearch.core.settings import Settings, secret
from fedresearch.federation.ratelimit import LocalRateLimiter, RateLimiter
from fedresearch.federation.resilience import Guard
from fedresearch.federation.shared_state import RedisAnswerCache, RedisBreaker, RedisRateLimiter
from fedresearch.jobs.slots import LocalTaskSlots, RedisTaskSlots, TaskSlots

log = logging.getLogger("fedresearch")


@dataclass(frozen=True)
class SharedState:
    guard: Guard
    limiter: RateLimiter
    task_slots: TaskSlots
    redis: SharedRedis | None = None


@contextlib.asynccontextmanager
async def open_state(settings: Settings, running: collections.Counter[str]) -> AsyncIterator[SharedState]:
    """The shared state for an app's lifetime; `running` is the app's own count of tasks per key."""
    url = secret(settings.redis_url)
    if url is None:
        yield SharedState(Guard(settings), LocalRateLimiter(), LocalTaskSlots(running))
        return
    shared = SharedRedis(connect(url, settings.redis_cluster), url)
    leases = Leases(shared.client)
    # unreachable now: attempt() says so in the log, and this process uses its own state until it answers
    with contextlib.suppress(SharedDown):
        await shared.attempt("connecting", shared.client.ping)
        log.info("shared state (breakers, answer cache, rate limits, task limits) in Redis at %s", shared.where)
    guard = Guard(settings, RedisBreaker(shared, settings), RedisAnswerCache(shared, settings.upstream_cache_ttl_s))
    try:
        yield SharedState(guard, RedisRateLimiter(shared, leases), RedisTaskSlots(shared, leases, running), shared)
    finally:
        await leases.close()
        await shared.close()
