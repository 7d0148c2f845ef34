"""`fedresearch ask` against a running server: the report on stdout, and a refused or wrong address
said in one line (no traceback)."""

import asyncio

import pytest
from aiohttp import web

from fedresearch.cli import main
from tests.conftest import make_settings

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
