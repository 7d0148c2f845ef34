"""A real Redis Cluster for the tests: three primaries on 127.0.0.1 (a cluster speaks TCP only, and
each node's bus listens on its port + 10000), the slots spread by `redis-cli --cluster create`, no
persistence. What managed Valkey and Redis offer in cluster mode (ElastiCache Serverless, Memorystore
Cluster): a command whose keys sit in two slots is refused with CROSSSLOT, and a key asked of the
wrong node answers MOVED. Missing binary: the tests skip, saying why, except in CI, where they fail."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fedresearch.core.redis import SharedRedis, connect
from tests.redis_server import free_ports, redis_binary, stop_all, wait_until

_NODES = 3


@dataclass
class RedisCluster:
    processes: list[subprocess.Popen[bytes]]
    ports: list[int]
    folder: Path
    commands: list[list[str]] = field(default_factory=list)

    @property
    def url(self) -> str:
        """One node's address: the client learns the others from it (CLUSTER SLOTS)."""
        return f"redis://127.0.0.1:{self.ports[0]}"

    def flush(self) -> None:
        import redis

        for port in self.ports:
            with redis.Redis(port=port) as node:
                node.flushall()

    def kill(self, node: int) -> None:
        """SIGKILL one node: its slots have no one to answer for them until it is back."""
        self.processes[node].kill()
        self.processes[node].wait(10)

    def restart(self, node: int) -> None:
        """Start a killed node again (its nodes.conf keeps its place) and wait for the cluster to be whole."""
        self.processes[node] = subprocess.Popen(self.commands[node], stdout=subprocess.DEVNULL)
        for port in self.ports:
            wait_until(lambda port=port: _cluster_ok(port), f"node {port} never saw the cluster whole again")

    def stop(self) -> None:
        stop_all(self.processes, self.folder)


def start_redis_cluster() -> RedisCluster:
    binary, cli = redis_binary("the cluster tests"), redis_binary("the cluster tests", "redis-cli")
    folder = Path(tempfile.mkdtemp(prefix="fedresearch-redis-cluster-"))
    ports = free_ports(_NODES)
    cluster = RedisCluster([], ports, folder)
    try:
        for port in ports:
            home = folder / str(port)
            home.mkdir()
            options = ["--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes"]
            options += ["--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"]
            options += ["--save", "", "--appendonly", "no", "--dir", str(home), "--loglevel", "warning"]
            cluster.commands.append([binary, *options])
            cluster.processes.append(subprocess.Popen(cluster.commands[-1], stdout=subprocess.DEVNULL))
        for port in ports:
            wait_until(lambda port=port: _answers(port), f"node {port} did not start")
        nodes = [f"127.0.0.1:{port}" for port in ports]
        subprocess.run(
            [cli, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        for port in ports:
            wait_until(lambda port=port: _cluster_ok(port), f"node {port} never saw the cluster whole")
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _answers(port: int) -> bool:
    import redis

    with contextlib.suppress(redis.RedisError), redis.Redis(port=port, socket_timeout=1) as node:
        return bool(node.ping())
    return False


def _cluster_ok(port: int) -> bool:
    import redis

    with contextlib.suppress(redis.RedisError), redis.Redis(port=port, socket_timeout=1) as node:
        return bool(node.cluster("info").get("cluster_state") == "ok")
    return False


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    cluster = start_redis_cluster()
    yield cluster
    cluster.stop()


@dataclass(frozen=True)
class RedisTarget:
    """A Redis the shared state can live in: a single server, or a cluster (FEDRESEARCH_REDIS_CLUSTER)."""

    url: str
    cluster: bool

    def settings(self) -> dict[str, object]:
        from pydantic import SecretStr

        return {"redis_url": SecretStr(self.url), "redis_cluster": self.cluster}

    def shared(self) -> SharedRedis:
        return SharedRedis(connect(self.url, self.cluster), self.url)


@pytest.fixture(params=["single", "cluster", "sentinel"])
def redis_target(request: pytest.FixtureRequest) -> RedisTarget:
    """The session's single Redis, its cluster or its master behind a sentinel, emptied for this
    test: the tests taking it hold on all three."""
    if request.param == "single":
        return RedisTarget(request.getfixturevalue("redis_url"), cluster=False)
    if request.param == "sentinel":
        sentinel = request.getfixturevalue("redis_sentinel")
        sentinel.flush()
        return RedisTarget(sentinel.url, cluster=False)
    cluster: RedisCluster = request.getfixturevalue("redis_cluster")
    cluster.flush()
    return RedisTarget(cluster.url, cluster=True)
