"""`make demo`: load the bundled library, start the server, run one research task, save its files,
stop, and remove the demo's library.

Runs offline with no API key: the web retrievers are named on purpose, so the report shows
how a retriever without a key is skipped with its reason while the others go on. The report's
files are kept in `demo-report/` (the folder `make demo` runs in); the rest goes.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
QUESTION = "How should lexical BM25 and dense retrieval be combined with rank fusion?"
OUTPUT = Path("demo-report")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_healthy(url: str, server: subprocess.Popen[bytes], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with code {server.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"the server did not answer {url} within {seconds:g} s")


def main() -> int:
    data_dir = Path(tempfile.mkdtemp(prefix="fedresearch-demo-"))
    try:
        return demo(data_dir)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)  # the demo's library and jobs: 100 MB with the model's graph


def demo(data_dir: Path) -> int:
    port = free_port()
    env = {
        **os.environ,
        "FEDRESEARCH_DATA_DIR": str(data_dir),
        "FEDRESEARCH_HOST": "127.0.0.1",
        "FEDRESEARCH_PORT": str(port),
        # offline by construction: no web keys, whatever the environment or .env holds
        "TAVILY_API_KEY": "",
        "GOOGLE_API_KEY": "",
        "GOOGLE_CX_KEY": "",
        "INTERNAL_API_BASE_URL": "",
        "FEDRESEARCH_API_KEYS": "",
    }
    fedresearch = str(BIN / "fedresearch")
    print(f"== 1. Loading the example library into {data_dir}", flush=True)
    subprocess.run([fedresearch, "ingest", "--user", "demo", str(HERE / "library")], env=env, check=True)

    print(f"\n== 2. Starting the server on 127.0.0.1:{port}", flush=True)
    with tempfile.TemporaryFile() as server_log:
        server = subprocess.Popen([fedresearch, "serve"], env=env, stderr=server_log)
        try:
            try:
                wait_healthy(f"http://127.0.0.1:{port}/healthz", server)
            except SystemExit:
                server_log.seek(0)  # show why it did not start, not just that it did not
                sys.stderr.write(server_log.read().decode(errors="replace")[-3000:])
                raise
            print(f"\n== 3. Asking: {QUESTION}\n", flush=True)
            asked = subprocess.run(
                [
                    fedresearch,
                    "ask",
                    QUESTION,
                    "--retrievers",
                    "internal_biblio,internal_highlight,tavily,google",
                    "--user",
                    "demo",
                    "--server",
                    f"ws://127.0.0.1:{port}",
                    "--output",
                    str(OUTPUT),
                    "--format",
                    "md,html,pdf,docx",
                ],
                env=env,
            )
        finally:
            print("\n== 4. Stopping the server", flush=True)
            server.terminate()
            server.wait(timeout=15)
    return asked.returncode


if __name__ == "__main__":
    sys.exit(main())
