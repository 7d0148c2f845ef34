"""A real redis-server for the tests, on a Unix socket in a temporary folder (no port to collide on),
with no persistence. Missing binary: the tests skip, saying why, except in CI (CI=true), where they fail."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass
class RedisServer:
    process: subprocess.Popen[bytes]
    folder: Path

    @property
    def url(self) -> str:
        return f"unix://{self.folder / 'redis.sock'}"

    def stop(self) -> None:
        stop_all([self.process], self.folder)  # every test's and bench's own server leaves none behind


def redis_binary(tests: str, name: str = "redis-server") -> str:
    """Debian's `name` (redis-server, redis-cli); missing, `tests` skip saying why, or fail in CI."""
    binary = shutil.which(name)
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is missing in CI: .ci/run installs it (apt-get install redis-server)")
        pytest.skip(f"{name} is not installed (apt-get install redis-server): {tests} need a real one")
    return binary


def stop_all(processes: list[subprocess.Popen[bytes]], folder: Path) -> None:
    """Kill the servers of a set-up and remove their folder."""
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    shutil.rmtree(folder, ignore_errors=True)


def free_ports(count: int) -> list[int]:
    """Ports free for a node and for a cluster node's bus (port + 10000)."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port + 10000 > 65535 or port in ports:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        ports.append(port)
    return ports


def wait_until(condition: Callable[[], bool], failure: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(failure)
        time.sleep(0.05)


def start_redis() -> RedisServer:
    binary = redis_binary("the Redis tests")
    folder = Path(tempfile.mkdtemp(prefix="fedresearch-redis-"))
    options = ["--port", "0", "--unixsocket", str(folder / "redis.sock"), "--unixsocketperm", "700"]
    options += ["--save", "", "--appendonly", "no", "--dir", str(folder), "--loglevel", "warning"]
    process = subprocess.Popen([binary, *options], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    server = RedisServer(process, folder)
    deadline = time.monotonic() + 20
    while not (folder / "redis.sock").exists():
        if process.poll() is not None or time.monotonic() > deadline:
            server.stop()
            error = process.stderr.read().decode() if process.stderr else ""
            raise RuntimeError(f"redis-server did not start: {error}")
        time.sleep(0.02)
    return server


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = start_redis()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session's Redis, emptied for this test."""
    import redis

    with redis.Redis.from_url(redis_server.url) as client:
        client.flushall()
    return redis_server.url
