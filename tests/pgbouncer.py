"""A real PgBouncer in transaction mode in front of the test session's PostgreSQL (Debian's
`pgbouncer`, installed by .ci/run): what a team puts between many workers and one database. Its
pool is kept small (2 server connections a database) so that the library's connections share
server connections, as they do in production. Missing binary: skipped outside CI, failed in it."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

_INI = """\
[databases]
* = host={socket_dir} port={port} user={user}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen_port}
unix_socket_dir =
auth_type = trust
auth_file = {folder}/users.txt
pool_mode = transaction
default_pool_size = 2
max_client_conn = 200
logfile = {folder}/pgbouncer.log
pidfile = {folder}/pgbouncer.pid
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def pgbouncer_port(postgres_server: str) -> Iterator[int]:
    from psycopg.conninfo import conninfo_to_dict

    binary = shutil.which("pgbouncer", path=f"{os.environ.get('PATH', '')}:/usr/sbin")  # Debian puts it in sbin
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("pgbouncer is missing in CI: .ci/run installs it (apt-get install pgbouncer)")
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer): the pooler tests need a real one")
    server = conninfo_to_dict(postgres_server)
    socket_dir = str(server["host"])
    folder = Path(tempfile.mkdtemp(prefix="fedresearch-pgbouncer-"))
    listen_port = _free_port()
    values = {"socket_dir": socket_dir, "port": server.get("port", 5432), "user": server.get("user", "postgres")}
    (folder / "pgbouncer.ini").write_text(_INI.format(**values, listen_port=listen_port, folder=folder))
    (folder / "users.txt").write_text(f'"{values["user"]}" ""\n')
    command = [binary, str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:  # PgBouncer will not run as root: it runs as the server's own user
        owner = os.stat(socket_dir).st_uid
        os.chown(folder, owner, -1)
        for name in ("pgbouncer.ini", "users.txt"):
            os.chown(folder / name, owner, -1)
        command[1:1] = ["-u", pwd.getpwuid(owner).pw_name]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", listen_port), timeout=1).close()
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                log = (folder / "pgbouncer.log").read_text() if (folder / "pgbouncer.log").exists() else ""
                error = process.stderr.read().decode() if process.stderr else ""
                pytest.fail(f"pgbouncer did not start: {error} {log[-2000:]}")
            time.sleep(0.05)
    yield listen_port
    process.terminate()
    process.wait(10)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def pooled_url(postgres_server: str, pgbouncer_port: int) -> Iterator[str]:
    """A database of the test's own (PgBouncer passes no `search_path` option), reached through
    PgBouncer in transaction mode; dropped after the test."""
    import psycopg

    name = f"test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server, autocommit=True) as db:
        db.execute(f"CREATE DATABASE {name}")
    with psycopg.connect(postgres_server, dbname=name, autocommit=True) as db:
        for extension in ("vector", "btree_gin"):
            db.execute(f"CREATE EXTENSION {extension}")
    yield f"postgresql://postgres@127.0.0.1:{pgbouncer_port}/{name}"
    with psycopg.connect(postgres_server, autocommit=True) as db:
        db.execute(f"DROP DATABASE {name} WITH (FORCE)")
