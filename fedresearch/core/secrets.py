"""Secrets named in operator files: a literal value, or `env:NAME` to read it from the environment."""

from __future__ import annotations

import os


def resolve_secret(value: str, where: str) -> str:
    if value.startswith("env:"):
        name = value[4:].strip()
        resolved = os.environ.get(name, "")
        if not resolved:
            raise ValueError(f"{where}: environment variable {name} is not set")
        return resolved
    return value
