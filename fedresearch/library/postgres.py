"""The library's store on PostgreSQL with pgvector: for teams that outgrow one process and one disk.

Every table is keyed by (user_id, id) and every foreign key carries user_id, so the tables shard by
user on Citus unchanged (docs/operations.md, "Citus"), and every statement names the user.
Full text: blocks of postings of the terms the embedded index makes (postgres_bm25.py), ranked by
BM25 as tantivy ranks them. Vectors: an exact scan of the user's rows, or, for users with more than
`hnsw_from` passages, HNSW indexes (cosine) of their own rows, one per segment of at most
`segment_rows` passages (a graph of 1M rows found too few of the exact nearest), all searched in one
statement, with iterative scans so filters keep recall. Every row is written through binary COPY; a
bulk load (`bulk`) is one transaction.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Self

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row, tuple_row
from psycopg_pool import ConnectionPool, PoolTimeout

from fedresearch.library import postgres_bm25
from fedresearch.library.records import DocumentInfo, Prepared
from fedresearch.library.search import Row, SearchFilters
from fedresearch.library.store import LibraryDatabaseError, LibraryUnavailable, Ranking

log = logging.getLogger("fedresearch")

DIMS = 384  # the vector column's width: the library's encoder (all-MiniLM-L6-v2)
# 2: library_terms (document frequencies kept at ingest); 3: BM25 from posting blocks
# (library_postings; the tsvectors, their GIN indexes and library_terms gone); 4: vector segments
# (library_passages.segment, library_users.segments)
SCHEMA_VERSION = 4
# Users with more passages than this get an HNSW index of their own rows, one per segment (a partial
# index) and search them; below it an exact scan of their rows is about as fast and exact
# (bench/library_pg.py measures both; docs/benchmarks.md): at 20k the exact scan took 13.9 ms, the
# user's index 2.8 ms (recall@10 0.999). One index shared by every user was walked mostly through
# other users' rows: a user of 100k among 1.1M rows got recall@10 0.840 in 97 ms at ef_search 1000.
HNSW_FROM = 10_000
# A user's passages fall into segments of at most this many (live) passages, each with an HNSW index
# of its own, all searched in one statement: recall fell with the size of one graph on the bench's
# vectors (ef_search 1000: 0.994 at 250k rows, 0.960 at 500k, 0.87-0.93 at 1M; docs/benchmarks.md)
SEGMENT_ROWS = 250_000
EF_SEARCH_MAX = 1000  # pgvector's largest
# hnsw.ef_search by the passages of the user's largest segment (up to, ef_search), past the last
# EF_SEARCH_MAX (one setting for the statement that searches every segment): in a graph of 100k rows
# 400 found 0.986-0.991 of the exact top 10 in 5.5 ms, 1000 0.996 in 11 ms; of 250k rows 400 found
# 0.976 in 5.6 ms, 1000 0.994 in 12 ms (docs/benchmarks.md)
HNSW_EF_SEARCH = ((100_000, 400),)
POOL_SIZE = 8
# Every call holds one of the library's threads while it waits for a connection: a wait is
# bounded, and while the server is unreachable a call fails at once (Reachability).
POOL_WAIT_S = 5.0
# psycopg_pool retries a failed connection with a delay that doubles (1, 2, 4 … s) for this long,
# then stops until a call needs one: with its default (300 s) the first search after a minute's
# outage worked 5.7 s after the server was back (up to 32 s: the delay then), 0.3 s with this.
RECONNECT_S = 2.0
WAIT_SLICE_S = 0.2  # how often a call waiting for a connection looks whether the server is gone
PROBE_EVERY_S = 1.0  # while unreachable, how often one call tries a connection of its own
CONNECT_TIMEOUT_S = 3
# A server whose packets vanish (a failover that moves its address, a partition) sends no reset:
# without these, a connection waiting for its answer waited until TCP gave up (about 15 min of
# retransmissions, or the system's keepalive: over 2 h), and with the pool's 8 held no new one
# was made. With them a dead peer's connection ends within about half a minute (Linux: keepalive
# probes from 10 s of silence, the connection closed once 20 s pass unacknowledged); a busy
# server's kernel still answers both, so a long query is not cut. The URL's own values win.
TCP_DEFAULTS = {
    "keepalives": "1",
    "keepalives_idle": "10",  # s of silence before the first probe
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "20000",  # ms a sent packet may go unacknowledged
}
_SCHEMA_LOCK = 7_215_420_091  # pg_advisory_lock key: one process creates or upgrades the schema

# The HNSW graphs' ef_construction (pgvector's default 64): a user of 1M in segments of 250k got
# recall@10 0.992 at ef_search 1000 against 0.976 with 64, for index builds of 416 s against 267 s
# (docs/benchmarks.md)
HNSW_EF_CONSTRUCTION = 128
# A user's HNSW index is built with at most this much maintenance_work_mem (the server's own setting
# when larger): 1M rows need about 2.5 GB to build in memory, several times faster.
HNSW_BUILD_MEMORY_MB = 4096
# A bulk load gathers a user's postings over this many passages before writing them as blocks (a
# write rewrites the last block of every term it holds: 2,000 passages rewrote 18,000 blocks)
BULK_POSTINGS = 20_000

DDL = """
CREATE TABLE IF NOT EXISTS library_documents (
    user_id text NOT NULL,
    id bigserial,
    kind text NOT NULL,
    source text NOT NULL,
    content_hash text NOT NULL,
    title text NOT NULL,
    authors jsonb NOT NULL DEFAULT '[]',
    author_keys text[] NOT NULL DEFAULT '{}',
    year integer,
    doi text,
    url text,
    tags jsonb NOT NULL DEFAULT '[]',
    tag_keys text[] NOT NULL DEFAULT '{}',
    extra jsonb NOT NULL DEFAULT '{}',
    added_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, id),
    UNIQUE (user_id, source)
);
CREATE TABLE IF NOT EXISTS library_passages (
    user_id text NOT NULL,
    id bigserial,
    document_id bigint NOT NULL,
    kind text NOT NULL,
    heading text NOT NULL DEFAULT '',
    page integer,
    position integer NOT NULL,
    text text NOT NULL,
    embedding vector(384),
    terms integer NOT NULL DEFAULT 0,  -- its postings in library_postings
    segment smallint NOT NULL DEFAULT 0,  -- its vector segment (SEGMENT_ROWS): whose HNSW index holds it
    PRIMARY KEY (user_id, id),
    FOREIGN KEY (user_id, document_id) REFERENCES library_documents (user_id, id) ON DELETE CASCADE
);
-- vectors inline (the toaster moves text out instead): an exact scan read 3-5x faster (README)
ALTER TABLE library_passages ALTER COLUMN embedding SET STORAGE PLAIN;
CREATE INDEX IF NOT EXISTS library_passages_by_document ON library_passages (user_id, document_id);
-- vectors: an HNSW index per segment of each user past HNSW_FROM passages (PostgresStore.index_vectors)
DROP INDEX IF EXISTS library_passages_hnsw;
CREATE TABLE IF NOT EXISTS library_users (
    user_id text PRIMARY KEY,
    passages bigint NOT NULL DEFAULT 0,
    body_tokens bigint NOT NULL DEFAULT 0,
    cjk_tokens bigint NOT NULL DEFAULT 0,
    segments bigint[] NOT NULL DEFAULT '{}'  -- passages in each vector segment (0, 1, ...): the last is filled
);
-- BM25 (postgres_bm25.py): each term's postings (field 0 the English body, 1 CJK bigrams) in blocks
-- of at most postgres_bm25.BLOCK, from passage id `low` to `high`: the ids, frequencies and lengths
-- packed in `data`, stored out of line uncompressed (read whole at every search of the term)
CREATE TABLE IF NOT EXISTS library_postings (
    user_id text NOT NULL,
    field smallint NOT NULL,
    term text NOT NULL,
    low bigint NOT NULL,
    high bigint NOT NULL,
    postings integer NOT NULL,
    data bytea NOT NULL,
    PRIMARY KEY (user_id, field, term, low)
);
ALTER TABLE library_postings ALTER COLUMN data SET STORAGE EXTERNAL;
"""

# Versions 1 and 2 searched tsvectors: they go, and the postings are made once from the passages.
_UPGRADE_TO_3 = """
DROP TABLE IF EXISTS library_terms;
ALTER TABLE library_passages DROP COLUMN IF EXISTS english, DROP COLUMN IF EXISTS cjk;
ALTER TABLE library_users DROP COLUMN IF EXISTS english_lexemes, DROP COLUMN IF EXISTS cjk_lexemes;
ALTER TABLE library_users ADD COLUMN IF NOT EXISTS body_tokens bigint NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS cjk_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE library_passages ADD COLUMN IF NOT EXISTS terms integer NOT NULL DEFAULT 0;
UPDATE library_users SET passages = 0;
"""

# Version 3 kept one HNSW index of each large user's rows: its rows are cut into segments (by id, of
# SEGMENT_ROWS) and each segment of a user past HNSW_FROM gets its index (create_schema).
_UPGRADE_TO_4 = """
ALTER TABLE library_passages ADD COLUMN IF NOT EXISTS segment smallint NOT NULL DEFAULT 0;
ALTER TABLE library_users ADD COLUMN IF NOT EXISTS segments bigint[] NOT NULL DEFAULT '{}';
"""

PASSAGE_COLUMNS = (
    "p.id, p.heading, p.page, p.position, p.text, p.kind, p.embedding AS vector, d.id AS document_id,"
    " d.title, d.authors::text AS authors, d.year, d.doi, d.url, d.tags::text AS tags, d.extra::text AS extra,"
    " d.source"
)


@dataclass(frozen=True)
class StoredPassage:
    heading: str
    page: int | None
    position: int
    text: str
    vector: bytes | None  # float32, DIMS of them


@dataclass(frozen=True)
class StoredDocument:
    """A document as the store keeps it: what ingest prepares, and what migrate reads from SQLite."""

    kind: str
    source: str
    content_hash: str
    title: str
    authors: list[str]
    year: int | None
    doi: str | None
    url: str | None
    tags: list[str]
    extra: dict[str, Any]
    passages: list[StoredPassage]
    added_at: str | None = None  # ISO 8601; None: now

    @classmethod
    def of(cls, item: Prepared) -> StoredDocument:
        d = item.document
        passages = [
            StoredPassage(c.heading, c.page, c.position, c.text, v)
            for c, v in zip(item.chunks, item.vectors, strict=True)
        ]
        return cls(
            d.kind, d.source, d.content_hash, d.title, d.authors, d.year, d.doi, d.url, d.tags, d.extra, passages
        )


def create_schema(url: str) -> None:
    """The tables and indexes, once: idempotent, and safe when several processes open at once.

    One transaction under a transaction-level lock: behind a pooler in transaction mode (PgBouncer)
    consecutive statements may run on different server connections, so a session's lock, taken on
    one, held back no statement run on another (four workers opening a new database at once failed
    with "duplicate key value violates unique constraint"), and its unlock, sent to another, could
    leave it held for the next start to wait on."""
    try:
        connection = psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S, prepare_threshold=None)
    except psycopg.OperationalError as error:
        raise LibraryUnavailable(_no_connection(_first_line(error))) from None
    with connection as db, db.transaction():
        db.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        _require_extensions(db)
        db.execute("CREATE TABLE IF NOT EXISTS library_schema (version integer NOT NULL)")
        row = db.execute("SELECT max(version) FROM library_schema").fetchone()
        version = row[0] if row else None
        if version is not None and version > SCHEMA_VERSION:
            raise LibraryDatabaseError(
                f"the library's tables are at version {version}, newer than this fedresearch ({SCHEMA_VERSION})"
            )
        if version != SCHEMA_VERSION:
            if version is not None and version < 3:
                db.execute(_UPGRADE_TO_3)
            if version is not None:
                db.execute(_UPGRADE_TO_4)
            db.execute(DDL)
            if version is not None:
                if version < 3:
                    _index_all(db)
                _segment_all(db, SEGMENT_ROWS)
                for user_id in _large_users(db, HNSW_FROM):
                    for segment in _live(_segments(db, user_id)):
                        _index_vectors(db, user_id, segment)
            db.execute("DELETE FROM library_schema")
            db.execute("INSERT INTO library_schema (version) VALUES (%s)", (SCHEMA_VERSION,))


def _require_extensions(db: psycopg.Connection[Any]) -> None:
    for name in ("vector",):
        try:
            db.execute(f"CREATE EXTENSION IF NOT EXISTS {name}")
        except psycopg.Error as error:
            raise LibraryDatabaseError(
                f"PostgreSQL extension {name!r} is missing and could not be created ({error}); "
                f"a superuser can run: CREATE EXTENSION {name};"
            ) from error


class Reachability:
    """Whether the server is away: a pooled connection found ended by it, and no new one made since.

    While it is, a call fails at once with LibraryUnavailable and the reason instead of waiting
    POOL_WAIT_S in the pool's queue, holding one of the library's threads. Once every
    PROBE_EVERY_S one call tries a connection of its own; when the server takes it, calls go to
    the pool again (and the pool, having stopped retrying after RECONNECT_S, connects at once). A
    connection refused while those the pool holds still answer (max_connections reached) is not
    an outage: calls wait their turn as before."""

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._lock = threading.Lock()
        self._reason: str | None = None  # why the last connection attempt failed
        self._lost = False  # a pooled connection was found ended since the server last answered
        self._probe_at = 0.0
        self._said = False  # the outage is in the log

    @property
    def reason(self) -> str | None:
        return self._reason

    @property
    def away(self) -> str | None:
        """Why the server is away, while it is."""
        reason = self._reason
        return _no_connection(reason) if reason is not None and self._lost else None

    def failed(self, error: Exception) -> None:
        with self._lock:
            self._reason = _cause(error)

    def lost(self) -> None:
        with self._lock:
            if not self._lost:
                self._probe_at = time.monotonic() + PROBE_EVERY_S
            self._lost = True

    def reached(self) -> None:
        self._reason, self._lost = None, False
        if self._said:
            self._said = False
            log.warning("the library's PostgreSQL server answers again")

    def check(self) -> None:
        """Return when a call may go to the pool; raise LibraryUnavailable while the server is away."""
        if not self._lost or self._reason is None:
            return
        with self._lock:
            reason, now = self.reason, time.monotonic()  # it may have come back meanwhile
            if reason is None or not self._lost:
                return
            if now < self._probe_at:
                raise LibraryUnavailable(_no_connection(reason))
            self._probe_at = now + PROBE_EVERY_S
        self.probe()

    def probe(self) -> None:
        """Try a connection outside the pool: reached, or failed and LibraryUnavailable raised."""
        try:
            psycopg.connect(self._conninfo, connect_timeout=CONNECT_TIMEOUT_S).close()
        except psycopg.OperationalError as error:
            self.failed(error)
            if not self._said:
                self._said = True
                # where it was trying to connect is for the operator; clients get the cause alone
                log.warning("%s; library calls fail at once until it answers", _no_connection(_first_line(error)))
            raise LibraryUnavailable(_no_connection(_cause(error))) from None
        self.reached()


class _ReportingConnection(psycopg.Connection[Any]):
    """The pool's connections: each attempt the pool makes, in its own threads, tells the store's
    Reachability whether the server took it, so calls stop waiting on an outage within one attempt."""

    @classmethod
    def connect(cls, conninfo: str = "", **kwargs: Any) -> Self:
        reachability: Reachability = kwargs.pop("reachability")
        try:
            connection = super().connect(conninfo, **kwargs)
        except psycopg.OperationalError as error:
            reachability.failed(error)
            raise
        reachability.reached()
        return connection


def tcp_defaults(url: str) -> dict[str, str]:
    """TCP_DEFAULTS the URL does not set itself (libpq ignores them on a Unix socket)."""
    given = conninfo_to_dict(url)
    return {name: value for name, value in TCP_DEFAULTS.items() if name not in given}


def _answers(db: psycopg.Connection[Any]) -> bool:
    try:
        ConnectionPool.check_connection(db)
    except psycopg.OperationalError:
        return False
    return True


def _first_line(error: Exception) -> str:
    return str(error).strip().split("\n", 1)[0] or type(error).__name__


# libpq names the address it tried: the database's host, port or socket path are not the clients' to see
_ADDRESS = re.compile(r'^.*connection to server (at "[^"]*"( \([^)]*\))?, port \d+|on socket "[^"]*") failed: ')


def _cause(error: Exception) -> str:
    """Why a connection failed, without where to: "Connection refused", "FATAL:  too many clients
    already", "timeout expired"."""
    line = _first_line(error)
    return _ADDRESS.sub("", line) or line


def _no_connection(reason: str) -> str:
    return f"no connection to the library's PostgreSQL server: {reason}"


class PostgresStore:
    """A pool of synchronous connections: the facade is called from worker threads (asyncio.to_thread)."""

    concurrent_searches = True

    def __init__(
        self,
        url: str,
        dims: int | None,
        hnsw_from: int = HNSW_FROM,
        pool_size: int = POOL_SIZE,
        read_timeout_s: float | None = None,
        transaction_pooling: bool = False,
    ) -> None:
        """`read_timeout_s`: the server cancels a read (a search, a list) that runs longer, as its
        caller has given up by then; writes and `health` keep the operator's own timeout.

        `transaction_pooling`: `url` is a pooler in transaction mode (PgBouncer's
        `pool_mode = transaction`), where consecutive transactions of one connection may run on
        different server connections, each shared with other clients. psycopg's prepared
        statements then fail (through PgBouncer 1.18, 54 of 400 searches from 8 threads: "prepared
        statement _pg3_0 does not exist", "already exists", or another statement's parameter
        count), so none are made; and the read bound is set in each read's transaction, as a
        session setting would stay on whichever server connection took it."""
        if dims is not None and dims != DIMS:
            raise LibraryDatabaseError(
                f"the PostgreSQL library holds {DIMS}-dimensional vectors, the encoder makes {dims}"
            )
        self.hnsw_from = hnsw_from
        self.segment_rows = SEGMENT_ROWS  # a user's passages a vector segment holds at most
        self.ef_search: int | None = None  # None: by the user's passages (HNSW_EF_SEARCH)
        self.read_timeout_s = read_timeout_s
        self.transaction_pooling = transaction_pooling
        # as `statement_timeout` takes it
        self._read_timeout = None if read_timeout_s is None else f"{max(1, round(read_timeout_s * 1000))}ms"
        create_schema(url)
        self._url = url
        self.reachability = Reachability(url)
        self._pool: ConnectionPool[Any] = ConnectionPool(
            url,
            min_size=1,
            max_size=pool_size,
            open=False,
            name="fedresearch-library",  # as psycopg's log lines name it
            connection_class=_ReportingConnection,
            kwargs={
                "row_factory": dict_row,
                "reachability": self.reachability,
                **tcp_defaults(url),
                # prepared statements save planning (1.7 against 2.9 ms a search, a small library)
                **({"prepare_threshold": None} if transaction_pooling else {}),
            },
            configure=self._configure,
            reconnect_timeout=RECONNECT_S,  # no `timeout`: every wait for a connection is _getconn's
        )
        self._pool.open(wait=True, timeout=30)

    def close(self) -> None:
        self._pool.close()

    def _configure(self, db: psycopg.Connection[Any]) -> None:
        register_vector(db)
        if self._read_timeout is not None and not self.transaction_pooling:
            # a search its caller gave up on (a lock, a slow plan) would otherwise keep its
            # connection and its thread until it ends: with the pool's 8 held, every user's
            # library searches failed, and the threads waiting for them held up others
            db.execute("SELECT set_config('statement_timeout', %s, false)", (self._read_timeout,))
            db.commit()

    def unavailable(self) -> str | None:
        return self.reachability.away

    @contextmanager
    def _db(self, bounded: bool = True, snapshot: bool = False) -> Iterator[psycopg.Connection[dict[str, Any]]]:
        """One transaction: committed when the block ends, rolled back when it raises; `bounded`:
        its statements are cancelled after `read_timeout_s` (reads), or keep the operator's own
        `statement_timeout` (writes: none unless the server, role or database sets one).

        Raises LibraryUnavailable when the server cannot be reached, its connection was lost, or it
        cancelled a read that ran too long. `snapshot`: a read-only transaction whose statements
        all see the database as its first did (repeatable read)."""
        self.reachability.check()
        try:
            db = self._working_connection()
        except PoolTimeout:
            if (reason := self.reachability.reason) is not None:
                raise LibraryUnavailable(_no_connection(reason)) from None
            raise LibraryUnavailable(
                f"no connection to the library's PostgreSQL server came free within {POOL_WAIT_S:g} s"
            ) from None
        try:
            with db:
                if snapshot:  # before any other statement of the transaction
                    db.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                if self._read_timeout is not None and self.transaction_pooling and bounded:
                    # one round trip more a read: there is no session of ours to set it on once
                    db.execute("SELECT set_config('statement_timeout', %s, true)", (self._read_timeout,))
                elif self._read_timeout is not None and not self.transaction_pooling and not bounded:
                    # a writer waits its turn behind the user's other writer: the read bound is
                    # lifted, to what the operator configured (the server's, role's or database's)
                    db.execute("SET LOCAL statement_timeout TO DEFAULT")
                yield db
        except psycopg.errors.QueryCanceled as error:
            if db.broken:
                raise self._lost(error) from None
            reason = _first_line(error)
            if "statement timeout" in reason and bounded and self.read_timeout_s is not None:
                reason += f" (reads stop after {self.read_timeout_s:g} s, RETRIEVER_TIMEOUT_S)"
            raise LibraryUnavailable(f"the library's PostgreSQL server cancelled the query: {reason}") from None
        except (psycopg.errors.InvalidSqlStatementName, psycopg.errors.DuplicatePreparedStatement) as error:
            raise self._statements_lost(error) from None
        except psycopg.OperationalError as error:
            if isinstance(error, psycopg.errors.ProtocolViolation) and "prepared statement" in str(error):
                raise self._statements_lost(error) from None  # another statement's under our name
            if not db.broken:
                raise  # the server's answer to this query (a constraint, a deadlock...), not an outage
            raise self._lost(error) from None
        finally:
            self._pool.putconn(db)

    def _statements_lost(self, error: Exception) -> LibraryUnavailable:
        """A prepared statement missing, or already there under our name: what a pooler in
        transaction mode does to them (the next transaction runs on another server connection)."""
        advice = (
            ""
            if self.transaction_pooling
            else "; behind a pooler in transaction mode (PgBouncer), set FEDRESEARCH_LIBRARY_TRANSACTION_POOLING=true"
        )
        return LibraryUnavailable(
            f"the library's PostgreSQL server lost a prepared statement: {_first_line(error)}{advice}"
        )

    def _lost(self, error: Exception) -> LibraryUnavailable:
        """The connection ended mid-call: the server is away (probe raises), or it restarted and is back."""
        self.reachability.lost()
        self.reachability.probe()
        return LibraryUnavailable(f"the library's PostgreSQL server ended the connection: {_cause(error)}")

    def _working_connection(self) -> psycopg.Connection[dict[str, Any]]:
        """A pooled connection that answers an empty query. The first found ended by the server
        while it sat in the pool (a restart, a failover) has every idle one checked at once, and
        the server tried: the pool's own `check` option tries them one by one, sleeping 1, 2, 4 s
        between them, so after a restart two calls each waited 5 s and failed."""
        db: psycopg.Connection[dict[str, Any]] = self._getconn()
        if _answers(db):
            self.reachability.reached()
            return db
        self._pool.putconn(db)  # closed: the pool replaces it
        self.reachability.lost()
        self._pool.check()
        self.reachability.probe()  # raises while the server is away
        db = self._getconn()
        if _answers(db):
            return db
        self._pool.putconn(db)
        raise LibraryUnavailable("the library's PostgreSQL server ended a new connection at once")

    def _getconn(self) -> psycopg.Connection[dict[str, Any]]:
        """A connection from the pool within POOL_WAIT_S, waited for in slices: a call queued
        behind the one that finds the server gone (a task's three library searches start together)
        stops waiting then, instead of at the end of POOL_WAIT_S."""
        deadline = time.monotonic() + POOL_WAIT_S
        while True:
            try:
                connection: psycopg.Connection[dict[str, Any]] = self._pool.getconn(
                    timeout=max(0.0, min(WAIT_SLICE_S, deadline - time.monotonic()))
                )
                return connection
            except PoolTimeout:
                if (away := self.reachability.away) is not None:
                    raise LibraryUnavailable(away) from None
                if time.monotonic() >= deadline:
                    raise

    # -- writing ------------------------------------------------------------------------------

    def store(self, user_id: str, prepared: Sequence[Prepared]) -> tuple[int, int]:
        return self.write(user_id, [StoredDocument.of(item) for item in prepared])

    def write(self, user_id: str, documents: Sequence[StoredDocument]) -> tuple[int, int]:
        """Store documents in one transaction, replacing the user's earlier versions; (added, replaced).

        A source given twice in one call is stored once, as its last version (the earlier counts as
        replaced, as if it had been written by a call of its own). A user who passes `hnsw_from`
        passages gets an HNSW index of each of their segments once it is committed (index_vectors);
        the index of a segment the replace emptied is dropped."""
        if not documents:
            return 0, 0
        with self._db(bounded=False) as db:
            load = BulkLoad(db, segment_rows=self.segment_rows)
            counts = load.write(user_id, documents)
            load.finish()
            large = self.passage_count(db, user_id) > self.hnsw_from
        if large or load.emptied:
            self.index_vectors(user_id, build=large)
        return counts

    @contextmanager
    def bulk(self) -> Iterator[BulkLoad]:
        """One transaction for many writes (`library migrate`; bench/library_pg.py): BulkLoad.write
        as `write`, each user's postings gathered over BULK_POSTINGS passages. Into a library that
        holds no passage yet, the users past `hnsw_from` get the HNSW index of each of their segments
        at the end, in the same transaction (built once: at 100k rows a shared index took 527
        vectors/s added one by one, 2,900/s built); into one that does, after the commit
        (index_vectors), as other users' writes would wait for a build in the transaction. Killed
        or failed, nothing of it stays (an index being built after the commit is made again by the
        next write or bulk load of its user)."""
        with self._db(bounded=False) as db:
            empty = db.execute("SELECT NOT EXISTS (SELECT 1 FROM library_passages) AS empty").fetchone()
            load = BulkLoad(db, gather=BULK_POSTINGS, segment_rows=self.segment_rows)
            load.empty = bool(empty and empty["empty"])
            yield load
            load.finish()
            large = [user for user in load.users if self.passage_count(db, user) > self.hnsw_from]
            if load.empty:
                for user_id in large:
                    for segment in _live(_segments(db, user_id)):
                        _index_vectors(db, user_id, segment)
        for user_id in load.users:
            if (user_id in large and not load.empty) or user_id in load.emptied:
                self.index_vectors(user_id, build=user_id in large)

    def index_vectors(self, user_id: str, build: bool = True) -> None:
        """The HNSW index of each of the user's segments that holds passages, made (CONCURRENTLY:
        searches and other writes go on) unless it is there and valid (`build`: else none is made);
        one left invalid by an interrupted build is dropped and made again, and the index of a
        segment emptied by deletions is dropped."""
        with self._db(bounded=False) as db:
            live = set(_live(_segments(db, user_id)))
            rows = db.execute(
                "SELECT c.relname AS name, i.indisvalid AS valid FROM pg_index i JOIN pg_class c"
                " ON c.oid = i.indexrelid WHERE i.indrelid = 'library_passages'::regclass AND c.relname LIKE %s",
                (_vector_index(user_id, None) + "%",),
            ).fetchall()
        held = {row["name"]: row["valid"] for row in rows}
        names = {_vector_index(user_id, segment): segment for segment in live}
        gone = [name for name, valid in held.items() if name not in names or not valid]
        wanted = [segment for name, segment in names.items() if not held.get(name)] if build else []
        if not gone and not wanted:
            return
        with psycopg.connect(self._url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as db:
            for name in gone:
                if name in names:
                    log.warning("a user's HNSW index was left unfinished by an interrupted build: made again")
                db.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(name)))
            for segment in sorted(wanted):
                _index_vectors(db, user_id, segment, concurrently=True)

    def set_vectors(self, user_id: str, vectors: Sequence[tuple[bytes | None, int]]) -> None:
        with self._db(bounded=False) as db, db.cursor() as cursor:
            cursor.executemany(
                "UPDATE library_passages SET embedding = %s WHERE user_id = %s AND id = %s",
                [(_vector(blob), user_id, chunk_id) for blob, chunk_id in vectors],
            )

    def delete(self, user_id: str, document_id: int) -> bool:
        """Delete the document; the HNSW index of a segment it empties is dropped after the commit."""
        with self._db(bounded=False) as db:
            _lock_user(db, user_id)
            emptied = _take(db, user_id, _forget(db, user_id, [document_id]))
            deleted = db.execute(
                "DELETE FROM library_documents WHERE user_id = %s AND id = %s", (user_id, document_id)
            ).rowcount
        if emptied:
            self.index_vectors(user_id, build=False)
        return bool(deleted)

    # -- reading ------------------------------------------------------------------------------

    def hashes(self, user_id: str, sources: list[str]) -> dict[str, str]:
        with self._db() as db:
            rows = db.execute(
                "SELECT source, content_hash FROM library_documents WHERE user_id = %s AND source = ANY(%s)",
                (user_id, sources),
            ).fetchall()
        return {row["source"]: row["content_hash"] for row in rows}

    def without_vectors(self, user_id: str) -> list[Row]:
        with self._db() as db:
            return list(
                db.execute(
                    "SELECT p.id, p.heading, p.text, d.title FROM library_passages p JOIN library_documents d"
                    " ON d.user_id = p.user_id AND d.id = p.document_id"
                    " WHERE p.user_id = %s AND p.embedding IS NULL ORDER BY p.id",
                    (user_id,),
                ).fetchall()
            )

    def documents(self, user_id: str) -> list[DocumentInfo]:
        with self._db() as db:
            rows = db.execute(
                "SELECT d.id, d.kind, d.title, d.source, d.added_at, COUNT(p.id) AS chunks FROM library_documents d"
                " LEFT JOIN library_passages p ON p.user_id = d.user_id AND p.document_id = d.id"
                " WHERE d.user_id = %s GROUP BY d.user_id, d.id ORDER BY d.id",
                (user_id,),
            ).fetchall()
        return [
            DocumentInfo(r["id"], r["kind"], r["title"], r["source"], r["chunks"], r["added_at"].isoformat())
            for r in rows
        ]

    def passages(self, user_id: str, chunk_ids: Sequence[int]) -> dict[int, Row]:
        if not chunk_ids:
            return {}
        with self._db() as db, db.cursor(binary=True) as cursor:  # binary: vectors read 0.7 ms faster a search
            rows = cursor.execute(
                f"SELECT {PASSAGE_COLUMNS} FROM library_passages p JOIN library_documents d"
                " ON d.user_id = p.user_id AND d.id = p.document_id WHERE p.user_id = %s AND p.id = ANY(%s)",
                (user_id, list(chunk_ids)),
            ).fetchall()
        for row in rows:
            vector = row["vector"]
            row["vector"] = None if vector is None else vector.to_numpy().astype(np.float32).tobytes()
        return {row["id"]: row for row in rows}

    def bm25(self, user_id: str, kind: str | None, query: str, filters: SearchFilters, limit: int) -> Ranking:
        """Okapi BM25 as the embedded store's tantivy index ranks (postgres_bm25.py): the same
        terms, lengths and formula, the user's passages as the collection."""
        narrow = None if kind is None and not _filtered(filters) else _Narrow(user_id, kind, filters)
        # one snapshot for its several statements: read committed gave each its own, and a document
        # replaced between them was found by one and gone for the next
        with self._db(snapshot=True) as db:
            return postgres_bm25.search(db, user_id, query, narrow, limit)

    def document_passages(self, user_id: str, document_id: int) -> list[Row]:
        with self._db() as db:
            rows = db.execute(
                "SELECT id, heading, page, position, text FROM library_passages"
                " WHERE user_id = %s AND document_id = %s ORDER BY position, id",
                (user_id, document_id),
            ).fetchall()
        return list(rows)

    def term_counts(self, user_id: str, words: Sequence[str]) -> dict[str, int]:
        """The user's passages holding each English word (stemmed as the body is), from the postings'
        block counts: BM25's own document frequencies."""
        stems: dict[str, str] = {}
        analyze = postgres_bm25.english_analyzer().analyze
        for word in words:
            terms = analyze(word)
            if len(terms) == 1:
                stems[word] = terms[0]
        if not stems:
            return dict.fromkeys(words, 0)
        with self._db() as db:
            rows = db.execute(
                "SELECT term, sum(postings) AS passages FROM library_postings"
                " WHERE user_id = %s AND field = %s AND term = ANY(%s) GROUP BY term",
                (user_id, postgres_bm25.BODY, list(set(stems.values()))),
            ).fetchall()
        found = {row["term"]: int(row["passages"]) for row in rows}
        return {word: found.get(stems[word], 0) if word in stems else 0 for word in words}

    def dense(
        self, user_id: str, query_vector: np.ndarray, kind: str | None, filters: SearchFilters, limit: int
    ) -> Ranking:
        """Cosine ranking: exact over the user's rows, or, for users past `hnsw_from` passages,
        through the HNSW indexes of their segments, every segment's best `limit` in one statement
        and merged by distance, with iterative scans (filters applied as they go); should it come
        back short of `limit` (a filter few rows pass, more rows skipped than pgvector's
        hnsw.max_scan_tuples, or no index yet), exact after all."""
        scope, values = _scope(filters)
        arguments = {"user": user_id, "kind": kind, "query": query_vector, "limit": limit, **values}
        with self._db() as db:
            row = db.execute("SELECT passages, segments FROM library_users WHERE user_id = %s", (user_id,)).fetchone()
            held, segments = (int(row["passages"]), [int(n) for n in row["segments"]]) if row else (0, [])
            rows: list[dict[str, Any]] = []
            if held > self.hnsw_from and any(segments):
                largest = max(segments)
                ef = self.ef_search or next((ef for most, ef in HNSW_EF_SEARCH if largest <= most), EF_SEARCH_MAX)
                db.execute(
                    "SELECT set_config('hnsw.ef_search', %s, true),"
                    " set_config('hnsw.iterative_scan', 'relaxed_order', true)",
                    (str(min(max(ef, limit), EF_SEARCH_MAX)),),
                )
                # the user id and segment written out, so the planner matches each segment's partial index
                user = sql.Literal(user_id).as_string(db).replace("%", "%%")
                rows = db.execute(
                    self._nearest("p.embedding <=> %(query)b", user, kind, filters, scope, _live(segments)),
                    arguments,
                ).fetchall()
            if len(rows) < min(limit, held):
                # `+ 0` hides the distance from the planner, which then scans the user's rows exactly
                exact = self._nearest("(p.embedding <=> %(query)b) + 0", "%(user)s", kind, filters, scope)
                rows = db.execute(exact, arguments).fetchall()
            return [(row["id"], float(row["cosine"])) for row in rows]

    @staticmethod
    def _nearest(
        order: str, user: str, kind: str | None, filters: SearchFilters, scope: str, segments: Sequence[int] = ()
    ) -> str:
        """The best `limit` of the user's rows; with `segments`, the best `limit` of each (UNION
        ALL), merged. Materialized, then sorted: the planner would otherwise merge the index scans
        as if each gave its rows in order, which an iterative scan in relaxed order does not."""
        among = [f" AND p.segment = {int(segment)}" for segment in segments] or [""]
        found = " UNION ALL ".join(
            f"(SELECT p.id, {order} AS distance FROM library_passages p{_join(filters)} WHERE p.user_id = {user}"
            f"{segment} AND p.embedding IS NOT NULL{_kind(kind)}{scope} ORDER BY {order} LIMIT %(limit)s)"
            for segment in among
        )
        return (
            f"WITH found AS MATERIALIZED ({found})"
            " SELECT id, 1 - distance AS cosine FROM found ORDER BY distance, id LIMIT %(limit)s"
        )

    @staticmethod
    def passage_count(db: psycopg.Connection[dict[str, Any]], user_id: str) -> int:
        row = db.execute("SELECT passages FROM library_users WHERE user_id = %s", (user_id,)).fetchone()
        return int(row["passages"]) if row else 0

    def health(self) -> str:
        with self._db(bounded=False) as db:
            version = db.execute("SELECT max(version) AS v FROM library_schema").fetchone()
            counts = db.execute(
                "SELECT (SELECT count(*) FROM library_users) AS users,"
                " (SELECT count(*) FROM library_documents) AS documents,"
                " (SELECT count(*) FROM library_passages) AS passages,"
                " (SELECT count(*) FROM library_passages WHERE embedding IS NULL) AS unembedded"
            ).fetchone()
        assert version is not None and counts is not None
        return (
            f"PostgreSQL library, schema version {version['v']}: {counts['users']} users, "
            f"{counts['documents']} documents, {counts['passages']} passages "
            f"({counts['unembedded']} without a vector); full text and vectors are indexed as they are written"
        )


class BulkLoad:
    """Writes in one transaction (`PostgresStore.write`, `PostgresStore.bulk`): documents and
    passages go in through COPY as they come; each user's postings are gathered and written as
    blocks once `gather` passages are held, before a replace, and at `finish`."""

    def __init__(self, db: psycopg.Connection[Any], gather: int = 0, segment_rows: int = SEGMENT_ROWS) -> None:
        self._db = db
        self._gather = gather
        self._segment_rows = segment_rows
        self._postings: dict[str, postgres_bm25.Postings] = {}
        self.passages = 0  # written so far
        self.empty = False  # the library held no passage when it began: the users' indexes are built in it
        self.emptied: set[str] = set()  # users a replace left with an empty segment (its index to drop)

    def write(self, user_id: str, documents: Sequence[StoredDocument]) -> tuple[int, int]:
        """As PostgresStore.write: (added, replaced)."""
        if not documents:
            return 0, 0
        db = self._db
        latest = {document.source: document for document in documents}
        if user_id not in self._postings:
            _lock_user(db, user_id)
            self._postings[user_id] = postgres_bm25.Postings()
        with db.cursor(row_factory=tuple_row) as cursor:
            earlier = [
                int(row[0])
                for row in cursor.execute(
                    "SELECT id FROM library_documents WHERE user_id = %s AND source = ANY(%s)",
                    (user_id, list(latest)),
                ).fetchall()
            ]
        if earlier:
            self._flush(user_id)  # what was gathered goes into the blocks that _forget cuts from
            if _take(db, user_id, _forget(db, user_id, earlier)):
                self.emptied.add(user_id)
            db.execute("DELETE FROM library_documents WHERE user_id = %s AND id = ANY(%s)", (user_id, earlier))
        postings = self._postings[user_id]
        segments = _segments(db, user_id)
        self.passages += _insert(db, user_id, list(latest.values()), postings, segments, self._segment_rows)
        _set_segments(db, user_id, segments)
        if postings.passages >= self._gather:
            self._flush(user_id, final=False)
        return len(latest) - len(earlier), len(earlier) + len(documents) - len(latest)

    @property
    def users(self) -> list[str]:
        """The users written to."""
        return list(self._postings)

    def finish(self) -> None:
        for user_id in self._postings:
            self._flush(user_id)

    def _flush(self, user_id: str, final: bool = True) -> None:
        """The user's gathered postings into blocks: all of them (`final`), or all but each term's
        postings past its last full block (postgres_bm25.Postings.write)."""
        with self._db.cursor(row_factory=tuple_row) as cursor:
            row = cursor.execute("SELECT passages FROM library_users WHERE user_id = %s", (user_id,)).fetchone()
        first = row is None or row[0] == 0  # no passage: no block
        self._postings[user_id].write(self._db, user_id, first_write=first, final=final)


def _vector_index(user_id: str, segment: int | None) -> str:
    """The name of the HNSW index of the user's segment (a digest: any user id, within PostgreSQL's
    63 bytes); None: the prefix of every segment's (version 3's index of all the user's rows had
    no suffix)."""
    prefix = "library_hnsw_" + hashlib.sha256(user_id.encode()).hexdigest()[:32] + "_"
    return prefix if segment is None else f"{prefix}{segment}"


def _index_vectors(db: psycopg.Connection[Any], user_id: str, segment: int, concurrently: bool = False) -> None:
    """The HNSW index of the user's segment (a partial index of its rows), built in memory when
    maintenance_work_mem holds the graph (about 2.5 KB a row): sized here up to HNSW_BUILD_MEMORY_MB
    unless the server allows more."""
    with db.cursor(row_factory=tuple_row) as cursor:
        row = cursor.execute(
            "SELECT count(*), current_setting('maintenance_work_mem') FROM library_passages"
            " WHERE user_id = %s AND segment = %s AND embedding IS NOT NULL",
            (user_id, segment),
        ).fetchone()
        assert row is not None
        wanted = f"{min(HNSW_BUILD_MEMORY_MB, 64 + int(row[0]) * 2_500 // 2**20)}MB"
        cursor.execute(
            "SELECT set_config('maintenance_work_mem', %s, %s) WHERE pg_size_bytes(%s) < pg_size_bytes(%s)",
            (wanted, not concurrently, row[1], wanted),  # local to the transaction, or the session's
        )
        cursor.execute(
            sql.SQL(
                "CREATE INDEX {how} IF NOT EXISTS {name} ON library_passages USING hnsw (embedding vector_cosine_ops)"
                " WITH (ef_construction = {construction}) WHERE user_id = {user} AND segment = {segment}"
            ).format(
                how=sql.SQL("CONCURRENTLY" if concurrently else ""),
                name=sql.Identifier(_vector_index(user_id, segment)),
                user=sql.Literal(user_id),
                construction=sql.SQL(str(int(HNSW_EF_CONSTRUCTION))),
                segment=sql.SQL(str(int(segment))),  # as the search writes it, for the planner to match
            )
        )


def _large_users(db: psycopg.Connection[Any], passages: int) -> list[str]:
    with db.cursor(row_factory=tuple_row) as cursor:
        rows = cursor.execute("SELECT user_id FROM library_users WHERE passages > %s", (passages,)).fetchall()
    return [row[0] for row in rows]


def _segments(db: psycopg.Connection[Any], user_id: str) -> list[int]:
    """The user's passages in each of their vector segments."""
    with db.cursor(row_factory=tuple_row) as cursor:
        row = cursor.execute("SELECT segments FROM library_users WHERE user_id = %s", (user_id,)).fetchone()
    return [] if row is None else [int(n) for n in row[0]]


def _set_segments(db: psycopg.Connection[Any], user_id: str, segments: list[int]) -> None:
    db.execute("UPDATE library_users SET segments = %s WHERE user_id = %s", (segments, user_id))


def _live(segments: Sequence[int]) -> list[int]:
    """The segments that hold passages."""
    return [segment for segment, held in enumerate(segments) if held > 0]


def _take(db: psycopg.Connection[Any], user_id: str, gone: dict[int, int]) -> bool:
    """Take passages about to be deleted (by segment) from the user's segment counts; whether a
    segment is left empty."""
    if not gone:
        return False
    segments = _segments(db, user_id)
    for segment, count in gone.items():
        segments[segment] -= count
    _set_segments(db, user_id, segments)
    return any(segments[segment] == 0 for segment in gone)


def _segment_all(db: psycopg.Connection[Any], segment_rows: int) -> None:
    """Cut every user's passages into segments of `segment_rows` (by id) and count them; the HNSW
    indexes of version 3 (one of each large user's rows) are dropped."""
    with db.cursor(row_factory=tuple_row) as cursor:
        names = cursor.execute(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " WHERE i.indrelid = 'library_passages'::regclass AND c.relname LIKE 'library\\_hnsw\\_%'"
        ).fetchall()
    for (name,) in names:
        db.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(name)))
    db.execute(
        "UPDATE library_passages p SET segment = s.segment FROM (SELECT user_id, id,"
        " (row_number() OVER (PARTITION BY user_id ORDER BY id) - 1) / %s AS segment FROM library_passages"
        " WHERE user_id IN (SELECT user_id FROM library_users WHERE passages > %s)) s"
        " WHERE p.user_id = s.user_id AND p.id = s.id AND s.segment > 0",
        (segment_rows, segment_rows),
    )
    db.execute(
        "UPDATE library_users u SET segments = coalesce((SELECT array_agg(held ORDER BY segment) FROM"
        " (SELECT segment, count(*) AS held FROM library_passages p WHERE p.user_id = u.user_id GROUP BY segment)"
        " counted), '{}')"
    )


def _lock_user(db: psycopg.Connection[Any], user_id: str) -> int:
    """Writers of one user take turns (as SQLite's one writer does); other users' writers never wait.
    The user's passages."""
    db.execute("INSERT INTO library_users (user_id) VALUES (%s) ON CONFLICT (user_id) DO NOTHING", (user_id,))
    with db.cursor(row_factory=tuple_row) as cursor:
        row = cursor.execute("SELECT passages FROM library_users WHERE user_id = %s FOR UPDATE", (user_id,)).fetchone()
    assert row is not None
    return int(row[0])


def _forget(db: psycopg.Connection[Any], user_id: str, document_ids: list[int]) -> dict[int, int]:
    """Take these documents' passages out of BM25 (their postings and the user's counts), before
    they are deleted; their passages in each vector segment. Their terms are made again from their
    text; should fewer postings be found than were written (another analyzer since), the user's
    blocks in their id range are scanned instead, so none is left behind."""
    if not document_ids:
        return {}
    with db.cursor(row_factory=tuple_row) as cursor:
        rows = cursor.execute(
            "SELECT p.id, p.heading, p.text, p.terms, d.title, p.segment FROM library_passages p"
            " JOIN library_documents d ON d.user_id = p.user_id AND d.id = p.document_id"
            " WHERE p.user_id = %s AND p.document_id = ANY(%s)",
            (user_id, document_ids),
        ).fetchall()
    if not rows:
        return {}
    gone = [(row[0], postgres_bm25.PassageTerms.of(row[4], row[1], row[2])) for row in rows]
    if postgres_bm25.remove(db, user_id, gone) != sum(row[3] for row in rows):
        log.warning("the library's postings of %d passages were made by another analyzer: removed by a scan", len(rows))
        postgres_bm25.remove_by_scan(db, user_id, [row[0] for row in rows])
    segments: dict[int, int] = {}
    for row in rows:
        segments[row[5]] = segments.get(row[5], 0) + 1
    return segments


_DOCUMENT_COPY = (
    "COPY library_documents (user_id, id, kind, source, content_hash, title, authors, author_keys, year, doi, url,"
    " tags, tag_keys, extra, added_at) FROM STDIN (FORMAT BINARY)"
)
# jsonb, text[] and vector values go as their binary forms made here (typed bytea for psycopg: the
# server reads each by its column's type): psycopg's own dumpers took a third of a bulk load's time
_DOCUMENT_TYPES = [
    "text", "int8", "text", "text", "text", "text", "bytea", "bytea", "int4", "text", "text", "bytea", "bytea",
    "bytea", "timestamptz",
]  # fmt: skip
_PASSAGE_COPY = (
    "COPY library_passages (user_id, id, document_id, kind, heading, page, position, text, embedding, terms,"
    " segment) FROM STDIN (FORMAT BINARY)"
)
_PASSAGE_TYPES = ["text", "int8", "int8", "text", "text", "int4", "int4", "text", "bytea", "int4", "int2"]


def _insert(
    db: psycopg.Connection[Any],
    user_id: str,
    documents: Sequence[StoredDocument],
    postings: postgres_bm25.Postings,
    segments: list[int],
    segment_rows: int,
) -> int:
    """The documents and their passages (with their vectors), each through one COPY (binary); their
    postings gathered into `postings`; each passage in the user's last vector segment while it
    holds fewer than `segment_rows`, else in a new one (`segments` counted up). How many passages."""
    with db.cursor(row_factory=tuple_row) as cursor:
        row = cursor.execute("SELECT now()").fetchone()
        assert row is not None
        now: datetime = row[0]
        document_ids = _next_ids(cursor, "library_documents", len(documents))
        with cursor.copy(_DOCUMENT_COPY) as copy:
            copy.set_types(_DOCUMENT_TYPES)
            for document_id, d in zip(document_ids, documents, strict=True):
                copy.write_row(
                    (
                        user_id,
                        document_id,
                        d.kind,
                        d.source,
                        d.content_hash,
                        d.title,
                        _jsonb(d.authors),
                        _text_array([author.lower() for author in d.authors]),
                        d.year,
                        d.doi,
                        d.url,
                        _jsonb(d.tags),
                        _text_array([tag.lower() for tag in d.tags]),
                        _jsonb(d.extra),
                        now if d.added_at is None else _moment(d.added_at),
                    )
                )
        passages = [(d_id, d, p) for d_id, d in zip(document_ids, documents, strict=True) for p in d.passages]
        if not passages:
            return 0
        terms = [postgres_bm25.PassageTerms.of(d.title, p.heading, p.text) for _, d, p in passages]
        ids = _next_ids(cursor, "library_passages", len(passages))
        placed = []
        for _ in passages:
            if not segments or segments[-1] >= segment_rows:
                segments.append(0)
            segments[-1] += 1
            placed.append(len(segments) - 1)
        with cursor.copy(_PASSAGE_COPY) as copy:
            copy.set_types(_PASSAGE_TYPES)
            for passage_id, (document_id, d, p), t, segment in zip(ids, passages, terms, placed, strict=True):
                copy.write_row(
                    (
                        user_id,
                        passage_id,
                        document_id,
                        d.kind,
                        p.heading,
                        p.page,
                        p.position,
                        p.text,
                        None
                        if p.vector is None
                        else _VECTOR_HEAD + np.frombuffer(p.vector, "<f4").astype(">f4").tobytes(),
                        t.count,
                        segment,
                    )
                )
    for passage_id, t in zip(ids, terms, strict=True):
        postings.add(passage_id, t)
    return len(passages)


def _next_ids(cursor: psycopg.Cursor[Any], table: str, count: int) -> list[int]:
    """`count` ids from the table's sequence, in order, for rows written through COPY."""
    rows = cursor.execute(
        "SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)", (table, count)
    ).fetchall()
    return [int(row[0]) for row in rows]


def _moment(iso: str) -> datetime:
    """An ISO 8601 time (a naive one taken as UTC)."""
    moment = datetime.fromisoformat(iso)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _index_all(db: psycopg.Connection[Any]) -> None:
    """Postings and counts of every stored passage, made once when an older schema is upgraded."""
    log.warning("making the library's BM25 postings from its passages (schema %d)", SCHEMA_VERSION)
    gathered: dict[str, postgres_bm25.Postings] = {}  # the table is new: no user holds a block

    with db.cursor(name="library_upgrade", row_factory=tuple_row) as passages:
        passages.execute(
            "SELECT p.user_id, p.id, p.heading, p.text, d.title FROM library_passages p JOIN library_documents d"
            " ON d.user_id = p.user_id AND d.id = p.document_id ORDER BY p.user_id, p.id"
        )
        while batch := passages.fetchmany(2000):
            counted: dict[str, list[tuple[int, int]]] = {}
            for user_id, passage_id, heading, text, title in batch:
                terms = postgres_bm25.PassageTerms.of(title, heading, text)
                gathered.setdefault(user_id, postgres_bm25.Postings()).add(passage_id, terms)
                counted.setdefault(user_id, []).append((passage_id, terms.count))
            for user_id, counts in counted.items():
                db.execute(
                    "UPDATE library_passages SET terms = c.n FROM unnest(%s::int8[], %s::int4[]) AS c(id, n)"
                    " WHERE user_id = %s AND library_passages.id = c.id",
                    ([i for i, _ in counts], [n for _, n in counts], user_id),
                )
            for user_id, postings in gathered.items():
                if postings.passages >= BULK_POSTINGS:
                    postings.write(db, user_id, first_write=True, final=False)
    for user_id, postings in gathered.items():
        postings.write(db, user_id, first_write=True)


_VECTOR_HEAD = struct.pack(">hh", DIMS, 0)  # pgvector's binary form: dimensions, unused, then float32s


def _jsonb(value: Any) -> bytes:
    """jsonb's binary form: its version (1), then the JSON text."""
    return b"\x01" + json.dumps(value, ensure_ascii=False).encode()


def _text_array(values: Sequence[str]) -> bytes:
    """A text[]'s binary form: dimensions, no nulls, text's type oid (25), [length, lower bound], items."""
    if not values:
        return struct.pack(">iii", 0, 0, 25)
    items = [struct.pack(">iiiii", 1, 0, 25, len(values), 1)]
    for value in values:
        encoded = value.encode()
        items += [len(encoded).to_bytes(4, "big"), encoded]
    return b"".join(items)


def _vector(blob: bytes | None) -> np.ndarray | None:
    return None if blob is None else np.frombuffer(blob, dtype=np.float32)


def _filtered(filters: SearchFilters) -> bool:
    return bool(
        filters.year_min is not None
        or filters.year_max is not None
        or filters.authors
        or filters.tags
        or filters.document_ids
    )


class _Narrow:
    """Which passages the search's kind and filters allow (postgres_bm25.Narrow)."""

    def __init__(self, user_id: str, kind: str | None, filters: SearchFilters) -> None:
        scope, values = _scope(filters)
        self._values = {"user": user_id, "kind": kind, **values}
        self._where = f"FROM library_passages p{_join(filters)} WHERE p.user_id = %(user)s{_kind(kind)}{scope}"

    def among(self, db: psycopg.Connection[Any], ids: np.ndarray) -> np.ndarray:
        return self._ids(db, f"SELECT p.id {self._where} AND p.id = ANY(%(ids)s)", ids=ids.tolist())

    def every(self, db: psycopg.Connection[Any], at_most: int) -> np.ndarray | None:
        found = self._ids(db, f"SELECT p.id {self._where} LIMIT %(limit)s", limit=at_most + 1)
        return found if len(found) <= at_most else None

    def _ids(self, db: psycopg.Connection[Any], sql: str, **values: Any) -> np.ndarray:
        with db.cursor(row_factory=tuple_row) as cursor:
            rows = cursor.execute(sql, {**self._values, **values}).fetchall()
        return np.array([r[0] for r in rows], dtype=np.int64)


def _kind(kind: str | None) -> str:
    return "" if kind is None else " AND p.kind = %(kind)s"


def _join(filters: SearchFilters) -> str:
    """The documents join the metadata filters need (and only then: the plain search reads passages alone)."""
    needed = filters.year_min is not None or filters.year_max is not None or filters.authors or filters.tags
    return " JOIN library_documents d ON d.user_id = p.user_id AND d.id = p.document_id" if needed else ""


def _scope(filters: SearchFilters) -> tuple[str, dict[str, Any]]:
    """SQL conditions (and their values) for SearchFilters, the same filters the embedded store applies."""
    clauses: list[str] = []
    values: dict[str, Any] = {}
    if filters.year_min is not None:
        clauses.append(" AND d.year >= %(year_min)s")
        values["year_min"] = filters.year_min
    if filters.year_max is not None:
        clauses.append(" AND d.year <= %(year_max)s")
        values["year_max"] = filters.year_max
    if filters.authors:
        clauses.append(" AND d.author_keys && %(authors)s")
        values["authors"] = [author.lower() for author in filters.authors]
    if filters.tags:
        clauses.append(" AND d.tag_keys && %(tags)s")
        values["tags"] = [tag.lower() for tag in filters.tags]
    if filters.document_ids:
        clauses.append(" AND p.document_id = ANY(%(document_ids)s)")
        values["document_ids"] = list(filters.document_ids)
    return "".join(clauses), values
