"""Knowledge bases the operator defines in a TOML file (FEDRESEARCH_KNOWLEDGE_BASES).

[knowledge_bases.papers]                # the knowledge_id Dify sends
user_id = "alice"                       # whose library it reads
retrievers = ["internal_biblio", "internal_highlight", "tavily"]
weights = { internal_biblio = 1.5 }     # fusion weights, default 1
top_k = 5                               # when Dify sends top_k null
timeout_s = 3.5                         # per-retriever deadline, under Dify's 5 s
api_keys = ["env:DIFY_PAPERS_KEY"]      # keys that may call this knowledge base only
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fedresearch.core.auth import Principal
from fedresearch.core.secrets import resolve_secret
from fedresearch.core.settings import load_toml


class KnowledgeBase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    user_id: str = Field(min_length=1)
    retrievers: list[str] = Field(default_factory=lambda: ["internal_biblio"], min_length=1)
    weights: dict[str, float] = Field(default_factory=dict)
    top_k: int = Field(5, ge=1, le=100)
    timeout_s: float = Field(3.5, gt=0, le=4.0)  # + scoring (<= ~0.6 s) must stay under Dify's 5 s
    api_keys: list[str] = Field(default_factory=list, repr=False)
    description: str = ""


def load_knowledge_bases(path: Path | None, known_retrievers: set[str]) -> dict[str, KnowledgeBase]:
    if path is None:
        return {}
    document = load_toml(path, "FEDRESEARCH_KNOWLEDGE_BASES")
    bases: dict[str, KnowledgeBase] = {}
    for name, table in (document.get("knowledge_bases") or {}).items():
        where = f"FEDRESEARCH_KNOWLEDGE_BASES ({path}), knowledge base {name!r}"
        try:
            base = KnowledgeBase(id=name, **table)
        except ValidationError as error:
            raise ValueError(f"{where}: {error}") from error
        base.retrievers = [r.strip().lower() for r in base.retrievers]
        unknown = sorted(set(base.retrievers) - known_retrievers)
        if unknown:
            raise ValueError(f"{where}: unknown retrievers {unknown}; known: {', '.join(sorted(known_retrievers))}")
        base.api_keys = [resolve_secret(key, where) for key in base.api_keys]
        bases[name] = base
    return bases


def knowledge_base_keys(bases: dict[str, KnowledgeBase]) -> dict[str, Principal]:
    """Each knowledge base's own keys, valid on /retrieval for every knowledge base that lists them
    (one Dify workspace may hold several with one key); such a key reads a base as the base's user."""
    served: dict[str, set[str]] = {}
    for base in bases.values():
        for key in base.api_keys:
            served.setdefault(key, set()).add(base.id)
    principals = {}
    for key, ids in served.items():
        users = {bases[base_id].user_id for base_id in ids}
        user = users.pop() if len(users) == 1 else None
        principals[key] = Principal(user, knowledge_bases=frozenset(ids))
    return principals


def may_read(principal: Principal, base: KnowledgeBase) -> bool:
    if principal.admin:
        return True
    if principal.knowledge_bases is not None:
        return base.id in principal.knowledge_bases
    return principal.user_id == base.user_id
