"""PDF and DOCX made in a process of their own, bounded in size, time and memory, one per user at a
time: found by an adversarial run, a report of a 10,000-row table took 108.6 s and 1.7 GB in the
server, and six exports of one user held the threads another user's export waited for (97.5 s)."""

from __future__ import annotations

import asyncio
import io
import os
import time
from pathlib import Path

import aiohttp
import pypdf
import pytest

from fedresearch.jobs.reports import ExportGate
from fedresearch.report.render import MAX_CHARS, TABLE_ROWS, ExportFailed, ExportLimits, bounded, render_apart
from fedresearch.report.store import record_bytes, save_report
from tests.conftest import make_settings

KEYS = "alice-key:alice,bob-key:bob"
ALICE, BOB = ({"Authorization": f"Bearer {who}-key"} for who in ("alice", "bob"))
PARAGRAPH = "Reciprocal rank fusion combines the rankings of lexical and dense retrieval systems. " * 5


def table(rows: int) -> str:
    return "| run | system | nDCG@10 |\n|---|---|---|\n" + "".join(
        f"| {i} | bm25+dense | 0.{i % 97:02d} |\n" for i in range(rows)
    )


def long_report(chars: int) -> str:
    return "# Fusion\n\n" + "".join(f"{PARAGRAPH}\n\n" for _ in range(chars // len(PARAGRAPH)))


def children() -> set[int]:
    """This process's child processes, from /proc."""
    found = set()
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == os.getpid():
            found.add(int(name))
    return found


def plant(directory: Path, report_id: str, owner: str, markdown: str) -> None:
    save_report(directory, report_id, record_bytes(markdown, {"owner": owner, "question": "Fusion"}))


def test_tables_are_cut_and_a_report_too_long_is_refused_in_words() -> None:
    markdown = f"# Runs\n\nBefore.\n\n{table(10_000)}\nAfter the table.\n"
    cut = bounded(markdown, "pdf")
    assert cut.count("| bm25+dense |") == TABLE_ROWS - 2  # the header and its rule count as rows
    assert "9,502 more table rows are left out of this PDF; the HTML file has them." in cut
    assert cut.rstrip().endswith("After the table.")
    with pytest.raises(ExportFailed) as refused:
        bounded("x" * (MAX_CHARS + 1), "docx")
    assert refused.value.too_large and "too long to make a DOCX of (1,000,001 characters" in refused.value.reason


def test_an_export_past_its_time_or_memory_is_stopped_and_says_why() -> None:
    before = children()
    started = time.monotonic()
    with pytest.raises(ExportFailed) as late:
        render_apart("pdf", long_report(400_000), "Fusion", "A4", ExportLimits(timeout_s=0.5))
    assert time.monotonic() - started < 3
    assert "took longer than 0.5 s and was stopped" in late.value.reason and not late.value.too_large
    with pytest.raises(ExportFailed) as big:
        render_apart("pdf", long_report(800_000), "Fusion", "A4", ExportLimits(memory_mb=150))
    assert "needed more memory than this server gives one file (150 MB)" in big.value.reason
    assert children() == before  # no renderer left behind


async def test_a_huge_table_is_a_short_pdf_and_the_server_stays_quick(tmp_path, start_server) -> None:
    settings = make_settings(tmp_path, api_keys=KEYS, embeddings=False)
    server = await start_server(settings)
    plant(settings.reports_dir, "a" * 32, "alice", f"# Runs\n\n{table(10_000)}")
    async with aiohttp.ClientSession() as session:

        async def health() -> float:
            worst = 0.0
            while True:
                asked = time.monotonic()
                async with session.get(f"{server.url}/healthz") as response:
                    assert response.status == 200
                worst = max(worst, time.monotonic() - asked)
                await asyncio.sleep(0.05)
                if exporting.done():
                    return worst

        async def export() -> bytes:
            async with session.get(f"{server.url}/reports/{'a' * 32}.pdf", headers=ALICE) as response:
                assert response.status == 200, await response.text()
                return await response.read()

        started = time.monotonic()
        exporting = asyncio.ensure_future(export())
        worst = await health()
        pdf = await exporting
    text = " ".join(page.extract_text() for page in pypdf.PdfReader(io.BytesIO(pdf)).pages)
    assert "more table rows are left out of this PDF" in " ".join(text.split())
    assert time.monotonic() - started < 20 and worst < 0.5, (time.monotonic() - started, worst)


async def test_a_report_too_large_or_too_slow_is_refused_in_words(tmp_path, start_server) -> None:
    settings = make_settings(tmp_path, api_keys=KEYS, embeddings=False, export_timeout_s=0.3)
    server = await start_server(settings)
    plant(settings.reports_dir, "b" * 32, "alice", long_report(MAX_CHARS + 100))
    plant(settings.reports_dir, "c" * 32, "alice", long_report(400_000))
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{server.url}/reports/{'b' * 32}.docx", headers=ALICE) as response:
            assert response.status == 422 and "too long to make a DOCX of" in await response.text()
        async with session.get(f"{server.url}/reports/{'c' * 32}.pdf", headers=ALICE) as response:
            assert response.status == 503 and "took longer than 0.3 s" in await response.text()
        async with session.get(f"{server.url}/reports/{'c' * 32}.html", headers=ALICE) as response:
            assert response.status == 200  # the HTML is still there, whole
    assert not list(settings.reports_dir.glob(f"{'c' * 32}.pdf*"))  # nothing half-made is kept


async def test_one_users_exports_never_delay_anothers(tmp_path, start_server) -> None:
    settings = make_settings(tmp_path, api_keys=KEYS, embeddings=False, export_processes=2)
    server = await start_server(settings)
    for n in range(4):
        plant(settings.reports_dir, f"{n}" * 32, "alice", long_report(150_000))
    plant(settings.reports_dir, "e" * 32, "bob", long_report(150_000))
    finished: dict[str, float] = {}
    async with aiohttp.ClientSession() as session:

        async def export(report_id: str, headers: dict[str, str], name: str) -> None:
            async with session.get(f"{server.url}/reports/{report_id}.pdf", headers=headers) as response:
                assert response.status == 200, await response.text()
                await response.read()
            finished[name] = time.monotonic()

        alices = [asyncio.ensure_future(export(f"{n}" * 32, ALICE, f"alice{n}")) for n in range(4)]
        await asyncio.sleep(0.2)  # alice's four are queued
        await export("e" * 32, BOB, "bob")
        await asyncio.gather(*alices)
    # alice's run one at a time; bob's takes the other process at once, done before alice's second half
    assert sorted(finished, key=finished.__getitem__).index("bob") <= 2, finished


async def test_the_gate_lets_each_user_one_at_a_time() -> None:
    gate = ExportGate(processes=2, limits=ExportLimits())
    order: list[str] = []

    async def hold(user: str, seconds: float) -> None:
        async with gate.slot(user):
            order.append(user)
            await asyncio.sleep(seconds)

    await asyncio.gather(hold("alice", 0.2), hold("alice", 0.2), hold("alice", 0.2), hold("bob", 0.01))
    assert order.index("bob") == 1 and order.count("alice") == 3 and not gate._users
