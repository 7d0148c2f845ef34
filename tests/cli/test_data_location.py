"""Where data lives: by default the platform's folder for a user's data, whichever folder a command
starts in; `serve` and `ingest` say where it is, and a library left in ./data by an earlier version
is pointed out with the command that moves it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fedresearch.cli import main
from fedresearch.core.settings import Settings
from tests.conftest import EXAMPLES


@pytest.fixture
def platform_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """XDG_DATA_HOME in the test's folder, FEDRESEARCH_DATA_DIR unset, the command run elsewhere."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("FEDRESEARCH_DATA_DIR", raising=False)
    monkeypatch.setenv("FEDRESEARCH_EMBEDDINGS", "false")
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    return tmp_path / "xdg" / "fedresearch"


def test_data_lives_in_the_platform_s_folder_unless_named(platform_home: Path) -> None:
    assert Settings(_env_file=None).data_dir == platform_home
    assert Settings(_env_file=None, FEDRESEARCH_DATA_DIR="").data_dir == platform_home  # empty: unset
    assert Settings(_env_file=None, FEDRESEARCH_DATA_DIR="/srv/research").data_dir == Path("/srv/research")


def test_ingest_says_where_and_points_out_a_library_left_in_dot_data(
    platform_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ingest", "--user", "alice", str(EXAMPLES / "notes")]) == 0
    err = capsys.readouterr().err
    assert f"into alice's library in {platform_home / 'library'}" in err and "earlier version" not in err
    (Path("data") / "library").mkdir(parents=True)  # where earlier versions kept it
    assert main(["ingest", "--user", "alice", str(EXAMPLES / "notes")]) == 0
    err = capsys.readouterr().err
    old = Path("data").resolve()
    assert f"a library from an earlier version is in {old}" in err
    assert f"mv {old}/* {platform_home}/" in err and f"FEDRESEARCH_DATA_DIR={old}" in err


def test_serve_says_where_its_library_and_data_are(platform_home: Path) -> None:
    server = subprocess.Popen(
        [sys.executable, "-m", "fedresearch", "serve", "--port", "0"], stderr=subprocess.PIPE, text=True
    )
    said = []
    try:
        assert server.stderr is not None
        for line in server.stderr:
            said.append(line)
            if "Running on" in line:
                break
    finally:
        server.terminate()
        server.wait(timeout=30)
    text = "".join(said)
    assert f"library: {platform_home / 'library'}; data (jobs, reports): {platform_home}" in text, text
