"""`fedresearch ask`, in this process or against a running server: the report on stdout, its files
saved where asked, and every refusal or wrong address said in words with an exit status of its own
(no traceback)."""

import asyncio
from pathlib import Path

import pytest
from aiohttp import web

from fedresearch.cli import main
from tests.conftest import EXAMPLES, make_settings

KEYS = "alice-key:alice"


async def ask(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, ["ask", *arguments])  # the CLI runs its own event loop
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def test_the_report_comes_out_and_a_server_address_ending_in_ws_is_accepted(
    tmp_path, fakes, start_server, capsys
) -> None:
    server = await start_server(make_settings(tmp_path, fakes))
    base = server.url.replace("http://", "ws://")
    code, out, err = await ask(capsys, "--server", base + "/ws", "--retrievers", "tavily", "rank fusion")
    assert code == 0 and out.startswith("# ") and "References" in out
    assert "Saved md: http://127.0.0.1" in err


async def test_a_refused_connection_is_one_clear_line(tmp_path, fakes, start_server, capsys) -> None:
    server = await start_server(make_settings(tmp_path, fakes, api_keys=KEYS))
    base = server.url.replace("http://", "ws://")
    code, _, err = await ask(capsys, "--server", base, "rank fusion")
    assert code == 1 and "HTTP 401" in err and "--token" in err and "Traceback" not in err


async def test_something_else_at_the_address_is_one_clear_line(capsys) -> None:
    app = web.Application()
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        code, _, err = await ask(capsys, "--server", f"ws://127.0.0.1:{port}", "rank fusion")
    finally:
        await runner.cleanup()
    assert code == 1 and "HTTP 404" in err and "Traceback" not in err
    code, _, err = await ask(capsys, "--server", "http//nowhere", "rank fusion")
    assert code == 1 and "ws://HOST:PORT" in err


@pytest.fixture
def here(tmp_path, monkeypatch) -> Path:
    """`fedresearch` run in this process with no server: its data in a folder of the test's, the
    example library ingested for alice, no upstream key from the environment."""
    monkeypatch.chdir(tmp_path)  # no .env of the checkout's
    monkeypatch.setenv("FEDRESEARCH_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("FEDRESEARCH_EMBEDDINGS", "false")
    for name in ("TAVILY_API_KEY", "GOOGLE_API_KEY", "FEDRESEARCH_DEFAULT_USER", "INTERNAL_API_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    assert main(["ingest", "--user", "alice", str(EXAMPLES)]) == 0
    return tmp_path


async def test_without_a_server_the_task_runs_here_and_its_files_are_saved_named_after_the_question(
    here, capsys
) -> None:
    code, out, err = await ask(
        capsys,
        "How does reciprocal rank fusion combine rankings?",
        "--user",
        "alice",
        "--report-type",
        "detailed_report",
        "--output",
        str(here / "out"),
        "--format",
        "md,pdf",
    )
    assert code == 0 and out.startswith("# How does reciprocal rank fusion") and "## References" in out
    assert "Sub-questions" in err  # progress on stderr, as it happens
    saved = here / "out" / "how-does-reciprocal-rank-fusion-combine-rankings"
    assert saved.with_suffix(".md").read_text(encoding="utf-8") == out
    assert saved.with_suffix(".pdf").read_bytes().startswith(b"%PDF-")
    assert f"Saved pdf: {saved.with_suffix('.pdf')}" in err


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        (["", "--user", "alice"], "task: String should have at least 1 character"),
        (["x" * 2001, "--user", "alice"], "task is 2001 characters; MAX_TASK_CHARS is 2000"),
        (["rank fusion", "--user", "alice", "--retrievers", "bing"], "unknown retriever 'bing'"),
        (["rank fusion"], "user_id is required"),
        (["rank fusion", "--user", "bad user!"], "user_id must be 1 to 128 letters"),
    ],
)
async def test_every_refusal_here_is_said_in_words_with_exit_status_2(here, capsys, arguments, words) -> None:
    code, out, err = await ask(capsys, *arguments)
    assert code == 2 and out == "" and words in err and "Traceback" not in err
    assert "Report saved" not in err  # a refused task's short report is not news to the person who asked


async def test_a_refusal_by_a_server_is_said_in_words_with_its_exit_status(tmp_path, fakes, start_server, capsys):
    server = await start_server(make_settings(tmp_path, fakes))
    base = server.url.replace("http://", "ws://")
    code, out, err = await ask(capsys, "--server", base, "--retrievers", "bing", "rank fusion")
    assert code == 2 and out == "" and "unknown retriever 'bing'" in err and "Traceback" not in err


def test_ingest_refuses_a_user_id_no_request_could_reach_and_says_where_it_stored(here, capsys) -> None:
    for user in ("bad user!", ""):
        assert main(["ingest", "--user", user, str(EXAMPLES)]) == 2
        assert "--user: user_id must be 1 to 128 letters" in capsys.readouterr().err
    assert main(["ingest", "--user", "bob", str(EXAMPLES / "notes")]) == 0
    assert f"into bob's library in {here / 'data' / 'library'}" in capsys.readouterr().err
