"""Typed models shared by every floor: the request as parsed from a frame, and the normalized result."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

LIBRARY_TYPES = ("biblio", "highlight", "file")


def library_type(value: object) -> str | None:
    """`biblio`, `highlight` or `file` for any casing (`File` included; empty means biblio); None if unknown."""
    kind = str(value or "biblio").strip().lower()
    return kind if kind in LIBRARY_TYPES else None


class ReportType(StrEnum):
    research_report = "research_report"
    resource_report = "resource_report"
    outline_report = "outline_report"


class ReportSource(StrEnum):
    web = "web"
    local = "local"
    hybrid = "hybrid"


class ResearchRequest(BaseModel):
    """A research task as a GPT-Researcher client sends it; unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    task: str = Field(min_length=1)
    report_type: ReportType = ReportType.research_report
    report_source: ReportSource | None = None
    tone: str | None = None
    source_urls: list[str] = Field(default_factory=list)
    query_domains: list[str] = Field(default_factory=list)
    max_search_results: int | None = Field(None, ge=1, le=50)
    headers: dict[str, Any] = Field(default_factory=dict)

    @field_validator("task", mode="before")
    @classmethod
    def _strip_task(cls, value: object) -> object:
        return value.strip() if isinstance(value, str) else value

    @field_validator("report_type", "report_source", mode="before")
    @classmethod
    def _lower_enum(cls, value: object) -> object:
        if value == "":
            return None
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("source_urls", "query_domains", mode="before")
    @classmethod
    def _none_is_empty(cls, value: object) -> object:
        if value is None:
            return []
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("headers", mode="before")
    @classmethod
    def _headers_object(cls, value: object) -> object:
        return {} if value is None else value

    def header(self, name: str) -> str | None:
        """A header as a trimmed string, or None when absent or blank."""
        value = self.headers.get(name)
        if value is None:
            return None
        text = str(value).strip()
        return text or None


class LiteratureQuery(BaseModel):
    """A request to the internal literature API (DESIGN.md): the body `internal_*` adapters send."""

    type: str = "biblio"
    user_id: str = Field(min_length=1)
    query: str = Field(min_length=1)
    top_k: int = Field(10, ge=1, le=100)

    @field_validator("type", mode="before")
    @classmethod
    def _known_type(cls, value: object) -> object:
        kind = library_type(value)
        if kind is None:
            raise ValueError("must be biblio, highlight or file")
        return kind

    @field_validator("user_id", "query", mode="before")
    @classmethod
    def _strip(cls, value: object) -> object:
        return value.strip() if isinstance(value, str) else value


class SearchResult(BaseModel):
    """One normalized result; `href` and `body` are what every consumer relies on."""

    href: str
    body: str
    title: str = ""
    score: float | None = Field(None, ge=0.0, le=1.0)
    retriever: str
    rank: int = Field(ge=1)
    metadata: dict[str, Any] = Field(default_factory=dict)


class RetrieverStatus(StrEnum):
    done = "done"
    failed = "failed"
    skipped = "skipped"


class RetrieverOutcome(BaseModel):
    """How one retriever fared in one task (streamed to the client and saved with the report)."""

    name: str
    status: RetrieverStatus
    count: int = 0
    elapsed_ms: float = 0.0
    error: str | None = None
    warnings: list[str] = Field(default_factory=list)
    cached: bool = False
    attempts: int = 1


class FusedResult(BaseModel):
    """A source after canonicalization and dedup: what the report cites."""

    key: str
    href: str
    title: str
    body: str
    score: float
    retrievers: list[str]
    ranks: dict[str, int]
    source_scores: dict[str, float] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
