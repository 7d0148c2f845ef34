"""`fedresearch serve`: one server process, or a supervisor and its workers (serve/workers.py).

Deciding which imports nothing of the app: a supervisor only binds the port and tends processes,
and the app's imports (the retrievers, the library, the report writer, the MCP and OpenAI SDKs)
held about 70 MB in it that served nothing. One process imports the app once it knows it is one.
"""

from __future__ import annotations

import logging
from typing import Literal

from pydantic import ValidationError

from fedresearch.core.cores import auto_workers, library_vectors
from fedresearch.core.settings import Settings
from fedresearch.jobs.stopping import stop_limits
from fedresearch.serve import workers as workers_pool
from fedresearch.serve.preflight import prepare

log = logging.getLogger("fedresearch")


def serve(
    settings: Settings | None = None,
    host: str | None = None,
    port: int | None = None,
    workers: int | Literal["auto"] | None = None,
    balance: workers_pool.Balance = "reuseport",
) -> None:
    """One server process, or (`workers` > 1, else FEDRESEARCH_WORKERS) a supervisor and its workers."""
    settings = settings or Settings()
    host = host or settings.host
    chosen = settings.workers if workers is None else workers
    said = crowded = None
    vectors = worker_vectors(settings)
    if chosen == "auto":
        auto = auto_workers(settings.embeddings, vectors=vectors)
        count, said = auto.count, f"workers auto: {auto.describe()}"
    else:
        count = chosen
        crowded = auto_workers(settings.embeddings, vectors=vectors).crowded(count) if count > 1 else None
    prepare(settings, host, with_pid=count > 1)  # sets the log up
    if said is not None:
        log.info("%s", said)
    if crowded is not None:
        log.warning("%s", crowded)
    port = settings.port if port is None else port
    if count > 1:
        limits = stop_limits(settings)
        raise SystemExit(workers_pool.supervise(host, port, count, balance, limits, stop_limits_now))
    from fedresearch.serve.process import serve_one

    serve_one(settings, host, port)


def worker_vectors(settings: Settings) -> int:
    """The bytes of passage vectors each worker may hold: the embedded library's, with embeddings on
    (on PostgreSQL pgvector searches them in the database)."""
    if not settings.embeddings or settings.library_url is not None:
        return 0
    return library_vectors(settings.library_dir / "library.sqlite3", settings.library_vector_cache_mb)


def stop_limits_now() -> tuple[float, float] | None:
    """The same as the environment and `.env` say now; None where they are invalid (a worker started
    now fails, saying why)."""
    try:
        return stop_limits(Settings())
    except ValidationError:
        return None
