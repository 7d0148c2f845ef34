"""A real Redis Sentinel set-up for the tests: a master and its replica on 127.0.0.1, watched by one
sentinel (`redis-server --sentinel`) under the name `fedmaster`, no persistence. `kill_master()`
kills the master and waits for the sentinel to find it down (after 1 s), promote the replica and
report it up.
Missing binary: the tests skip, saying why, except in CI, where they fail."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.redis_server import free_ports, redis_binary, stop_all, wait_until

MASTER_NAME = "fedmaster"


@dataclass
class RedisSentinel:
    folder: Path
    ports: dict[str, int]  # master, replica, sentinel
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.ports['sentinel']}/{MASTER_NAME}/0"

    def master_port(self) -> int:
        import redis

        with redis.Redis(port=self.ports["sentinel"], socket_timeout=1) as sentinel:
            return int(sentinel.sentinel_get_master_addr_by_name(MASTER_NAME)[1])

    def kill_master(self) -> int:
        """SIGKILL the master and wait for the sentinel to promote the replica: the new master's port."""
        before = self.master_port()
        process = self.processes[0 if before == self.ports["master"] else 1]
        process.kill()
        process.wait(10)
        wait_until(lambda: self._healthy_master() not in (None, before), "the sentinel never promoted the replica")
        return self.master_port()

    def _healthy_master(self) -> int | None:
        """The master's port once the sentinel reports it up (a client asks no sooner: redis-py's
        MasterNotFoundError until then)."""
        import redis

        with contextlib.suppress(redis.RedisError), redis.Redis(port=self.ports["sentinel"], socket_timeout=1) as watch:
            state = watch.sentinel_master(MASTER_NAME)
            if state["is_master"] and not state["is_sdown"] and not state["is_odown"]:
                return int(state["port"])
        return None

    def flush(self) -> None:
        import redis

        with redis.Redis(port=self.master_port()) as master:
            master.flushall()

    def stop(self) -> None:
        stop_all(self.processes, self.folder)


def start_redis_sentinel() -> RedisSentinel:
    binary = redis_binary("the Sentinel tests")
    master, replica, watcher = free_ports(3)
    setup = RedisSentinel(Path(tempfile.mkdtemp(prefix="fedresearch-redis-sentinel-")), {})
    setup.ports = {"master": master, "replica": replica, "sentinel": watcher}
    common = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--loglevel", "warning"]
    try:
        setup.processes.append(_start([binary, "--port", str(master), *common], setup.folder / "master"))
        replica_of = ["--replicaof", "127.0.0.1", str(master)]
        setup.processes.append(_start([binary, "--port", str(replica), *replica_of, *common], setup.folder / "replica"))
        wait_until(lambda: _replica_in_sync(replica), "the replica never caught up with the master")
        config = setup.folder / "sentinel.conf"  # a sentinel rewrites its configuration: its own file
        config.write_text(
            f"port {watcher}\nbind 127.0.0.1\n"
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 1\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} 1000\n"
            f"sentinel failover-timeout {MASTER_NAME} 5000\n"
        )
        setup.processes.append(_start([binary, str(config), "--sentinel"], setup.folder / "sentinel"))
        wait_until(lambda: _knows_replica(watcher), "the sentinel never found the replica")
    except BaseException:
        setup.stop()
        raise
    return setup


def _start(command: list[str], home: Path) -> subprocess.Popen[bytes]:
    home.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([*command, "--dir", str(home)], stdout=subprocess.DEVNULL)


def _replica_in_sync(port: int) -> bool:
    import redis

    with contextlib.suppress(redis.RedisError), redis.Redis(port=port, socket_timeout=1) as node:
        return bool(node.info("replication").get("master_link_status") == "up")
    return False


def _knows_replica(port: int) -> bool:
    import redis

    with contextlib.suppress(redis.RedisError), redis.Redis(port=port, socket_timeout=1) as sentinel:
        replicas = sentinel.execute_command("SENTINEL", "REPLICAS", MASTER_NAME)
        return any("s_down" not in str(replica) and "disconnected" not in str(replica) for replica in replicas)
    return False


@pytest.fixture(scope="session")
def redis_sentinel() -> Iterator[RedisSentinel]:
    setup = start_redis_sentinel()
    yield setup
    setup.stop()
