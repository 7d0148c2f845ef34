"""What only the PostgreSQL store has: its schema's versioning, the HNSW path for large users, and
a database server that restarts or goes away."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

import aiohttp
import numpy as np
import psycopg
import pytest
import websockets
from aiohttp import web

from fedresearch.cli import main
from fedresearch.core.settings import Settings
from fedresearch.library.facade import Library
from fedresearch.library.ingest import ingest
from fedresearch.library.postgres import POOL_WAIT_S, PostgresStore, StoredDocument, StoredPassage
from fedresearch.library.postgres_bm25 import BLOCK, PassageTerms, decode, fieldnorm_id
from fedresearch.library.search import SearchFilters
from fedresearch.library.store import LibraryDatabaseError, LibraryUnavailable
from fedresearch.web.app import create_app
from fedresearch.web.keys import RUNTIME
from tests.conftest import EXAMPLES, make_settings, run_task
from tests.federation.test_faults import outcome
from tests.tcp_proxy import TcpProxy


def test_the_schema_is_made_once_and_a_newer_one_is_refused(postgres_url):
    Library(postgres_url).close()
    Library(postgres_url).close()  # idempotent: the second open changes nothing
    with psycopg.connect(postgres_url, autocommit=True) as db:
        assert db.execute("SELECT count(*) FROM library_schema").fetchone() == (1,)
        db.execute("UPDATE library_schema SET version = version + 1")
    with pytest.raises(LibraryDatabaseError, match="newer than this fedresearch"):
        Library(postgres_url)


def _index_scans(url: str) -> dict[str, int]:
    with psycopg.connect(url) as db:
        rows = db.execute(
            "SELECT s.indexrelname, s.idx_scan FROM pg_stat_user_indexes s"
            " JOIN pg_index i ON i.indexrelid = s.indexrelid"
            " WHERE s.indexrelname LIKE 'library_hnsw_%' AND i.indisvalid"
        ).fetchall()
    return dict(rows)


def test_the_hnsw_path_finds_what_the_exact_scan_finds_and_keeps_filters(postgres_url, encoder):
    library = Library(postgres_url, encoder=encoder)
    ingest(library, "bob", [EXAMPLES])  # another user's rows: in no index of alice's
    store = library.store
    assert isinstance(store, PostgresStore)
    store.hnsw_from = 5  # every user is "large": the write gives each an HNSW index of their own
    ingest(library, "alice", [EXAMPLES])
    assert len(_index_scans(postgres_url)) == 1  # alice's; bob's comes with his next write
    store.write("bob", [_document("b.md", "bob's note")])
    indexes = _index_scans(postgres_url)
    assert len(indexes) == 2
    query = "merging the ordered outputs of several search systems into one list"
    store.hnsw_from = 10**9
    exact = library.search("alice", query, None, 10, mode="dense")
    # a table this small is scanned rather than searched through an index, unless the planner may not
    indexed = Library(f"{postgres_url}{quote(' -c enable_seqscan=off -c enable_sort=off')}", encoder=encoder)
    indexed.store.hnsw_from = 5  # type: ignore[attr-defined]
    approximate = indexed.search("alice", query, None, 10, mode="dense")
    assert [p.chunk_id for p in approximate] == [p.chunk_id for p in exact]
    deadline = time.monotonic() + 10  # a backend's statistics reach the others within a second or so
    while sum(_index_scans(postgres_url).values()) == sum(indexes.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sum(_index_scans(postgres_url).values()) == sum(indexes.values()) + 1  # alice's index answered
    indexed.close()
    store.hnsw_from = 5
    years = library.search("alice", "retrieval", "biblio", 20, "dense", SearchFilters(year_min=2019, year_max=2020))
    assert years and all(2019 <= p.year <= 2020 for p in years)
    owned = {d.id for d in library.list_documents("alice")}
    assert {p.document_id for p in library.search("alice", query, None, 100, mode="dense")} <= owned
    library.close()


def test_a_filter_that_starves_the_hnsw_scan_is_answered_exactly(postgres_url):
    """pgvector's iterative scan gives up after hnsw.max_scan_tuples rows (here 1) past its first
    ef_search (here 10), so a filter 1% of the rows pass came back with 7 of 10: the search then
    scans the user's rows exactly, and finds the top 10 all the same."""
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(2000, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    documents = [
        StoredDocument("note", f"s{i}", "h", f"t{i}", [], 2020 if i % 100 == 0 else 2000, None, None, [], {},
                       [StoredPassage("", None, 0, f"text {i}", vectors[i].tobytes())])
        for i in range(2000)
    ]  # fmt: skip
    store = PostgresStore(postgres_url, dims=None)
    store.hnsw_from = 5
    store.write("alice", documents)
    options = " -c hnsw.max_scan_tuples=1 -c enable_seqscan=off -c enable_sort=off"  # the index, not a scan
    starved = PostgresStore(f"{postgres_url}{quote(options)}", dims=None)
    starved.hnsw_from, starved.ef_search = 5, 10
    query, filters = rng.normal(size=384).astype(np.float32), SearchFilters(year_min=2020)
    store.hnsw_from = 10**9
    exact = store.dense("alice", query, None, filters, 10)
    assert len(exact) == 10 and starved.dense("alice", query, None, filters, 10) == exact
    starved.close()
    store.close()


def test_a_library_url_must_be_postgresql(tmp_path):
    with pytest.raises(ValueError, match="must be a postgresql:// URL"):
        Settings(_env_file=None, FEDRESEARCH_LIBRARY_URL="mysql://somewhere/db")
    assert Settings(
        _env_file=None, FEDRESEARCH_LIBRARY_URL="", FEDRESEARCH_DATA_DIR=str(tmp_path)
    ).library_location == (tmp_path / "library")


def test_bad_settings_stop_the_cli_with_their_names_and_never_their_values(monkeypatch, capsys):
    """pydantic's own message shows the value given, and a URL may hold a password."""
    monkeypatch.setenv("FEDRESEARCH_LIBRARY_URL", "mysql://reader:hunter2@db.example/library")
    monkeypatch.setenv("FEDRESEARCH_REDIS_URL", "redis+sentinel://:hunter2@sentinel-a:26379")
    assert main(["serve", "--port", "0"]) == 2
    said = capsys.readouterr().err
    assert "FEDRESEARCH_LIBRARY_URL: FEDRESEARCH_LIBRARY_URL must be a postgresql:// URL" in said
    assert "FEDRESEARCH_REDIS_URL: a Sentinel URL is redis+sentinel://" in said
    assert "hunter2" not in said and "Traceback" not in said


Posting = tuple[int, str, int, int, int]  # field, term, passage, frequency, fieldnorm id


def _counts(url: str, user: str) -> tuple[list[Posting], set[Posting], tuple, tuple]:
    """(the postings the user's blocks hold, those the user's passages make today, the user's kept
    totals, the totals recounted from the passages); every block checked on the way."""
    with psycopg.connect(url) as db:
        kept: list[Posting] = []
        for field, term, low, high, count, data in db.execute(
            "SELECT field, term, low, high, postings, data FROM library_postings WHERE user_id = %s", (user,)
        ):
            ids, tf, norm = decode(bytes(data))
            assert 0 < len(ids) == count <= BLOCK and (ids[0], ids[-1]) == (low, high) and all(np.diff(ids) > 0)
            kept += [(field, term, int(i), int(f), int(n)) for i, f, n in zip(ids, tf, norm, strict=True)]
        made: set[Posting] = set()
        recounted = [0, 0, 0]
        for passage, heading, text, title in db.execute(
            "SELECT p.id, p.heading, p.text, d.title FROM library_passages p JOIN library_documents d"
            " ON d.user_id = p.user_id AND d.id = p.document_id WHERE p.user_id = %s",
            (user,),
        ):
            terms = PassageTerms.of(title, heading, text)
            for field, counts, length in ((0, terms.body, terms.body_length), (1, terms.cjk, terms.cjk_length)):
                made |= {(field, term, passage, tf, fieldnorm_id(length)) for term, tf in counts.items()}
            recounted = [recounted[0] + 1, recounted[1] + terms.body_length, recounted[2] + terms.cjk_length]
        totals = db.execute(
            "SELECT passages, body_tokens, cjk_tokens FROM library_users WHERE user_id = %s", (user,)
        ).fetchone()
        return kept, made, totals or (0, 0, 0), tuple(recounted)


def _document(source: str, text: str) -> StoredDocument:
    return StoredDocument(
        "highlight", source, text, source, [], None, None, None, [], {}, [StoredPassage("", None, 0, text, None)]
    )


def test_postings_stay_exact_through_ingest_replace_and_delete(postgres_url):
    library = Library(postgres_url)
    store = library.store
    assert isinstance(store, PostgresStore)
    ingest(library, "alice", [EXAMPLES])
    ingest(library, "bob", [EXAMPLES])
    kept, made, totals, recounted = _counts(postgres_url, "alice")
    assert sorted(kept) == sorted(made) and totals == recounted and totals[0] > 0
    assert any(field == 1 for field, *_ in kept)  # the example library holds Chinese notes
    # replaced (a new text), a source twice in one call (the last one stays), then deleted
    assert store.write("alice", [_document("x.md", "fusion of rankings"), _document("y.md", "rankings")]) == (2, 0)
    assert store.write("alice", [_document("x.md", "rankings merged"), _document("x.md", "fused lists 融合")]) == (0, 2)
    kept, made, totals, recounted = _counts(postgres_url, "alice")
    assert sorted(kept) == sorted(made) and totals == recounted
    for document in library.list_documents("alice"):
        assert store.delete("alice", document.id)
    kept, _, totals, _ = _counts(postgres_url, "alice")
    assert kept == [] and totals == (0, 0, 0)  # no block is left empty
    kept, made, _, _ = _counts(postgres_url, "bob")
    assert sorted(kept) == sorted(made)  # bob's untouched
    library.close()


def test_blocks_fill_up_split_and_shrink_as_passages_come_and_go(postgres_url):
    """A common term's postings past BLOCK go to a new block; small writes extend the last one;
    a replace in the middle and deletes cut postings out of the blocks that hold them."""
    library = Library(postgres_url)
    store = library.store
    assert isinstance(store, PostgresStore)
    first = [_document(f"a{i}.md", f"common word{i} {'rare ' * (i % 3)}") for i in range(BLOCK + 300)]
    store.write("alice", first)
    for i in range(5):  # small writes, each appending to the last block
        store.write("alice", [_document(f"b{i}.md", f"common other{i}")])
    store.write("alice", [_document("a7.md", "replaced common text")])  # a passage cut from the first block
    kept, made, totals, recounted = _counts(postgres_url, "alice")
    assert sorted(kept) == sorted(made) and totals == recounted
    with psycopg.connect(postgres_url) as db:
        blocks = db.execute(
            "SELECT postings FROM library_postings WHERE user_id = 'alice' AND term = 'common' ORDER BY low"
        ).fetchall()
    assert [b[0] for b in blocks] == [BLOCK - 1, 300 + 5 + 1]
    assert library.search("alice", "replaced", None, 1, "bm25")[0].text == "replaced common text"
    for document in library.list_documents("alice")[::2]:
        store.delete("alice", document.id)
    kept, made, totals, recounted = _counts(postgres_url, "alice")
    assert sorted(kept) == sorted(made) and totals == recounted and totals[0] == (BLOCK + 305) // 2
    library.close()


def test_a_version_2_library_gets_its_postings_when_upgraded(postgres_url):
    library = Library(postgres_url)
    ingest(library, "alice", [EXAMPLES])
    before = library.search("alice", "reciprocal rank fusion", None, 5, mode="bm25")
    library.close()
    with psycopg.connect(postgres_url, autocommit=True) as db:  # the tables as version 2 left them
        db.execute("DROP TABLE library_postings")
        db.execute("ALTER TABLE library_users DROP COLUMN body_tokens, DROP COLUMN cjk_tokens")
        db.execute("ALTER TABLE library_users ADD COLUMN english_lexemes bigint, ADD COLUMN cjk_lexemes bigint")
        db.execute("ALTER TABLE library_passages DROP COLUMN terms, ADD COLUMN english tsvector")
        db.execute("CREATE TABLE library_terms (user_id text)")
        db.execute("CREATE INDEX library_passages_hnsw ON library_passages USING hnsw (embedding vector_cosine_ops)")
        db.execute("UPDATE library_schema SET version = 2")
    library = Library(postgres_url)
    kept, made, totals, recounted = _counts(postgres_url, "alice")
    assert sorted(kept) == sorted(made) and kept and totals == recounted and totals[0] > 0
    with psycopg.connect(postgres_url) as db:  # the index of every user's rows gone
        assert db.execute("SELECT count(*) FROM pg_indexes WHERE indexname = 'library_passages_hnsw'").fetchone() == (
            0,
        )
    after = library.search("alice", "reciprocal rank fusion", None, 5, mode="bm25")
    assert [(p.chunk_id, p.score) for p in after] == [(p.chunk_id, p.score) for p in before] and after
    library.close()


def test_bm25_beside_the_vector_search_ranks_as_one_after_the_other(postgres_url, encoder):
    library = Library(postgres_url, encoder=encoder)
    ingest(library, "alice", [EXAMPLES])
    assert library.store.concurrent_searches
    questions = ["reciprocal rank fusion", "融合 排序", "dense retrieval with filters"]
    beside = [library.search("alice", q, None, 10, "hybrid") for q in questions]
    library.store.concurrent_searches = False
    in_turn = [library.search("alice", q, None, 10, "hybrid") for q in questions]
    assert [[(p.chunk_id, p.score) for p in found] for found in beside] == [
        [(p.chunk_id, p.score) for p in found] for found in in_turn
    ]
    assert all(beside)
    library.close()


def _schema_of(url: str) -> str:
    """The schema of the test's own (postgres_url puts it first in the search path)."""
    options = parse_qs(urlsplit(url).query)["options"][0]
    return options.split("search_path=", 1)[1].split(",", 1)[0]


@pytest.fixture
def proxied_url(postgres_url: str) -> Iterator[tuple[str, TcpProxy]]:
    """The test's database reached over TCP through a proxy the test can take away and give back."""
    folder = parse_qs(urlsplit(postgres_url).query)["host"][0]
    unix_path = next(str(path) for path in Path(folder).glob(".s.PGSQL.*") if path.suffix != ".lock")
    proxy = TcpProxy(unix_path)
    proxy.up()
    yield postgres_url.replace(f"host={folder}", f"host=127.0.0.1&port={proxy.port}"), proxy
    proxy.down()


def test_a_restarted_server_costs_no_call_an_error(postgres_url):
    library = Library(postgres_url)
    ingest(library, "alice", [EXAMPLES])
    with ThreadPoolExecutor(16) as threads:  # the pool grows to its 8 connections
        assert all(threads.map(lambda _: library.search("alice", "reciprocal rank fusion", None, 3), range(200)))
    with psycopg.connect(postgres_url, autocommit=True) as db:
        # what a restart or a failover does to every connection the pool holds
        db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
    for _ in range(3):  # the dead connections are found and replaced before a call uses one
        assert library.search("alice", "reciprocal rank fusion", None, 3)
    library.close()


def test_a_server_that_refuses_more_connections_still_serves_through_those_it_gave(postgres_url):
    library = Library(postgres_url)
    ingest(library, "alice", [EXAMPLES])
    library.close()
    role, schema = f"limited_{uuid.uuid4().hex[:8]}", _schema_of(postgres_url)
    with psycopg.connect(postgres_url, autocommit=True) as db:
        db.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 2")
        for grant in ("SCHEMA", "ALL TABLES IN SCHEMA", "ALL SEQUENCES IN SCHEMA"):
            db.execute(f"GRANT ALL ON {grant} {schema} TO {role}")
    limited = Library(postgres_url.replace("postgres:@", f"{role}:@", 1))
    with ThreadPoolExecutor(8) as threads:  # 8 at once on 2 connections: the others wait their turn
        found = list(threads.map(lambda _: limited.search("alice", "reciprocal rank fusion", None, 3), range(100)))
    assert all(found)
    limited.close()


def test_while_the_server_is_away_calls_fail_at_once_saying_why_and_work_again_when_it_is_back(proxied_url, caplog):
    url, proxy = proxied_url
    library = Library(url)
    ingest(library, "alice", [EXAMPLES])
    assert library.search("alice", "reciprocal rank fusion", None, 3)
    proxy.down()
    refused = r"no connection to the library's PostgreSQL server: .*refused"
    with pytest.raises(LibraryUnavailable, match=refused) as away:
        library.search("alice", "reciprocal rank fusion", None, 3)
    # the cause is the client's; where the database is, only the operator's (the log says it, once)
    assert str(proxy.port) not in str(away.value) and "127.0.0.1" not in str(away.value)
    said = [r.getMessage() for r in caplog.records if r.name == "fedresearch" and "PostgreSQL" in r.getMessage()]
    assert len(said) == 1 and f"port {proxy.port}" in said[0]
    started = time.monotonic()
    for _ in range(20):
        with pytest.raises(LibraryUnavailable, match="no connection to the library"):
            library.search("alice", "reciprocal rank fusion", None, 3)
    with pytest.raises(LibraryUnavailable, match="no connection to the library"):
        library.list_documents("alice")
    # each of them waited 30 s for the pool before; now none waits (a wide margin: all within one wait)
    assert time.monotonic() - started < POOL_WAIT_S
    proxy.up()
    deadline = time.monotonic() + 10
    while True:
        try:
            found = library.search("alice", "reciprocal rank fusion", None, 3)
            break
        except LibraryUnavailable:
            assert time.monotonic() < deadline, "the library did not come back within 10 s of its server"
            time.sleep(0.2)
    assert found and library.list_documents("alice")
    assert any("PostgreSQL server answers again" in record.getMessage() for record in caplog.records)
    library.close()


def test_a_call_queued_for_a_connection_stops_waiting_when_the_server_is_found_gone(postgres_url):
    library = Library(postgres_url)
    store = library.store
    assert isinstance(store, PostgresStore)
    held = [store._pool.getconn() for _ in range(store._pool.max_size)]  # every connection busy
    with ThreadPoolExecutor(1) as thread:
        started = time.monotonic()
        queued = thread.submit(library.list_documents, "alice")
        time.sleep(0.3)
        # what another call records when it finds its connection dead and the server refusing
        store.reachability.lost()
        store.reachability.failed(OSError("Connection refused"))
        with pytest.raises(LibraryUnavailable, match="no connection to the library's PostgreSQL server"):
            queued.result()
        # it waited POOL_WAIT_S (5 s) in the pool's queue before; now it looks every WAIT_SLICE_S
        assert time.monotonic() - started < POOL_WAIT_S / 2
    for connection in held:
        store._pool.putconn(connection)
    library.close()


async def test_a_task_and_the_literature_api_say_the_library_is_unreachable(tmp_path, fakes, start_server, proxied_url):
    url, proxy = proxied_url
    library = await asyncio.to_thread(Library, url)
    await asyncio.to_thread(ingest, library, "alice", [EXAMPLES])
    await asyncio.to_thread(library.close)
    server = await start_server(make_settings(tmp_path, fakes, library_url=url, retry_attempts=0))
    async with aiohttp.ClientSession() as session, session.get(f"{server.url}/healthz") as response:
        assert (await response.json())["library"] == "ok"
    proxy.down()
    task = {"task": "rank fusion", "headers": {"retrievers": "library,tavily", "user_id": "alice"}}
    started = time.monotonic()
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(ws, task)
    # the library's three searches start together: the two queued behind the one that finds the
    # server gone waited POOL_WAIT_S for a connection before (a wide margin: under it, not near 0)
    assert time.monotonic() - started < POOL_WAIT_S - 1
    for name in ("internal_biblio", "internal_highlight", "internal_file"):
        step, metadata = outcome(frames, name)
        assert step == "retriever_failed" and "no connection to the library's PostgreSQL server" in metadata["error"]
    assert str(proxy.port) not in json.dumps(frames)  # where the database is stays in the server's log
    assert outcome(frames, "tavily")[0] == "retriever_done"
    body = {"type": "biblio", "user_id": "alice", "query": "rank fusion"}
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{server.url}/healthz") as response:
            assert response.status == 200  # the process serves; what it depends on is in the body
            health = await response.json()
        assert health["library"].startswith("no connection to the library's PostgreSQL server: ")
        assert str(proxy.port) not in health["library"]  # /healthz is public
        assert health["shared_state"] == "in this process"
        async with session.post(f"{server.url}/internal/biblios/vector_search/", json=body) as response:
            assert response.status == 503 and response.headers["Retry-After"] == "5"
            assert "no connection to the library's PostgreSQL server" in (await response.json())["error"]
        async with session.get(f"{server.url}/api/documents", params={"user_id": "alice"}) as response:
            assert response.status == 503
        upload = aiohttp.FormData()
        upload.add_field("file", b"# Rank fusion\n\nIt sums 1/(60+rank) per list.\n", filename="fusion.md")
        async with session.post(f"{server.url}/api/documents", params={"user_id": "alice"}, data=upload) as response:
            # the file is fine: not "skipped, could not be read" as if it were not
            assert response.status == 503 and "no connection to the library" in (await response.json())["error"]


@pytest.mark.parametrize("command", [["library", "list", "--user", "alice"], ["serve", "--port", "0"]])
def test_a_command_whose_database_is_away_says_so_in_one_line(tmp_path, monkeypatch, capsys, command):
    monkeypatch.setenv("FEDRESEARCH_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("FEDRESEARCH_LIBRARY_URL", "postgresql://alice@127.0.0.1:9/library")  # a closed port
    assert main(command) == 1
    error = capsys.readouterr().err
    assert "fedresearch: no connection to the library's PostgreSQL server: " in error and "Traceback" not in error


async def test_searches_held_up_by_a_lock_end_at_their_deadline_and_hold_up_nothing_else(
    tmp_path, fakes, start_server, postgres_url
):
    library = await asyncio.to_thread(Library, postgres_url)
    await asyncio.to_thread(ingest, library, "alice", [EXAMPLES])
    await asyncio.to_thread(library.close)
    settings = make_settings(tmp_path, fakes, library_url=postgres_url, retriever_timeout_s=2.0, retry_attempts=0)
    server = await start_server(settings)
    # what a migration, a REINDEX or an operator's LOCK TABLE does to every reader of the table
    locker = await asyncio.to_thread(psycopg.connect, postgres_url)
    await asyncio.to_thread(locker.execute, "LOCK TABLE library_passages IN ACCESS EXCLUSIVE MODE")
    task = {"task": "rank fusion", "headers": {"retrievers": "library,tavily", "user_id": "alice"}}

    async def one() -> list[dict]:
        async with websockets.connect(server.ws_url) as ws:
            return await run_task(ws, task)

    async def trip_to_default_threads() -> float:
        await asyncio.sleep(1.0)  # the tasks' searches wait on the lock by now
        started = time.monotonic()
        await asyncio.to_thread(int)
        return time.monotonic() - started

    for _ in range(2):  # 18 library searches: more than the pool has connections
        *tasks, trip = await asyncio.gather(*(one() for _ in range(3)), trip_to_default_threads())
        for frames in tasks:
            assert outcome(frames, "internal_biblio")[0] == "retriever_failed"
            assert outcome(frames, "tavily")[0] == "retriever_done"
        # the threads that resolve host names and read pages are not the library's: none waits
        # for it (searches held every one of them, and a trip took seconds)
        assert trip < 0.5
    body = {"type": "biblio", "user_id": "alice", "query": "rank fusion"}
    async with aiohttp.ClientSession() as session:
        started = time.monotonic()
        async with session.post(f"{server.url}/internal/biblios/vector_search/", json=body) as response:
            # it waited for the lock however long it was held
            assert response.status == 503 and response.headers["Retry-After"] == "5"
            error = (await response.json())["error"]
        assert "cancelled the query: canceling statement due to statement timeout (reads stop after 2 s" in error
        assert time.monotonic() - started < 10
    # and no search the tasks gave up on still holds a connection: each ended at 2 s
    deadline = time.monotonic() + 10
    waiting = 1
    while waiting:
        with psycopg.connect(postgres_url, autocommit=True) as db:
            row = db.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'").fetchone()
        waiting = row[0] if row else 0
        assert time.monotonic() < deadline, f"{waiting} searches still wait on the lock"
        await asyncio.sleep(0.2)
    await asyncio.to_thread(locker.rollback)
    await asyncio.to_thread(locker.close)
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(ws, task)
    assert outcome(frames, "internal_biblio")[0] == "retriever_done"


def _tcp_options(connection: psycopg.Connection) -> dict[str, int]:
    """What the kernel holds for the connection's socket (the fd is borrowed, not closed)."""
    sock = socket.socket(fileno=connection.fileno())
    try:
        return {
            "keepalive": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            "idle": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            "interval": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            "count": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
            "user_timeout_ms": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
        }
    finally:
        sock.detach()


def test_pooled_connections_notice_a_vanished_server_within_half_a_minute_unless_the_url_says_otherwise(proxied_url):
    url, _ = proxied_url
    library = Library(url)
    store = library.store
    assert isinstance(store, PostgresStore)
    with store._pool.connection() as db:
        # the system's own: the first probe after 2 h of silence, and no bound on unacknowledged data
        assert _tcp_options(db) == {"keepalive": 1, "idle": 10, "interval": 5, "count": 3, "user_timeout_ms": 20000}
    library.close()
    own = Library(url + "&keepalives_idle=60&tcp_user_timeout=90000")
    store = own.store
    assert isinstance(store, PostgresStore)
    with store._pool.connection() as db:
        assert _tcp_options(db) == {"keepalive": 1, "idle": 60, "interval": 5, "count": 3, "user_timeout_ms": 90000}
    own.close()


def test_a_read_is_cut_at_its_timeout_while_a_write_waits_its_turn(postgres_url):
    library = Library(postgres_url, read_timeout_s=0.5)
    ingest(library, "alice", [EXAMPLES])
    document = library.list_documents("alice")[0].id
    with psycopg.connect(postgres_url) as locker, ThreadPoolExecutor(1) as thread:
        locker.execute("LOCK TABLE library_passages IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        with pytest.raises(
            LibraryUnavailable, match=r"canceling statement due to statement timeout \(reads stop after 0\.5 s"
        ):
            library.search("alice", "reciprocal rank fusion", None, 3)
        assert time.monotonic() - started < 5
        deleting = thread.submit(library.delete_document, "alice", document)
        time.sleep(1.5)  # three times the read timeout: a write is not cut
        assert not deleting.done()
        locker.rollback()
        assert deleting.result(timeout=10) is True
    assert document not in {info.id for info in library.list_documents("alice")}
    library.close()


_QUESTIONS = ("reciprocal rank fusion", "dense retrieval", "BM25 term weighting", "检索增强")


def test_behind_pgbouncer_in_transaction_mode_threads_search_and_write_without_an_error(pooled_url):
    library = Library(pooled_url, read_timeout_s=10, transaction_pooling=True)
    ingest(library, "alice", [EXAMPLES])
    expected = {question: [p.chunk_id for p in library.search("alice", question, None, 5)] for question in _QUESTIONS}
    assert all(expected.values())

    def search(n: int) -> tuple[str, list[str]]:
        question = _QUESTIONS[n % len(_QUESTIONS)]
        return question, [p.chunk_id for p in library.search("alice", question, None, 5)]

    def write(n: int) -> int:
        document = _document(f"note-{n}.md", f"note {n} on reciprocal rank fusion")
        added, _ = library.store.write("bob", [document])
        return added

    # 8 threads over the pool's 8 connections, which PgBouncer runs on its 2 server connections
    with ThreadPoolExecutor(8) as threads:
        writes = [threads.submit(write, n) for n in range(20)]
        found = list(threads.map(search, range(400)))
    assert all(ids == expected[question] for question, ids in found)
    assert sum(w.result() for w in writes) == 20 and len(library.list_documents("bob")) == 20
    library.close()


def test_behind_pgbouncer_reads_are_cut_at_their_timeout_and_no_server_connection_keeps_it(pooled_url, postgres_server):
    library = Library(pooled_url, read_timeout_s=0.5, transaction_pooling=True)
    ingest(library, "alice", [EXAMPLES])
    database = urlsplit(pooled_url).path.lstrip("/")
    with psycopg.connect(postgres_server, dbname=database) as locker:
        locker.execute("LOCK TABLE library_passages IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        with pytest.raises(LibraryUnavailable, match=r"statement timeout \(reads stop after 0\.5 s"):
            library.search("alice", "reciprocal rank fusion", None, 3)
        assert time.monotonic() - started < 5
    # PgBouncer's server connections are shared with every other client: a session setting made
    # on one of them would bound, or fail to bound, whoever runs there next
    first, second = (psycopg.connect(pooled_url, prepare_threshold=None) for _ in range(2))
    with first, second:  # each inside a transaction: each holds one of the 2 server connections
        assert [db.execute("SHOW statement_timeout").fetchone() for db in (first, second)] == [("0",), ("0",)]
    assert library.search("alice", "reciprocal rank fusion", None, 3)
    library.close()


def test_workers_opening_the_library_at_once_through_pgbouncer_leave_no_lock_behind(pooled_url, postgres_server):
    with ThreadPoolExecutor(4) as threads:
        for library in list(threads.map(lambda _: Library(pooled_url, transaction_pooling=True), range(4))):
            library.close()
    database = urlsplit(pooled_url).path.lstrip("/")
    with psycopg.connect(postgres_server, dbname=database) as db:
        held = db.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone()
    assert held == (0,)
    Library(pooled_url, transaction_pooling=True).close()  # the next start does not wait on a lock


async def test_a_stopped_server_closes_its_library_and_lets_its_model_go(tmp_path, fakes, postgres_url):
    """Its pool's connections end with it (a process embedding the app, or a test session starting
    hundreds, kept them all before), and aiohttp, which keeps every app it served in a middleware
    cache, keeps no model with it: 250 MB a server, which ran the test session out of memory."""
    library = await asyncio.to_thread(Library, postgres_url)
    await asyncio.to_thread(ingest, library, "alice", [EXAMPLES])
    await asyncio.to_thread(library.close)

    def connections() -> int:
        with psycopg.connect(postgres_url, autocommit=True) as db:
            query = "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
            return int(db.execute(query).fetchone()[0]) - 1  # not this one

    before = await asyncio.to_thread(connections)
    settings = make_settings(tmp_path, fakes, library_url=postgres_url)
    app = create_app(settings)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    task = {"task": "rank fusion", "headers": {"retrievers": "library", "user_id": "alice"}}
    async with websockets.connect(f"ws://127.0.0.1:{port}/ws") as ws:
        frames = await run_task(ws, task)
    assert outcome(frames, "internal_biblio")[0] == "retriever_done"
    served = app[RUNTIME].deps.library
    assert served is not None and served.encoder is not None
    assert await asyncio.to_thread(connections) > before
    await runner.cleanup()
    assert await asyncio.to_thread(connections) == before
    assert served.encoder is None


def test_a_lost_prepared_statement_says_which_setting_fixes_it(postgres_url):
    """What the server answers behind PgBouncer without FEDRESEARCH_LIBRARY_TRANSACTION_POOLING:
    a retriever failure that names the setting, not "internal error in the adapter"."""
    library = Library(postgres_url)
    store = library.store
    assert isinstance(store, PostgresStore)
    lost = r'lost a prepared statement: prepared statement "_pg3_9" does not exist; behind a pooler in transaction'
    said = pytest.raises(LibraryUnavailable, match=lost + r" mode \(PgBouncer\), set FEDRESEARCH_LIBRARY_TRANSACTION")
    with said, store._db() as db:
        db.execute("EXECUTE _pg3_9")  # the statement a pooler ran on another server connection
    ingest(library, "alice", [EXAMPLES])  # the connection it happened on serves on
    assert library.search("alice", "reciprocal rank fusion", None, 3)
    library.close()


def test_metadata_written_through_binary_copy_reads_back_and_filters(postgres_url):
    """Authors, tags and extra go into COPY as jsonb and text[] in binary made by hand: they read
    back as written (non-ASCII and empty included) and the author and tag filters match them."""
    library = Library(postgres_url)
    store = library.store
    assert isinstance(store, PostgresStore)
    text = "metadata survives the copy"
    document = StoredDocument(
        "biblio", "m.bib", "h", "Über 検索", ["Zhang Wěi", "O'Brien, Ann"], 2020, "10.1/x", None,
        ["検索", "Retrieval"], {"venue": "SIGIR", "pages": [1, 2]}, [StoredPassage("", 3, 0, text, None)],
        added_at="2026-01-02T03:04:05",
    )  # fmt: skip
    bare = StoredDocument(
        "note", "n.md", "h", "bare", [], None, None, None, [], {}, [StoredPassage("", None, 0, text, None)]
    )
    assert store.write("alice", [document, bare]) == (2, 0)
    found = library.search(
        "alice", "metadata copy", None, 5, "bm25", SearchFilters(authors=("zhang wěi",), tags=("検索",))
    )
    assert [p.title for p in found] == ["Über 検索"]
    row = store.passages("alice", [found[0].chunk_id])[found[0].chunk_id]
    assert json.loads(row["authors"]) == ["Zhang Wěi", "O'Brien, Ann"] and json.loads(row["tags"]) == [
        "検索",
        "Retrieval",
    ]
    assert json.loads(row["extra"]) == {"venue": "SIGIR", "pages": [1, 2]} and row["page"] == 3
    listed = {d.title: d.added_at for d in library.list_documents("alice")}
    assert listed["Über 検索"].startswith("2026-01-02T03:04:05") and set(listed) == {"Über 検索", "bare"}
    assert [
        p.title for p in library.search("alice", "metadata", None, 5, "bm25", SearchFilters(tags=("retrieval",)))
    ] == ["Über 検索"]
    library.close()


def test_a_bulk_load_builds_the_indexes_of_large_users_at_its_end(postgres_url):
    """Into an empty library the HNSW indexes of users past hnsw_from are built in the bulk load's
    transaction; into one that holds passages, after its commit (CONCURRENTLY)."""
    store = PostgresStore(postgres_url, dims=None)
    store.hnsw_from = 50
    vector = np.ones(384, dtype=np.float32).tobytes()

    def documents(prefix: str, count: int) -> list[StoredDocument]:
        return [
            StoredDocument("note", f"{prefix}{i}", "h", f"{prefix}{i}", [], None, None, None, [], {},
                           [StoredPassage("", None, 0, f"passage {prefix} {i}", vector)])
            for i in range(count)
        ]  # fmt: skip

    with store.bulk() as load:
        assert load.empty
        load.write("alice", documents("a", 60))
        load.write("bob", documents("b", 10))
        assert _index_scans(postgres_url) == {}  # nothing before its end
    assert len(_index_scans(postgres_url)) == 1
    with store.bulk() as load:
        assert not load.empty
        load.write("bob", documents("c", 60))
    assert len(_index_scans(postgres_url)) == 2
    store.close()


def test_a_bulk_load_writes_full_blocks_and_its_tails_at_the_end(postgres_url, monkeypatch):
    """A bulk load writes each term's full blocks as it gathers, keeps what is past them for the
    next write (no block written twice in its transaction), and writes the rest at its end; a
    replace in the middle writes all first. The blocks hold exactly the passages' postings."""
    from fedresearch.library import postgres, postgres_bm25

    monkeypatch.setattr(postgres_bm25, "BLOCK", 8)
    monkeypatch.setattr(postgres, "BULK_POSTINGS", 30)
    store = PostgresStore(postgres_url, dims=None)
    store.write("bob", [_document("held.md", "common held")])  # bob holds a block with room
    with store.bulk() as load:
        for start in range(0, 200, 10):
            for user in ("alice", "bob"):
                load.write(user, [_document(f"{start + i}.md", f"common word{(start + i) % 13}") for i in range(10)])
            if start == 100:
                load.write("alice", [_document("5.md", "common replaced")])
    for user in ("alice", "bob"):
        kept, made, totals, recounted = _counts(postgres_url, user)
        assert sorted(kept) == sorted(made) and totals == recounted
    with psycopg.connect(postgres_url) as db:
        sizes = [row[0] for row in db.execute(
            "SELECT postings FROM library_postings WHERE user_id = 'alice' AND term = 'common' ORDER BY low"
        )]  # fmt: skip
    assert sum(sizes) == 200 and max(sizes) == 8 and sizes.count(8) >= len(sizes) - 2
    store.close()


def _vector_documents(prefix: str, vectors: np.ndarray) -> list[StoredDocument]:
    """One passage a document, with its vector; every third document of 2020, the others of 2000."""
    return [
        StoredDocument("note", f"{prefix}{i}", "h", f"{prefix}{i}", [], 2020 if i % 3 == 0 else 2000, None, None, [],
                       {}, [StoredPassage("", None, 0, f"text {prefix} {i}", vector.tobytes())])
        for i, vector in enumerate(vectors)
    ]  # fmt: skip


def _unit(rng: np.random.Generator, count: int) -> np.ndarray:
    vectors = rng.normal(size=(count, 384)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _segments(url: str, user: str) -> tuple[list[int], list[int], list[int]]:
    """The user's segment counts as kept, as counted in the table (by segment), and the segments
    whose HNSW index is there and valid."""
    from fedresearch.library.postgres import _vector_index

    with psycopg.connect(url) as db:
        row = db.execute("SELECT segments FROM library_users WHERE user_id = %s", (user,)).fetchone()
        counted = dict(
            db.execute(
                "SELECT segment, count(*) FROM library_passages WHERE user_id = %s GROUP BY segment", (user,)
            ).fetchall()
        )
        names = {
            name
            for (name,) in db.execute(
                "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                " WHERE i.indrelid = 'library_passages'::regclass AND i.indisvalid"
            ).fetchall()
        }
    kept = list(row[0]) if row else []
    table = [counted.get(segment, 0) for segment in range(max([len(kept) - 1, *counted]) + 1)] if counted else []
    indexed = [segment for segment in range(len(kept) + 1) if _vector_index(user, segment) in names]
    return kept, table, indexed


def _by_index(url: str) -> PostgresStore:
    """A store whose searches go through the HNSW indexes however small the table (no sequential scan)."""
    store = PostgresStore(f"{url}{quote(' -c enable_seqscan=off -c enable_sort=off')}", dims=None)
    store.hnsw_from, store.segment_rows = 5, 300
    return store


def test_a_search_across_segments_finds_the_exact_top_k_and_keeps_filters(postgres_url):
    """A user's passages fill segments of `segment_rows` in turn, written in several writes; each
    segment has its own HNSW index and one search asks them all: the exact top k, filtered or not."""
    rng = np.random.default_rng(3)
    store = PostgresStore(postgres_url, dims=None)
    store.hnsw_from, store.segment_rows = 5, 300
    vectors = _unit(rng, 1000)
    for start in range(0, 1000, 250):
        store.write("alice", _vector_documents(f"s{start}-", vectors[start : start + 250]))
    store.write("bob", _vector_documents("b", vectors[:20]))  # another user's rows: in none of alice's
    assert _segments(postgres_url, "alice") == ([300, 300, 300, 100], [300, 300, 300, 100], [0, 1, 2, 3])
    indexed = _by_index(postgres_url)
    exact = PostgresStore(postgres_url, dims=None)
    exact.hnsw_from = 10**9
    for query in _unit(rng, 5):
        for filters in (SearchFilters(), SearchFilters(year_min=2020)):
            found = indexed.dense("alice", query, None, filters, 20)
            assert len(found) == 20 and found == exact.dense("alice", query, None, filters, 20)
    # each of the 10 searches went through every segment's index, in one statement each; bob's not
    deadline = time.monotonic() + 10  # a backend's statistics reach the others within a second or so
    while sorted(_index_scans(postgres_url).values()) != [0, 10, 10, 10, 10] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sorted(_index_scans(postgres_url).values()) == [0, 10, 10, 10, 10]
    for closing in (indexed, exact, store):
        closing.close()


def test_a_bulk_load_fills_segments_and_builds_each_ones_index(postgres_url):
    rng = np.random.default_rng(4)
    store = PostgresStore(postgres_url, dims=None)
    store.hnsw_from, store.segment_rows = 50, 40
    with store.bulk() as load:
        assert load.empty
        load.write("alice", _vector_documents("a", _unit(rng, 60)))
        load.write("alice", _vector_documents("b", _unit(rng, 30)))
        load.write("bob", _vector_documents("c", _unit(rng, 30)))  # not past hnsw_from: no index
    assert _segments(postgres_url, "alice") == ([40, 40, 10], [40, 40, 10], [0, 1, 2])
    assert _segments(postgres_url, "bob") == ([30], [30], [])
    with store.bulk() as load:  # into a library that holds passages: built after the commit
        load.write("bob", _vector_documents("d", _unit(rng, 30)))
    assert _segments(postgres_url, "bob") == ([40, 20], [40, 20], [0, 1])
    store.close()


def test_a_replace_or_delete_takes_rows_from_their_segments_and_drops_an_emptied_ones_index(postgres_url):
    rng = np.random.default_rng(5)
    store = PostgresStore(postgres_url, dims=None)
    store.hnsw_from, store.segment_rows = 5, 300
    vectors = _unit(rng, 700)
    store.write("alice", _vector_documents("a", vectors))
    assert _segments(postgres_url, "alice") == ([300, 300, 100], [300, 300, 100], [0, 1, 2])
    # a new version of the first 150 (in segment 0): out of it, into the last segment
    store.write("alice", _vector_documents("a", _unit(rng, 150)))
    assert _segments(postgres_url, "alice") == ([150, 300, 250], [150, 300, 250], [0, 1, 2])
    # deleting the rest of segment 0 empties it: its index goes
    ids = {d.source: d.id for d in store.documents("alice")}
    for i in range(150, 300):
        assert store.delete("alice", ids[f"a{i}"])
    assert _segments(postgres_url, "alice") == ([0, 300, 250], [0, 300, 250], [1, 2])
    # replacing all of segment 1 empties it too: the replace's write drops its index, fills the last
    store.write("alice", _vector_documents("a", _unit(rng, 600))[300:])
    kept, table, indexed = _segments(postgres_url, "alice")
    assert kept == table == [0, 0, 300, 250] and indexed == [2, 3]
    indexed_store, exact = _by_index(postgres_url), PostgresStore(postgres_url, dims=None)
    exact.hnsw_from = 10**9
    for query in _unit(rng, 3):
        for filters in (SearchFilters(), SearchFilters(year_max=2000)):
            assert indexed_store.dense("alice", query, None, filters, 15) == exact.dense(
                "alice", query, None, filters, 15
            )
    for closing in (indexed_store, exact, store):
        closing.close()


def test_a_version_3_library_is_cut_into_segments_when_upgraded(postgres_url, monkeypatch):
    """Version 3 kept one HNSW index of each large user's rows: the upgrade cuts the rows into
    segments by id, drops that index and builds one per segment; a small user's rows are segment 0."""
    from fedresearch.library import postgres

    rng = np.random.default_rng(6)
    store = PostgresStore(postgres_url, dims=None)
    store.hnsw_from = 10**9
    store.write("alice", _vector_documents("a", _unit(rng, 100)))
    store.write("bob", _vector_documents("b", _unit(rng, 10)))
    query = _unit(rng, 1)[0]
    exact = store.dense("alice", query, None, SearchFilters(), 10)
    store.close()
    old_index = "library_hnsw_" + postgres._vector_index("alice", None)[13:-1]
    with psycopg.connect(postgres_url, autocommit=True) as db:  # the tables as version 3 left them
        db.execute("ALTER TABLE library_passages DROP COLUMN segment")
        db.execute("ALTER TABLE library_users DROP COLUMN segments")
        db.execute(
            f"CREATE INDEX {old_index} ON library_passages USING hnsw (embedding vector_cosine_ops)"
            " WHERE user_id = 'alice'"
        )
        db.execute("UPDATE library_schema SET version = 3")
    monkeypatch.setattr(postgres, "SEGMENT_ROWS", 40)
    monkeypatch.setattr(postgres, "HNSW_FROM", 50)
    store = PostgresStore(postgres_url, dims=None)
    store.hnsw_from, store.segment_rows = 50, 40
    with psycopg.connect(postgres_url) as db:
        assert db.execute("SELECT version FROM library_schema").fetchone() == (4,)
        assert db.execute("SELECT count(*) FROM pg_class WHERE relname = %s", (old_index,)).fetchone() == (0,)
        ids = [row[0] for row in db.execute("SELECT segment FROM library_passages WHERE user_id = 'alice' ORDER BY id")]
    assert ids == [0] * 40 + [1] * 40 + [2] * 20
    assert _segments(postgres_url, "alice") == ([40, 40, 20], [40, 40, 20], [0, 1, 2])
    assert _segments(postgres_url, "bob") == ([10], [10], [])
    indexed = _by_index(postgres_url)
    indexed.segment_rows = 40
    assert indexed.dense("alice", query, None, SearchFilters(), 10) == exact
    store.write("alice", _vector_documents("c", _unit(rng, 30)))  # the last segment filled, then a new one
    assert _segments(postgres_url, "alice") == ([40, 40, 40, 10], [40, 40, 40, 10], [0, 1, 2, 3])
    indexed.close()
    store.close()
