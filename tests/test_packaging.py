"""The installed project works outside the checkout: every module imports, the console script runs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOT_SHIPPED = {"tests", "bench", "examples", "integrations", "build", "dist"}


def project_modules() -> list[str]:
    modules = [path.stem for path in ROOT.glob("*.py")]
    packages = [path.parent.name for path in ROOT.glob("*/__init__.py") if path.parent.name not in NOT_SHIPPED]
    return sorted(modules + packages)


def test_every_module_imports_from_outside_the_checkout(tmp_path):
    modules = project_modules()
    assert {"server", "cli", "research", "core", "retrievers", "report", "library", "knowledge"} <= set(modules)
    imports = "; ".join(f"import {name}" for name in modules)
    done = subprocess.run([sys.executable, "-c", imports], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr  # a package missing from pyproject.toml fails here


def test_console_script_runs(tmp_path):
    script = shutil.which("fedresearch", path=str(Path(sys.executable).parent))
    assert script, "the fedresearch console script is not installed"
    done = subprocess.run([script, "serve", "--help"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0 and "--port" in done.stdout, done.stderr


def test_env_example_lists_every_setting():
    from core.settings import Settings

    names = {field.validation_alias for field in Settings.model_fields.values()}
    listed = {
        line.split("=")[0]
        for line in (ROOT / ".env.example").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    }
    assert names == listed
