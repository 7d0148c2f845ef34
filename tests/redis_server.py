"""A real redis-server for the tests, on a Unix socket in a temporary folder (no port to collide on),
with no persistence. Missing binary: the tests skip, saying why, except in CI (CI=true), where they fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
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
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        shutil.rmtree(self.folder, ignore_errors=True)  # every test's and bench's own server leaves none behind


def start_redis() -> RedisServer:
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("redis-server is missing in CI: .ci/run installs it (apt-get install redis-server)")
        pytest.skip("redis-server is not installed (apt-get install redis-server): the Redis tests need a real one")
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
