"""API keys and who each acts as: every request is made on behalf of one user (docs/architecture.md, Invariants)."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, replace
from pathlib import Path

from fedresearch.core.settings import Settings, secret

LOOPBACK_HOSTS = {"127.0.0.1", "::1", "localhost"}


@dataclass(frozen=True)
class Principal:
    """Who a request acts as: a bound user, or an admin who may name any user.

    `knowledge_bases` set: a key defined by knowledge bases, valid for those on /retrieval only.
    """

    user_id: str | None
    admin: bool = False
    knowledge_bases: frozenset[str] | None = None
    key_id: str = "local"  # which key (a digest prefix, never the key); "local" without keys

    def asker(self, user_id: str | None) -> str:
        """Who asks, for counting an upstream's errors per asker: this key, and the user it acts for."""
        return f"{self.key_id}/{user_id or ''}"


class ApiKeys:
    def __init__(self, pairs: dict[str, Principal]) -> None:
        # keep digests, not keys: comparisons run over fixed-length values in constant time
        self._digests = []
        for key, who in pairs.items():
            digest = hashlib.sha256(key.encode()).digest()
            self._digests.append((digest, replace(who, key_id=digest.hex()[:12])))

    def with_keys(self, pairs: dict[str, Principal]) -> ApiKeys:
        merged = ApiKeys({})
        merged._digests = self._digests + ApiKeys(pairs)._digests
        return merged

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def authenticate(self, token: str | None) -> Principal | None:
        if not token:
            return None
        # a header aiohttp could not decode holds surrogates: such a token matches no key, it is no error
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        found = None
        for candidate, who in self._digests:
            if hmac.compare_digest(candidate, digest):
                found = who
        return found

    @classmethod
    def parse(cls, text: str, origin: str) -> ApiKeys:
        pairs: dict[str, Principal] = {}
        for number, entry in enumerate(text.replace("\n", ",").split(","), start=1):
            entry = entry.strip()
            if not entry or entry.startswith("#"):
                continue
            key, sep, user = entry.partition(":")
            if not sep or not key.strip() or not user.strip():
                raise ValueError(f"{origin}: entry {number} is not KEY:USER_ID or KEY:*")
            user = user.strip()
            pairs[key.strip()] = Principal(None, admin=True) if user == "*" else Principal(user)
        return cls(pairs)

    @classmethod
    def from_settings(cls, settings: Settings) -> ApiKeys:
        if settings.api_keys_file is not None:
            return cls.parse(Path(settings.api_keys_file).read_text(encoding="utf-8"), "FEDRESEARCH_API_KEYS_FILE")
        return cls.parse(secret(settings.api_keys) or "", "FEDRESEARCH_API_KEYS")


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header (the scheme is case-insensitive, RFC 7235);
    None when the header is absent or has another shape."""
    scheme, _, value = (authorization or "").strip().partition(" ")
    return value.strip() or None if scheme.lower() == "bearer" else None


def check_bind(host: str, keys: ApiKeys) -> str | None:
    """Why the server must not listen on `host`, or None when it may."""
    if keys.enabled or host in LOOPBACK_HOSTS:
        return None
    return (
        f"refusing to listen on {host} with no API keys configured: anyone who can reach it could "
        "read every library; set FEDRESEARCH_API_KEYS (or FEDRESEARCH_API_KEYS_FILE), or listen on 127.0.0.1"
    )
