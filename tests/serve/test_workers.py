"""`fedresearch serve --workers 2`: one port, two processes; a worker killed with SIGKILL is replaced
while the other's task completes; SIGTERM stops them all gracefully, a running task finishing first."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import aiohttp
import pytest
import websockets
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from fedresearch.cli import parser
from fedresearch.core.metrics import MULTIPROCESS_DIR
from fedresearch.core.settings import Settings
from tests.conftest import run_task
from tests.fakes.tavily import FakeTavily
from tests.serve.test_shutdown import until_closed

STARTUP_S = 90  # two fresh interpreters on a loaded 2-core machine


class Supervised:
    """`fedresearch serve --workers 2 --port 0` in its own folder; its log collected as it comes."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        command = [sys.executable, "-m", "fedresearch", "serve", "--workers", "2", "--port", "0"]
        self.process = subprocess.Popen(command, cwd=folder, env=env, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        threading.Thread(target=self._collect, daemon=True).start()

    def _collect(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)

    async def url(self) -> str:
        """Where the workers listen, once the supervisor has said its port."""
        port = int((await self.logged(r"2 workers on http://127\.0\.0\.1:(\d+)"))[0].group(1))
        return f"http://127.0.0.1:{port}"

    async def logged(self, pattern: str, times: int = 1) -> list[re.Match[str]]:
        """The first `times` log lines matching `pattern`, once that many have come."""
        started = time.monotonic()
        while time.monotonic() - started < STARTUP_S:
            found = [match for line in list(self.lines) if (match := re.search(pattern, line))]
            if len(found) >= times:
                return found[:times]
            await asyncio.sleep(0.05)
        raise AssertionError(f"never logged {pattern!r} {times} times:\n{''.join(self.lines)}")


async def pids_answering(url: str, wanted: int) -> set[int]:
    """The pids behind /healthz, asked on fresh connections until `wanted` distinct ones answered."""
    seen: set[int] = set()
    started = time.monotonic()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        while len(seen) < wanted:
            assert time.monotonic() - started < STARTUP_S, f"only {seen} answered"
            try:
                async with session.get(url + "/healthz") as response:
                    seen.add((await response.json())["pid"])
            except aiohttp.ClientError:
                await asyncio.sleep(0.2)
    return seen


def owner(client_port: int, pids: set[int]) -> int | None:
    """Which of `pids` holds the server end of the connection from `client_port` (/proc, Linux)."""
    inodes: dict[int, int] = {}
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except FileNotFoundError:  # closed meanwhile
                continue
            if link.startswith("socket:["):
                inodes[int(link[8:-1])] = pid
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[2].split(":")[1], 16) == client_port and int(fields[9]) in inodes:
            return inodes[int(fields[9])]
    return None


async def socket_on_each(ws_url: str, pids: set[int]) -> dict[int, websockets.ClientConnection]:
    """An open WebSocket to each worker (the kernel picks the worker: connect until both are held)."""
    held: dict[int, websockets.ClientConnection] = {}
    for _ in range(60):
        ws = await websockets.connect(ws_url)
        pid = owner(ws.local_address[1], pids)
        if pid is not None and pid not in held:
            held[pid] = ws
            if len(held) == len(pids):
                return held
        else:
            await ws.close()
    raise AssertionError(f"60 connections never reached every worker: {set(held)} of {pids}")


def supervised_env(tmp_path: Path, redis_url: str, tavily: FakeTavily) -> dict[str, str]:
    return {
        **os.environ,
        "FEDRESEARCH_DATA_DIR": str(tmp_path / "data"),
        "FEDRESEARCH_REDIS_URL": redis_url,
        "FEDRESEARCH_API_KEYS": "",
        "FEDRESEARCH_EMBEDDINGS": "false",
        "TAVILY_API_KEY": FakeTavily.api_key,
        "TAVILY_API_BASE_URL": tavily.url,
        "RETRIEVER_TIMEOUT_S": "20",
        "FETCH_PAGES": "false",
    }


async def finish(ws: websockets.ClientConnection) -> str:
    """How the task on `ws` ends: `path` (its report came) or `closed`."""
    try:
        async for raw in ws:
            if json.loads(raw).get("type") == "path":
                return "path"
    except websockets.ConnectionClosed:
        pass
    return "closed"


async def test_a_reload_reads_the_limits_again_for_the_workers_it_starts(tmp_path, redis_url):
    """A reload's workers read `.env` again, and so does the supervisor: after TASK_TIMEOUT_S was
    raised (1 s to 60 s here), a task of 35 s on a new worker retired by the next reload finishes.
    The supervisor killed it after the limit it had read at its start (1 s of tasks, 15 s to close)."""
    (tmp_path / ".env").write_text("TASK_TIMEOUT_S=1\nSHUTDOWN_GRACE_S=1\n")
    tavily = await FakeTavily().start()
    tavily.behaviour.delay_s = 35.0
    server = Supervised(tmp_path, {**supervised_env(tmp_path, redis_url, tavily), "RETRIEVER_TIMEOUT_S": "45"})
    try:
        url = await server.url()
        await pids_answering(url, 2)
        (tmp_path / ".env").write_text("TASK_TIMEOUT_S=60\nSHUTDOWN_GRACE_S=1\n")
        server.process.send_signal(signal.SIGHUP)
        replaced = await server.logged(r"replaced: pid (\d+) listens", times=2)
        # a connection made just then may still reach a retired worker, which closes it (1001), and
        # the task it carried never starts: the task goes to a worker the reload started
        sockets = await socket_on_each(url.replace("http", "ws") + "/ws", {int(m.group(1)) for m in replaced})
        ws, other = sockets.values()
        await other.close()
        async with ws:
            await ws.send("start " + json.dumps({"task": "a long one", "headers": {"retrievers": "tavily"}}))
            await tavily.asked()
            server.process.send_signal(signal.SIGHUP)
            async with asyncio.timeout(STARTUP_S):  # the task's 35 s, then its report
                assert await finish(ws) == "path"
        server.process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(server.process.wait, 60) == 0
        assert not [line for line in server.lines if "killed" in line], "".join(server.lines)  # nor at exit
    finally:
        if server.process.poll() is None:
            server.process.kill()
        await tavily.stop()


async def test_a_stop_during_a_reload_gives_retiring_workers_the_shutdown_grace(tmp_path, redis_url):
    """A worker retired by a reload lets its task run on to its end; the whole service stopped
    meanwhile (SIGTERM), the task gets SHUTDOWN_GRACE_S from then, as on every worker, so that an
    orchestrator's grace still holds: its client is told, and the supervisor exits."""
    tavily = await FakeTavily().start()
    tavily.behaviour.delay_s = 50.0
    env = {**supervised_env(tmp_path, redis_url, tavily), "SHUTDOWN_GRACE_S": "1", "RETRIEVER_TIMEOUT_S": "55"}
    server = Supervised(tmp_path, env)
    try:
        url = await server.url()
        await pids_answering(url, 2)
        async with websockets.connect(url.replace("http", "ws") + "/ws") as ws:
            await ws.send("start " + json.dumps({"task": "a long one", "headers": {"retrievers": "tavily"}}))
            await tavily.asked()
            server.process.send_signal(signal.SIGHUP)
            await server.logged(r"replaced: pid \d+ listens, pid \d+ retires", times=2)
            await asyncio.sleep(2.0)  # past the grace: the retiring worker's task goes on
            assert not tavily.cancelled
            server.process.send_signal(signal.SIGTERM)
            stopped = time.monotonic()
            frames, code = await until_closed(ws)
        assert code == 1001
        assert any(f.get("type") == "error" and "shutting down" in f["output"] for f in frames), frames
        assert await asyncio.to_thread(server.process.wait, 60) == 0
        assert time.monotonic() - stopped < 20
        await server.logged(r"SIGTERM while retiring: the running tasks may finish for 1 s at most")
    finally:
        if server.process.poll() is None:
            server.process.kill()
        await tavily.stop()


async def test_two_workers_share_the_port_and_survive_a_sigkill(tmp_path, redis_url):
    tavily = await FakeTavily().start()
    tavily.behaviour.delay_s = 2.0
    server = Supervised(tmp_path, supervised_env(tmp_path, redis_url, tavily))
    try:
        url = await server.url()
        pids = await pids_answering(url, 2)
        assert server.process.pid not in pids
        sockets = await socket_on_each(url.replace("http", "ws") + "/ws", pids)
        task = {"task": "rank fusion", "headers": {"retrievers": "tavily"}}
        for ws in sockets.values():
            await ws.send("start " + json.dumps(task))
        jobs = {pid: json.loads(await ws.recv())["metadata"]["research_id"] for pid, ws in sockets.items()}
        victim, survivor = sorted(pids)
        ends = {pid: asyncio.create_task(finish(ws)) for pid, ws in sockets.items()}
        await asyncio.sleep(0.5)
        os.kill(victim, signal.SIGKILL)
        assert await ends[survivor] == "path"  # the other worker's task completes
        # the replacement's gauges count from its start, before it settles: scraped once it answers
        await server.logged(r"worker \d started \(pid \d+\)", times=3)
        await pids_answering(url, 2)
        await assert_collector_settled(url)
        assert await ends[victim] == "closed"
        # the killed worker's job, resumed on any worker, ends failed: its process is gone (on this
        # machine a worker need not wait for its lease, 20 s, to lapse)
        async with websockets.connect(url.replace("http", "ws") + "/ws") as ws:
            await ws.send("resume " + json.dumps({"research_id": jobs[victim]}))
            frames = [json.loads(await asyncio.wait_for(ws.recv(), 10))]
            while frames[-1]["type"] != "logs" or frames[-1]["content"] != "error":
                frames.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
        assert "stopped before it ended" in frames[-1]["output"], frames[-1]
        async with aiohttp.ClientSession() as session, session.get(f"{url}/api/jobs/{jobs[victim]}") as response:
            assert (await response.json())["status"] == "failed"
        await server.logged(rf"worker \d \(pid {victim}\) was killed by SIGKILL")
        replacement = int((await server.logged(r"worker \d started \(pid (\d+)\)", times=3))[2].group(1))
        assert await pids_answering(url, 2) == {survivor, replacement}
        # a deploy: SIGTERM with a task running; its worker takes no new one, but lets it finish. As
        # systemd stops a unit (KillMode=control-group) and `pkill` does, every process gets SIGTERM,
        # and the supervisor sends its own: a worker's second one ended it mid-drain, its task cut
        async with websockets.connect(url.replace("http", "ws") + "/ws") as ws:
            asked = len(tavily.requests)
            await ws.send("start " + json.dumps({**task, "task": "rank fusion at scale"}))  # not cached
            while len(tavily.requests) == asked:
                await asyncio.sleep(0.05)
            server.process.send_signal(signal.SIGTERM)
            for pid in (survivor, replacement):
                os.kill(pid, signal.SIGTERM)
            assert await finish(ws) == "path"
        assert await asyncio.to_thread(server.process.wait, 60) == 0
        await server.logged(r"the 1 running tasks finished")
        await server.logged(r"supervisor: stopped")
        assert not pids_alive({survivor, replacement}), "a worker outlived its supervisor"
    finally:
        if server.process.poll() is None:
            server.process.kill()
        await tavily.stop()


async def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """/metrics on a fresh connection (any worker may answer), as sample name and labels to value."""
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session,
        session.get(url + "/metrics") as response,
    ):
        text = await response.text()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_metrics_count_every_worker_whichever_one_a_scrape_reaches(tmp_path, redis_url):
    """Under workers a scrape reaches the worker the kernel picks, and each answered with its own
    counts: a counter jumped between the workers' values from scrape to scrape. Now every scrape
    reads the sums over the workers; a worker killed keeps its counts in them, and its open sockets
    leave them."""
    tavily = await FakeTavily().start()
    server = Supervised(tmp_path, supervised_env(tmp_path, redis_url, tavily))
    held: dict[int, websockets.ClientConnection] = {}
    try:
        url = await server.url()
        pids = await pids_answering(url, 2)
        held = await socket_on_each(url.replace("http", "ws") + "/ws", pids)
        for number in range(3):  # three tasks on each worker
            for pid, ws in held.items():
                task = {"task": f"rank fusion {pid} {number}", "headers": {"retrievers": "tavily"}}
                assert (await run_task(ws, task))[-1]["type"] == "path"
        requests = ("fedresearch_retriever_requests_total", (("retriever", "tavily"),))
        sockets = ("fedresearch_active_sockets", ())
        for _ in range(6):
            seen = await scrape(url)
            assert seen[requests] == 6 and seen[sockets] == 2
            assert seen[("fedresearch_active_tasks", ())] == 0
            assert seen[("fedresearch_gc_frozen_objects", ())] > 10_000  # the fewest of either worker
        victim = sorted(pids)[0]
        os.kill(victim, signal.SIGKILL)
        await server.logged(r"worker \d started \(pid \d+\)", times=3)
        assert len(await pids_answering(url, 2) - pids) == 1  # the replacement answers
        for _ in range(6):
            seen = await scrape(url)
            assert seen[requests] == 6  # counters never go back: the killed worker's stay counted
            assert seen[sockets] == 1  # its socket is gone with it
        survivor = next(iter(pids - {victim}))
        environ = dict(
            entry.split("=", 1) for entry in Path(f"/proc/{survivor}/environ").read_text().split("\0") if "=" in entry
        )
        folder = Path(environ[MULTIPROCESS_DIR])
        assert not list(folder.glob(f"*_{victim}.db"))  # its counts are in the files of the dead
        assert {"counter_dead.db", "histogram_dead.db"} <= {path.name for path in folder.iterdir()}
        assert seen[("fedresearch_worker_deaths_total", (("how", "SIGKILL"),))] == 1
    finally:
        for ws in held.values():
            await ws.close()
        if server.process.poll() is None:
            server.process.terminate()
            await asyncio.to_thread(server.process.wait, 60)
        await tavily.stop()


async def test_any_worker_answers_an_mcp_client_on_any_connection(tmp_path, redis_url):
    """An MCP session lived in the memory of the worker that began it: a request on another
    connection (a pool's new one, a balancer's) reached the other worker half the time, which
    answered 404. The server is stateless now: every request stands alone."""
    tavily = await FakeTavily().start()
    server = Supervised(tmp_path, supervised_env(tmp_path, redis_url, tavily))
    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"}

    async def post(body: dict[str, object], extra: dict[str, str]) -> tuple[int, str, str | None]:
        """Status, body and session id of one request on a connection of its own."""
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session,
            session.post(f"{url}/mcp", json=body, headers={**headers, **extra}) as response,
        ):
            return response.status, await response.text(), response.headers.get("Mcp-Session-Id")

    try:
        url = await server.url()
        await pids_answering(url, 2)
        hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}
        status, _, began = await post({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}, {})
        assert status == 200
        session = {"Mcp-Session-Id": began} if began else {}  # a stateless server begins none
        for number in range(12):  # each on a new connection: the kernel picks the worker
            call = {"jsonrpc": "2.0", "id": 2 + number, "method": "tools/call"}
            status, text, _ = await post({**call, "params": {"name": "list_retrievers", "arguments": {}}}, session)
            assert status == 200, text
            result = json.loads(next(line[6:] for line in text.splitlines() if line.startswith("data: ")))["result"]
            assert "tavily" in {entry["name"] for entry in result["structuredContent"]["retrievers"]}
    finally:
        if server.process.poll() is None:
            server.process.terminate()
            await asyncio.to_thread(server.process.wait, 60)
        await tavily.stop()


async def assert_collector_settled(url: str) -> None:
    """A worker froze what start-up made and shows its collections' pauses on /metrics."""
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as response:
        exposition = await response.text()
    frozen = re.search(r"^fedresearch_gc_frozen_objects (\S+)$", exposition, re.M)
    assert frozen and float(frozen.group(1)) > 10_000, "start-up's objects were not frozen"
    for generation in "012":
        assert f'fedresearch_gc_pause_seconds_count{{generation="{generation}"}}' in exposition


def pids_alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            os.kill(pid, 0)
            alive.add(pid)
        except ProcessLookupError:
            pass
    return alive


def test_the_worker_count_is_a_number_or_auto():
    assert Settings(_env_file=None).workers == 1
    assert Settings(_env_file=None, FEDRESEARCH_WORKERS="auto").workers == "auto"
    assert Settings(_env_file=None, FEDRESEARCH_WORKERS="3").workers == 3
    for wrong in ("0", "-2", "many"):
        with pytest.raises(ValidationError):
            Settings(_env_file=None, FEDRESEARCH_WORKERS=wrong)
    assert parser().parse_args(["serve", "--workers", "auto"]).workers == "auto"
    with pytest.raises(SystemExit):
        parser().parse_args(["serve", "--workers", "0"])


def test_one_process_on_port_0_listens_where_its_log_says(tmp_path):
    """`serve --port 0` picks a free port, as a supervisor does; one process listened on 8000 instead."""
    env = {
        **os.environ,
        "FEDRESEARCH_DATA_DIR": str(tmp_path / "data"),
        "FEDRESEARCH_API_KEYS": "",
        "FEDRESEARCH_EMBEDDINGS": "false",
    }
    command = [sys.executable, "-m", "fedresearch", "serve", "--port", "0"]
    server = subprocess.Popen(command, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stderr is not None
        for line in server.stderr:
            if found := re.search(r"Running on http://127\.0\.0\.1:(\d+) ", line):
                break
        else:
            raise AssertionError("the server never said where it listens")
        port = int(found.group(1))
        assert port not in (0, 8000)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as answer:
            assert json.load(answer)["pid"] == server.pid
    finally:
        server.terminate()
        server.communicate(timeout=60)
    assert server.returncode == 0


async def test_sighup_replaces_the_workers_one_at_a_time_and_a_broken_successor_stops_it(tmp_path, redis_url):
    """`kill -HUP` (a deploy of new code, a changed `.env`): each worker gives way to a fresh process
    only once that one listens, and finishes its running task, however long past SHUTDOWN_GRACE_S
    (no one waits on a replaced worker); the port answers all along. A successor that cannot start
    (here, a `.env` it refuses) stops the reload: the running workers stay."""
    tavily = await FakeTavily().start()
    # the task is answered once both workers are replaced: a reload slower than any fixed delay (a
    # loaded machine) found no task running on the retired worker
    held = tavily.behaviour.held = asyncio.Event()
    env = {**supervised_env(tmp_path, redis_url, tavily), "SHUTDOWN_GRACE_S": "1", "RETRIEVER_TIMEOUT_S": "55"}
    server = Supervised(tmp_path, env)
    try:
        url = await server.url()
        before = await pids_answering(url, 2)
        async with websockets.connect(url.replace("http", "ws") + "/ws") as ws:
            await ws.send("start " + json.dumps({"task": "rank fusion on reload", "headers": {"retrievers": "tavily"}}))
            await tavily.asked()
            server.process.send_signal(signal.SIGHUP)
            answered, refused = 0, 0
            ending = asyncio.create_task(finish(ws))
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
                while len([line for line in server.lines if "replaced: pid" in line]) < 2:
                    try:
                        async with session.get(url + "/healthz") as response:
                            answered += response.status == 200
                    except aiohttp.ClientError:
                        refused += 1
                    await asyncio.sleep(0.05)
                    assert server.process.poll() is None
            held.set()
            async with asyncio.timeout(STARTUP_S):
                assert await ending == "path"  # the task under way finished on its old worker
        assert answered > 0 and refused == 0
        await server.logged(r"no new tasks; 1 running may finish, for 65 s at most \(TASK_TIMEOUT_S\)")
        await server.logged(r"replaced worker \d \(pid \d+\) exited with status 0", times=2)
        after = await pids_answering(url, 2)
        assert after.isdisjoint(before) and not pids_alive(before)

        (tmp_path / ".env").write_text("TASK_TIMEOUT_S=-1\n")  # read by every new worker: refused
        server.process.send_signal(signal.SIGHUP)
        await server.logged(r"reload stopped: worker 1's successor \(pid \d+\) exited with status 2 before it listened")
        assert await pids_answering(url, 2) == after
        server.process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(server.process.wait, 60) == 0
    finally:
        if server.process.poll() is None:
            server.process.kill()
        await tavily.stop()
