"""What `fedresearch serve` says when it cannot start, and what it leaves out when it can."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fedresearch.library.onnx_graph import _QuietQuantizer


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_busy_port_is_one_line_naming_it(tmp_path: Path, workers: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "fedresearch", "serve", "--port", str(port), "--workers", workers],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env={**os.environ, "FEDRESEARCH_DATA_DIR": str(tmp_path / "data"), "FEDRESEARCH_EMBEDDINGS": "false"},
        )
    assert done.returncode == 1
    assert f"fedresearch: 127.0.0.1:{port} is in use (another server?)" in done.stderr
    assert "--port or FEDRESEARCH_PORT" in done.stderr and "Traceback" not in done.stderr


def test_the_quantizer_s_advice_stays_out_of_the_log() -> None:
    """ONNX Runtime's quantizer wrote 36 INFO lines on the root logger at a server's first start."""
    quiet = _QuietQuantizer()

    def record(level: int, message: str) -> logging.LogRecord:
        return logging.LogRecord("root", level, __file__, 1, message, None, None)

    assert not quiet.filter(record(logging.INFO, 'Quantization parameters for tensor:"mul_60" not specified'))
    assert not quiet.filter(record(logging.WARNING, "Please consider pre-processing before quantization"))
    assert quiet.filter(record(logging.ERROR, "the quantizer failed"))


def test_a_server_without_a_font_for_chinese_says_so_at_start(tmp_path, monkeypatch, caplog) -> None:
    from fedresearch.serve import preflight
    from tests.conftest import make_settings

    monkeypatch.setattr(preflight, "cjk_font_installed", lambda: False)
    with caplog.at_level(logging.INFO, logger="fedresearch"):
        preflight.prepare(make_settings(tmp_path), "127.0.0.1", with_pid=False)
    assert any("no font with Chinese characters is installed" in r.getMessage() for r in caplog.records)
    assert any("apt-get install fonts-noto-cjk" in r.getMessage() for r in caplog.records)
