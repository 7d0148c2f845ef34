"""Per-key task limits (MAX_TASKS_PER_KEY): how many tasks an API key has running, in this process or
in Redis across every process and host.

In Redis each running task holds a lease (core/redis.py) that its process renews while the task
runs: a worker killed with SIGKILL stops renewing, and its tasks stop counting within the lease.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Protocol

from fedresearch.core.redis import Leases, SharedRedis

Release = Callable[[], None]

# A finished task's lease is removed by a command sent, not awaited, before its `path` frame
# (awaiting it cost 4% of the CPU a task); when Redis's pool had no idle connection it connected
# first, and a client that starts its next task on `path`, through another worker, could reach
# Redis before the removal and be refused (seen in CI under load). A refusal looks again after
# each of these pauses (0.2 s in all) before it stands.
RECHECK_PAUSES_S = (0.02, 0.05, 0.13)


class TaskSlots(Protocol):
    async def take(self, key: str, limit: int) -> Release | int:
        """One of `limit` places for a task of `key`, as the call that gives it back (safe in a done
        callback); or, when all are taken, how many of its tasks are running."""
        ...


class LocalTaskSlots:
    def __init__(self, running: collections.Counter[str]) -> None:
        self.running = running

    async def take(self, key: str, limit: int) -> Release | int:
        if self.running[key] >= limit:
            return self.running[key]
        return self.count(key)

    def count(self, key: str) -> Release:
        """Count a task of `key` here, with no limit; the call that stops counting it."""
        self.running[key] += 1

        def release() -> None:
            self.running[key] -= 1
            if self.running[key] <= 0:
                del self.running[key]

        return release


class RedisTaskSlots:
    """Leases in Redis, counted here too (for this process's view); this process's own count, with
    the same limit, while Redis fails."""

    def __init__(self, shared: SharedRedis, leases: Leases, running: collections.Counter[str]) -> None:
        self.shared = shared
        self.leases = leases
        self.local = LocalTaskSlots(running)

    async def take(self, key: str, limit: int) -> Release | int:
        name = f"tasks:{key}"

        async def lease() -> Release | int:
            token, held = await self.leases.take(name, limit)
            if token is None:
                return held
            counted = self.local.count(key)

            def release() -> None:
                counted()
                self.leases.release(name, token)

            return release

        for pause in (0.0, *RECHECK_PAUSES_S):
            if pause:
                await asyncio.sleep(pause)
            taken = await self.shared.run("taking a task slot", lease, lambda: self.local.take(key, limit))
            if not isinstance(taken, int):
                break
        return taken
