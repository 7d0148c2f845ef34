"""The built wheel installs one import name, `fedresearch`, and works beside unrelated code."""

from __future__ import annotations

import os
import shutil
import site
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.fixture(scope="module")
def fresh_install(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv holding only the wheel; its dependencies come from the test venv, appended after."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"  # a clean copy, so build leftovers never touch the checkout
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv", ".git", "data", "build", "*.egg-info"))
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(work), str(source)])
    (wheel,) = work.glob("fedresearch-*.whl")
    venv = work / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    purelib = Path(
        run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]
        ).stdout.strip()
    )
    before = set(os.listdir(purelib))
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--no-deps",
            "--no-index",
            str(wheel),
        ]
    )
    (purelib / "added.txt").write_text("\n".join(sorted(set(os.listdir(purelib)) - before)))
    # a plain path line: the test venv's packages become importable, but its editable fedresearch does not
    (purelib / "zz_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return venv


def unrelated_packages(folder: Path) -> Path:
    for name in ("core", "library", "report", "retrievers", "web", "cli"):
        package = folder / name
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(f"raise ImportError('someone else\\'s {name} was imported')\n")
    return folder


def test_the_wheel_adds_only_the_fedresearch_namespace(fresh_install: Path) -> None:
    purelib = next(fresh_install.glob("lib/python*/site-packages"))
    added = set((purelib / "added.txt").read_text().split())
    assert {name for name in added if not name.endswith(".dist-info")} == {"fedresearch"}
    assert len([name for name in added if name.endswith(".dist-info")]) == 1
    assert (purelib / "fedresearch" / "py.typed").is_file()
    assert list((purelib / "fedresearch" / "report" / "templates").glob("*.md.j2"))
    static = purelib / "fedresearch" / "web" / "static"
    assert {"index.html", "page.js", "strings.js", "page.css"} <= {path.name for path in static.iterdir()}
    vendored = {path.name for path in (static / "vendor").iterdir()}
    assert {"marked.min.js", "purify.min.js", "LICENSE.marked.txt", "LICENSE.dompurify.txt"} <= vendored


def test_it_imports_and_serves_beside_unrelated_core_library_report(fresh_install: Path, tmp_path: Path) -> None:
    folder = unrelated_packages(tmp_path / "project")
    python = str(fresh_install / "bin" / "python")
    modules = ["fedresearch.web.app", "fedresearch.cli", "fedresearch.retrievers", "fedresearch.library.facade"]
    run([python, "-c", "; ".join(f"import {m}" for m in modules)], cwd=folder)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "FEDRESEARCH_DATA_DIR": str(tmp_path / "data"), "FEDRESEARCH_EMBEDDINGS": "false"}
    script = fresh_install / "bin" / "fedresearch"
    server = subprocess.Popen([str(script), "serve", "--port", str(port)], cwd=folder, env=env, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as answer:
                    assert b"internal_biblio" in answer.read()
                    break
            except OSError:
                assert server.poll() is None, server.stderr.read().decode() if server.stderr else ""
                assert time.monotonic() < deadline, "the installed server did not answer"
                time.sleep(0.2)
    finally:
        server.terminate()
        server.wait(timeout=15)


def test_python_server_py_starts_the_server() -> None:
    done = run([sys.executable, "server.py", "--help"], cwd=ROOT)
    assert "--port" in done.stdout


def test_env_example_lists_every_setting() -> None:
    """The server's settings and every upstream's (each its own class, named by its About), each once."""
    from fedresearch.core.settings import Settings
    from fedresearch.retrievers import ADAPTERS

    classes = [Settings, *(upstream.about.settings for upstream in ADAPTERS)]
    names = [field.validation_alias for settings in classes for field in settings.model_fields.values()]
    listed = [
        line.split("=")[0]
        for line in (ROOT / ".env.example").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    ]
    assert sorted(names) == sorted(listed)
    assert len(set(names)) == len(names)  # no two classes read the same name


_WHAT_A_PROCESS_IMPORTS = """
import asyncio, sys
from aiohttp import web
from fedresearch.core.settings import Settings
from fedresearch.serve import launch, workers

supervisor = "fedresearch.web.app" in sys.modules or "fedresearch.retrievers" in sys.modules
from fedresearch.web.app import create_app

async def started() -> None:
    runner = web.AppRunner(create_app(Settings(_env_file=None, FEDRESEARCH_DATA_DIR=sys.argv[1])))
    await runner.setup()
    await runner.cleanup()

asyncio.run(started())
print(supervisor, "openai" in sys.modules, "mcp" in sys.modules)
"""


def test_a_supervisor_imports_no_app_and_a_server_no_sdk_it_was_not_asked_for(tmp_path: Path) -> None:
    """What each process holds: the supervisor only tends processes (105 MB when it imported the
    app, 36 now); a server with no model configured never needs the OpenAI SDK (13 MB a worker),
    and one never asked over `/mcp` never needs the MCP SDK (26 MB; tests/web/test_mcp.py asks)."""
    env = {**os.environ, "FEDRESEARCH_EMBEDDINGS": "false"}
    for name in ("LLM_BASE_URL", "LLM_MODEL", "LLM_API_KEY"):
        env.pop(name, None)
    done = run([sys.executable, "-c", _WHAT_A_PROCESS_IMPORTS, str(tmp_path / "data")], env=env)
    assert done.stdout.split() == ["False", "False", "False"]
