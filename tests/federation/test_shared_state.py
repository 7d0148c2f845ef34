"""Shared state in a real Redis: two app instances (as two workers, or two hosts) see the same
breakers, answer cache, rate limits and per-key task limits; a killed holder's lease lapses; and a
Redis that dies mid-run is said in the log while tasks go on, each process on its own state."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time

import aiohttp
import pytest
import websockets
from pydantic import SecretStr, ValidationError
from redis.asyncio import Redis

from fedresearch.core.models import SearchResult
from fedresearch.core.redis import (
    Leases,
    SentinelAddress,
    SharedDown,
    SharedRedis,
    cancelled,
    connect,
    failures,
    where,
)
from fedresearch.core.settings import Settings
from fedresearch.federation.answer_cache import RedisAnswerCache
from fedresearch.federation.contract import Hits, SearchOptions
from fedresearch.federation.ratelimit import Rate, RedisRateLimiter
from fedresearch.federation.runner import Deps, search_one
from fedresearch.web.keys import RUNTIME
from tests.conftest import error_of, logs, make_settings, registry_of, run_task
from tests.fakes import scholarly_settings, start_scholarly
from tests.federation.test_faults import outcome
from tests.redis_cluster import RedisTarget, start_redis_cluster
from tests.redis_sentinel import start_redis_sentinel
from tests.redis_server import start_redis
from tests.tcp_proxy import TcpProxy

LIMITS = {"retriever_timeout_s": 1.5, "retry_attempts": 0}


async def two_servers(tmp_path, fakes, start_server, redis_target, **overrides):
    """Two app instances sharing one Redis (or cluster), each with its own data folder (as on two hosts)."""
    servers = []
    for name in ("a", "b"):
        settings = make_settings(tmp_path / name, fakes, **redis_target.settings(), **{**LIMITS, **overrides})
        servers.append(await start_server(settings))
    return servers


async def ask(server, question, retrievers="tavily,google", token=None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with websockets.connect(server.ws_url, additional_headers=headers) as ws:
        return await run_task(ws, {"task": question, "headers": {"retrievers": retrievers}})


async def test_a_breaker_opened_on_one_instance_holds_on_the_other(tmp_path, fakes, start_server, redis_target):
    first, second = await two_servers(tmp_path, fakes, start_server, redis_target)
    fakes["tavily"].behaviour.mode = "401"
    step, metadata = outcome(await ask(first, "rank fusion"), "tavily")
    assert step == "retriever_failed" and "401" in metadata["error"]
    step, metadata = outcome(await ask(second, "another question"), "tavily")
    assert step == "retriever_skipped" and "suspended for another" in metadata["error"]
    assert len(fakes["tavily"].requests) == 1  # the second instance sent nothing
    assert outcome(await ask(second, "another question"), "google")[0] == "retriever_done"


async def test_errors_counted_across_instances_open_the_breaker(tmp_path, fakes, start_server, redis_target):
    servers = await two_servers(tmp_path, fakes, start_server, redis_target, breaker_error_threshold=3)
    fakes["tavily"].behaviour.mode = "500"
    for number in range(3):  # a, b, a: three failures in a row, though no instance saw three
        step, _ = outcome(await ask(servers[number % 2], f"question {number}"), "tavily")
        assert step == "retriever_failed"
    step, metadata = outcome(await ask(servers[1], "question 4"), "tavily")
    assert step == "retriever_skipped" and "suspended 30 s" in metadata["error"]


async def test_one_users_errors_suspend_the_upstream_for_that_user_alone_on_every_instance(
    tmp_path, fakes, start_server, redis_target
):
    keys = "alice-key:alice,bob-key:bob,carol-key:carol"
    servers = await two_servers(tmp_path, fakes, start_server, redis_target, breaker_error_threshold=2, api_keys=keys)
    fakes["tavily"].behaviour.failing_queries = ("poison",)
    for number in range(2):  # one on each instance: alice's run of two errors
        assert outcome(await ask(servers[number], f"poison {number}", "tavily", "alice-key"), "tavily")[0] == (
            "retriever_failed"
        )
    step, metadata = outcome(await ask(servers[0], "rank fusion", "tavily", "alice-key"), "tavily")
    assert step == "retriever_skipped" and "suspended" in metadata["error"]
    assert outcome(await ask(servers[1], "rank fusion", "tavily", "bob-key"), "tavily")[0] == "retriever_done"
    fakes["tavily"].behaviour.mode = "500"
    for server, token in ((servers[0], "bob-key"), (servers[1], "carol-key")):
        assert outcome(await ask(server, "fusion", "tavily", token), "tavily")[0] == "retriever_failed"
    step, metadata = outcome(await ask(servers[0], "fusion", "tavily", "alice-key"), "tavily")
    assert step == "retriever_skipped"
    assert outcome(await ask(servers[1], "fusion", "tavily", "bob-key"), "tavily")[0] == "retriever_skipped"


async def test_an_answer_cached_by_one_instance_serves_the_other(tmp_path, fakes, start_server, redis_target):
    first, second = await two_servers(tmp_path, fakes, start_server, redis_target)
    step, metadata = outcome(await ask(first, "Rank Fusion"), "tavily")
    assert step == "retriever_done" and not metadata["cached"]
    step, metadata = outcome(await ask(second, "rank   fusion"), "tavily")
    assert step == "retriever_done" and metadata["cached"] and metadata["count"] > 0
    assert len(fakes["tavily"].requests) == 1


def _answer(number: int) -> Hits:
    result = SearchResult(href=f"https://example.org/{number}", body=f"answer {number}", retriever="tavily", rank=1)
    return Hits(results=[result], warnings=[])


async def test_answers_stored_in_one_turn_are_read_back_here_at_once_and_by_another_worker(redis_target):
    mine, theirs = redis_target.shared(), redis_target.shared()
    try:
        here, there = RedisAnswerCache(mine, 60), RedisAnswerCache(theirs, 60)
        keys = [("tavily", "key", f"question {number}") for number in range(3)]
        await asyncio.gather(*(here.put(key, _answer(number)) for number, key in enumerate(keys)))
        assert [(await here.get(key)).results[0].body for key in keys] == ["answer 0", "answer 1", "answer 2"]
        for _ in range(100):  # on their way to Redis in the next turn: another worker reads them there
            if await there.get(keys[2]) is not None:
                break
            await asyncio.sleep(0.01)
        asked = [keys[0], keys[1], keys[0], ("tavily", "key", "never asked"), keys[2]]
        found = await asyncio.gather(*(there.get(key) for key in asked))
        assert [None if hits is None else hits.results[0].body for hits in found] == [
            "answer 0",
            "answer 1",
            "answer 0",
            None,
            "answer 2",
        ]
    finally:
        await mine.close()
        await theirs.close()


async def test_lookups_asked_in_one_turn_go_to_redis_together(redis_url):
    shared, watching = SharedRedis(connect(redis_url), redis_url), Redis.from_url(redis_url)
    try:
        cache = RedisAnswerCache(shared, 60)
        await asyncio.gather(*(cache.put(("tavily", "key", f"question {n}"), _answer(n)) for n in range(8)))
        await asyncio.sleep(0.1)
        await watching.config_resetstat()
        found = await asyncio.gather(*(cache.get(("tavily", "key", f"question {n}")) for n in range(8)))
        assert [hits.results[0].body for hits in found if hits is not None] == [f"answer {n}" for n in range(8)]
        assert (await watching.info("commandstats"))["cmdstat_get"]["calls"] == 8
        # one pipeline on one connection; before, each lookup took a connection of its own: 8
        clients = [c for c in await watching.client_list() if c["cmd"] not in ("client|list", "client")]
        assert len(clients) == 1
    finally:
        await shared.close()
        await watching.aclose()


async def test_two_processes_together_keep_to_the_upstreams_rate(tmp_path, redis_target):
    upstreams = await start_scholarly()
    try:
        settings = make_settings(
            tmp_path, **scholarly_settings(upstreams), brave_requests_per_s=20, retriever_timeout_s=30, retry_attempts=0
        )
        adapter = registry_of(settings)["brave"]
        options = SearchOptions(query="dense passage retrieval", max_results=3)

        async def one_process() -> list[object]:
            shared = redis_target.shared()
            limiter = RedisRateLimiter(shared, Leases(shared.client))
            async with aiohttp.ClientSession() as session:
                deps = Deps(session, settings, limiter=limiter)
                try:
                    return await asyncio.gather(*(search_one(adapter, options, deps) for _ in range(25)))
                finally:
                    await shared.close()

        await asyncio.gather(one_process(), one_process())
        arrivals = [entry["at"] for entry in upstreams["brave"].requests]
        # 50 requests at 20/s from two meters that are one: spread over ~2.45 s (two meters that were
        # not one would send all 50 in 1.25 s, 40 in a second). The fake, both clients and their Redis
        # connections share this test's one loop: a pause of it (seen in full runs, not alone) bunched
        # the requests granted meanwhile, 26 arriving within one second; the window allows that much
        assert len(arrivals) == 50 and max(arrivals) - min(arrivals) >= 2.2
        assert upstreams["brave"].per_second() <= 27
    finally:
        for fake in upstreams.values():
            await fake.stop()


async def test_a_keys_task_limit_holds_across_instances(tmp_path, fakes, start_server, redis_target):
    keys = {"api_keys": SecretStr("team-key:alice"), "max_tasks_per_key": 1, "retriever_timeout_s": 10}
    first, second = await two_servers(tmp_path, fakes, start_server, redis_target, **keys)
    fakes["tavily"].behaviour.delay_s = 1.5
    task = {"task": "slow question", "headers": {"retrievers": "tavily"}}
    async with websockets.connect(first.ws_url, additional_headers={"Authorization": "Bearer team-key"}) as ws:
        await ws.send("start " + json.dumps(task))
        assert json.loads(await ws.recv())["content"] == "starting_research"  # its slot is taken
        refused = await ask(second, "second question", "tavily", token="team-key")
        assert "1 tasks are already running for this API key (MAX_TASKS_PER_KEY=1)" in error_of(refused)["output"]
        while json.loads(await ws.recv())["type"] != "path":
            pass
    # the place is free in Redis before the path frame goes out: the next task, on any worker, may start on it
    assert outcome(await ask(second, "third question", "tavily", token="team-key"), "tavily")[0] == "retriever_done"
    for _ in range(200):  # the third task, too, ends a moment after its path frame
        if not first.app[RUNTIME].running and not second.app[RUNTIME].running:
            break
        await asyncio.sleep(0.05)
    assert not first.app[RUNTIME].running and not second.app[RUNTIME].running


HOLDER = """
import asyncio, sys
from fedresearch.core.redis import Leases, connect

async def hold():
    leases = Leases(connect(sys.argv[1]), lease_s=1.0)
    token, _ = await leases.take("tasks:held", 1)
    print("held" if token else "refused", flush=True)
    await asyncio.sleep(3600)

asyncio.run(hold())
"""


async def test_a_killed_holders_lease_lapses(redis_url):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, redis_url], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
        leases = Leases(connect(redis_url), lease_s=1.0)
        await asyncio.sleep(1.5)  # the living holder renews its lease past its first second
        token, held = await leases.take("tasks:held", 1)
        assert token is None and held == 1
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        started = time.monotonic()
        while (await leases.take("tasks:held", 1))[0] is None:
            assert time.monotonic() - started < 10, "a dead holder's lease never lapsed"
            await asyncio.sleep(0.1)
        renewing = leases._renewing
        await leases.close()
        assert renewing is not None and renewing.done()  # stopped before the client closes, not after
        await leases.redis.aclose()
    finally:
        holder.kill()
        holder.wait(10)


async def test_a_loop_writing_to_redis_stops_when_cancelled_mid_write(redis_url):
    """A lease's renewal cancelled as a write to Redis ends: on Python 3.11 redis-py's
    `asyncio.wait_for` loses the cancellation (CPython gh-86296), the loop renewed for ever and
    closing its store waited for ever (a dead worker's lease never lapsed in a test). Each of
    these rounds lost one one time in two before."""
    client = connect(redis_url)
    try:
        for round_ in range(30):

            async def renewing() -> None:
                while True:
                    await asyncio.sleep(0)
                    with contextlib.suppress(*failures()):
                        await client.set("fedresearch:runner:x", b"1", px=500)

            loop = asyncio.create_task(renewing())
            await asyncio.sleep(random.random() * 0.002)
            assert await _stopped_by_cancelled(loop), f"round {round_}: the loop went on after it was cancelled"
    finally:
        await client.aclose()


async def test_a_task_cancelled_as_its_redis_command_ends_stops_there(redis_url):
    """A job cancelled (its socket closed, it was deleted, its deadline passed) as one of its
    commands to Redis answered went on to its end before: the cancellation was lost in redis-py's
    `asyncio.wait_for` (Python 3.11). Each command through `SharedRedis` now ends in it."""
    shared = SharedRedis(connect(redis_url), redis_url)
    try:
        for round_ in range(30):

            async def job() -> None:
                while True:
                    with contextlib.suppress(SharedDown):
                        await shared.attempt("a job's write", lambda: shared.client.set("k", b"1", px=500))

            running = asyncio.create_task(job())
            await asyncio.sleep(random.random() * 0.002)
            running.cancel()  # once, as a socket's close does
            await asyncio.wait({running}, timeout=5)
            stopped = running.done()
            await _stopped_by_cancelled(running)  # so that a failing round fails rather than hangs
            assert stopped and running.cancelled(), f"round {round_}: the job went on after it was cancelled"
        assert shared.trouble is None  # a cancelled write is not Redis failing
    finally:
        await shared.close()


async def test_a_loop_that_lost_its_cancellation_is_cancelled_again() -> None:
    lost = []

    async def losing_once() -> None:
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if lost:
                    raise
                lost.append(True)  # as `wait_for` does on 3.11 when what it waited on ended

    loop = asyncio.create_task(losing_once())
    await asyncio.sleep(0)
    assert await _stopped_by_cancelled(loop, None)
    assert lost


async def _stopped_by_cancelled(*tasks: asyncio.Task[None] | None) -> bool:
    """Whether `cancelled` stopped the loops within seconds (those it could not are stopped
    after, here, so that a failing test fails rather than hangs)."""
    stopping = asyncio.ensure_future(cancelled(*tasks))
    await asyncio.wait({stopping}, timeout=5)
    stopped = stopping.done()
    running = [task for task in tasks if task is not None and not task.done()]
    while running:
        for task in running:
            task.cancel()
        _, pending = await asyncio.wait(running, timeout=0.1)
        running = list(pending)
    await stopping
    return stopped and all(task is None or task.cancelled() for task in tasks)


async def test_leases_given_back_in_one_turn_leave_redis_together(redis_url):
    leases, watching = Leases(connect(redis_url)), Redis.from_url(redis_url)
    try:
        tokens = [(await leases.take(f"tasks:key {n % 2}", 10))[0] for n in range(6)]
        assert all(tokens) and await watching.zcard("fedresearch:tasks:key 0") == 3
        for number, token in enumerate(tokens):  # as six tasks ending in one turn do
            assert token is not None
            leases.release(f"tasks:key {number % 2}", token)
        await asyncio.wait(leases._releasing)
        assert await watching.zcard("fedresearch:tasks:key 0") == await watching.zcard("fedresearch:tasks:key 1") == 0
        # one pipeline on the connection the takes used; before, a connection for each release: 6
        clients = [c for c in await watching.client_list() if c["cmd"] not in ("client|list", "client")]
        assert len(clients) == 1
        await leases.close()
    finally:
        await leases.redis.aclose()
        await watching.aclose()


async def test_tasks_go_on_when_redis_dies_mid_run(tmp_path, fakes, start_server, caplog):
    server_of_redis = start_redis()
    try:
        settings = make_settings(tmp_path, fakes, redis_url=SecretStr(server_of_redis.url), **LIMITS)
        server = await start_server(settings)
        assert outcome(await ask(server, "before"), "tavily")[0] == "retriever_done"
        assert (await health(server))["shared_state"] == "Redis"
        server_of_redis.stop()
        with caplog.at_level(logging.WARNING, logger="fedresearch"):
            started = time.monotonic()
            frames = await ask(server, "after")
            assert time.monotonic() - started < 5
        assert frames[-1]["type"] == "path" and outcome(frames, "tavily")[0] == "retriever_done"
        assert not logs(frames, "error")
        said = [r.getMessage() for r in caplog.records if "Redis at unix://" in r.getMessage()]
        assert said and "each process uses its own state" in said[0] and len(said) == 1  # once per outage
        down = (await health(server))["shared_state"]
        assert down == "Redis does not answer: each process uses its own state"  # /healthz is public: no address
    finally:
        server_of_redis.stop()


async def test_a_process_with_nothing_to_ask_learns_that_redis_answers_again(redis_url, caplog) -> None:
    """Once Redis failed, `/healthz` and the log said so for as long as the process sent no command
    of its own (an idle worker: a minute and more); it now asks a PING once a rest meanwhile."""
    path = TcpProxy(redis_url.removeprefix("unix://"))
    path.up()
    path.down()  # its port kept, refusing
    shared = SharedRedis(connect(f"redis://127.0.0.1:{path.port}"), "the proxy")
    try:
        with pytest.raises(SharedDown):
            await shared.attempt("reading", lambda: shared.client.get("k"))
        assert shared.trouble is not None
        path.up()
        with caplog.at_level(logging.WARNING, logger="fedresearch"):
            for _ in range(100):  # nothing asked of it meanwhile
                if shared.trouble is None:
                    break
                await asyncio.sleep(0.1)
        assert shared.trouble is None
        assert any("answers again" in record.getMessage() for record in caplog.records)
    finally:
        path.down()
        await shared.close()


async def test_a_cluster_taken_for_a_single_redis_says_which_setting_is_missing(
    tmp_path, fakes, start_server, redis_cluster, caplog
):
    """Given one node of a cluster without FEDRESEARCH_REDIS_CLUSTER, the keys of other nodes'
    slots answer MOVED and a job's script CROSSSLOT: the tasks go on, each process on its own state,
    and the log says what to set."""
    redis_cluster.flush()
    settings = make_settings(tmp_path, fakes, redis_url=SecretStr(redis_cluster.url), **LIMITS)
    server = await start_server(settings)
    with caplog.at_level(logging.WARNING, logger="fedresearch"):
        frames = await ask(server, "reciprocal rank fusion")
    assert frames[-1]["type"] == "path" and outcome(frames, "tavily")[0] == "retriever_done"
    said = [record.getMessage() for record in caplog.records if "Redis at redis://" in record.getMessage()]
    assert said and "this Redis is a cluster: set FEDRESEARCH_REDIS_CLUSTER=true" in said[0]


async def health(server) -> dict:
    async with aiohttp.ClientSession() as session, session.get(server.url + "/healthz") as response:
        assert response.status == 200  # the process serves: a dependency's trouble is in the body
        return await response.json()


def limiter_of(redis_target: RedisTarget) -> RedisRateLimiter:
    shared = redis_target.shared()
    return RedisRateLimiter(shared, Leases(shared.client))


async def test_a_429_seen_by_one_process_pauses_the_upstream_for_the_other(redis_target):
    first, second, rate = limiter_of(redis_target), limiter_of(redis_target), Rate(100)
    async with first.slot("upstream", rate):
        pass
    assert first.observe("upstream", 429, {"Retry-After": "1"}) == 1.0
    await asyncio.sleep(0.1)  # the pause travels to Redis in the background
    started = time.monotonic()
    async with second.slot("upstream", rate):
        waited = time.monotonic() - started
    assert waited >= 0.6  # the rest of the second-long pause, though this process saw no 429


async def test_a_connection_cap_holds_across_processes(redis_target):
    first, second, rate = limiter_of(redis_target), limiter_of(redis_target), Rate(1000, connections=1)
    order: list[str] = []

    async def hold(limiter: RedisRateLimiter, name: str) -> None:
        async with limiter.slot("capped", rate):
            order.append(f"{name} in")
            await asyncio.sleep(0.3)
            order.append(f"{name} out")

    await asyncio.gather(hold(first, "a"), hold(second, "b"))
    assert order in (["a in", "a out", "b in", "b out"], ["b in", "b out", "a in", "a out"])


async def test_the_next_task_starts_though_the_last_ones_lease_reaches_redis_after_its_path(
    tmp_path, fakes, start_server, redis_target, monkeypatch
):
    """What a worker whose Redis pool had no idle connection does: its removal of the finished
    task's lease connects first, and reaches Redis after the client has its `path` frame."""
    removal = Leases._remove_given_back

    async def late_removal(self):
        await asyncio.sleep(0.1)
        await removal(self)

    monkeypatch.setattr(Leases, "_remove_given_back", late_removal)
    keys = {"api_keys": SecretStr("team-key:alice"), "max_tasks_per_key": 1}
    first, second = await two_servers(tmp_path, fakes, start_server, redis_target, **keys)
    for number in range(3):  # as GPT-Researcher's clients do: the next task the moment `path` arrives
        frames = await ask(first if number % 2 else second, f"question {number}", "tavily", token="team-key")
        assert outcome(frames, "tavily")[0] == "retriever_done", error_of(frames)


async def test_a_cluster_clients_first_commands_sent_at_once_all_reach_their_slots(redis_cluster):
    """A cluster client learns the slots on its first command; dozens of tasks sending theirs at
    once, before it knew them, had some fail and kept failing ("Connection closed by server")."""
    redis_cluster.flush()
    for _ in range(2):  # two fresh clients
        shared = RedisTarget(redis_cluster.url, cluster=True).shared()
        try:
            for _ in range(3):
                await asyncio.gather(*(_paced_read(shared, number) for number in range(60)))
            assert shared.trouble is None  # no command failed over to this process's own state
        finally:
            await shared.close()


async def test_a_cluster_node_killed_and_back_the_shared_state_is_used_again():
    """With one primary gone its slots have no answer: those commands fall back to the process's
    own state, and once the node is back every command reaches its slot again."""
    cluster, now = start_redis_cluster(), [0.0]
    shared = SharedRedis(connect(cluster.url, cluster=True), cluster.url, clock=lambda: now[0])
    try:

        async def writes() -> int:
            """Of 60 writes at once, those that failed over to this process's own state."""
            outcomes = await asyncio.gather(
                *(shared.attempt("a write", lambda n=n: shared.client.set(f"probe:{n}", n)) for n in range(60)),
                return_exceptions=True,
            )
            return sum(isinstance(outcome, SharedDown) for outcome in outcomes)

        assert await writes() == 0
        cluster.kill(1)
        assert await writes() > 0  # those whose slots were the killed node's, and any sent in its rest after
        cluster.restart(1)
        now[0] += 10  # past the rest after a failure
        assert [await writes() for _ in range(3)] == [0, 0, 0] and shared.trouble is None
    finally:
        await shared.close()
        cluster.stop()


def test_a_sentinel_url_is_checked_at_start_and_logged_without_its_password():
    with pytest.raises(ValidationError, match=r"redis\+sentinel://\[:password@\]host:26379") as refused:
        Settings(redis_url=SecretStr("redis+sentinel://:hunter2@sentinel-a:26379"))  # no master named
    assert "hunter2" not in str(refused.value)
    with pytest.raises(ValidationError, match="exclude each other"):
        Settings(redis_url=SecretStr("redis+sentinel://sentinel-a/fedmaster"), redis_cluster=True)
    url = "redis+sentinel://:hunter2@sentinel-a,[::1]:26380,[::2]/fedmaster/3?sentinel_password=s3cret"
    assert where(url) == "redis+sentinel://sentinel-a:26379,::1:26380,::2:26379/fedmaster/3"
    address = SentinelAddress.parse(url)
    assert address.sentinels == (("sentinel-a", 26379), ("::1", 26380), ("::2", 26379))
    assert address.master == "fedmaster"
    assert (address.db, address.password, address.sentinel_password) == (3, "hunter2", "s3cret")


async def test_after_a_sentinel_failover_the_shared_state_follows_the_new_master():
    """The master dies and the sentinel promotes its replica: commands fail while it has none (the
    process keeps its own state meanwhile), and after the rest every command goes to the new
    master, asked of the sentinel, which has what was written before."""
    setup, now = start_redis_sentinel(), [0.0]
    shared = SharedRedis(connect(setup.url), setup.url, clock=lambda: now[0])
    try:

        async def writes(tag: str) -> int:
            """Of 60 writes at once, those that failed over to this process's own state."""
            outcomes = await asyncio.gather(
                *(shared.attempt("a write", lambda n=n: shared.client.set(f"{tag}:{n}", n)) for n in range(60)),
                return_exceptions=True,
            )
            return sum(isinstance(outcome, SharedDown) for outcome in outcomes)

        assert await writes("before") == 0
        await shared.client.execute_command("WAIT", 1, 2000)  # the replica has them
        promoted = setup.kill_master()
        assert await writes("during") > 0  # to the dead master's connections
        for _ in range(3):
            now[0] += 10  # past the rest after a failure
            if await writes("after") == 0:
                break
        assert await writes("after") == 0 and shared.trouble is None
        assert int(await shared.client.get("before:59")) == 59
        assert shared.client.connection_pool.master_address[1] == promoted  # type: ignore[attr-defined]
    finally:
        await shared.close()
        setup.stop()


async def _paced_read(shared: SharedRedis, number: int) -> None:
    limiter = RedisRateLimiter(shared, Leases(shared.client))
    async with limiter.slot(f"upstream {number % 7}", Rate(1000)):
        await shared.attempt("a read", lambda: shared.client.get(f"fedresearch:probe:{number}"))
