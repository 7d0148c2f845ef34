"""Secrets named in operator files: a literal value, or `env:NAME` to read it from the environment."""

from __future__ import annotations

import os
import re

# a field, header or query parameter whose name says it carries a credential
CREDENTIAL_NAME = r"(?:token|key|secret|password|passwd|auth|signature|sig)"
_CREDENTIAL = re.compile(CREDENTIAL_NAME, re.IGNORECASE)


def is_credential_name(name: str) -> bool:
    return _CREDENTIAL.search(name) is not None


def without_secrets(text: str, secrets: list[str]) -> str:
    """`text` with each of `secrets` (longest first) replaced by [REDACTED]: for an upstream that echoes a key."""
    for value in sorted(secrets, key=len, reverse=True):
        if len(value) >= 6:  # shorter values are not keys, and replacing them would mangle the text
            text = text.replace(value, "[REDACTED]")
    return text


def resolve_secret(value: str, where: str) -> str:
    if value.startswith("env:"):
        name = value[4:].strip()
        resolved = os.environ.get(name, "")
        if not resolved:
            raise ValueError(f"{where}: environment variable {name} is not set")
        return resolved
    return value
