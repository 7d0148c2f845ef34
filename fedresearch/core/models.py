"""Typed models shared by every floor: the request as parsed from a frame, and the normalized result."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from fedresearch.core.citation_styles import style_name
from fedresearch.core.text import split_commas

LIBRARY_TYPES = ("biblio", "highlight", "file")


def library_type(value: object) -> str | None:
    """`biblio`, `highlight` or `file` for any casing (`File` included; empty means biblio); None if unknown."""
    kind = str(value or "biblio").strip().lower()
    return kind if kind in LIBRARY_TYPES else None


class ReportType(StrEnum):
    """GPT-Researcher's report types (gpt_researcher/utils/enum.py): the names clients send. What
    each is and how it is written is its form in report/types.py."""

    research_report = "research_report"
    resource_report = "resource_report"
    outline_report = "outline_report"
    custom_report = "custom_report"
    detailed_report = "detailed_report"
    subtopic_report = "subtopic_report"
    deep = "deep"


# report types clients of GPT-Researcher send that this server serves as another, and what they are told
REPORT_TYPE_STAND_INS: dict[str, tuple[ReportType, str]] = {
    # its NextJS app's "Multi Agents Report" (a LangGraph team of agents): the nearest form is a report
    # whose question is split into sub-questions, each researched and written up on its own
    "multi_agents": (
        ReportType.detailed_report,
        "multi_agents is served as a detailed report: the question split into sub-questions, each researched",
    ),
}


class ReportSource(StrEnum):
    """GPT-Researcher's report sources. Those that name one of its own in-process document stores
    (azure, langchain_*) mean "my documents" here: the user's library; `static` means the given URLs only."""

    web = "web"
    local = "local"
    hybrid = "hybrid"
    azure = "azure"
    langchain_documents = "langchain_documents"
    langchain_vectorstore = "langchain_vectorstore"
    static = "static"


USER_ID_MAX_CHARS = 128
_USER_ID = re.compile(r"[\w.@:+-]+")


def checked_user_id(value: object) -> str:
    """A user id: a string of letters, digits and . _ - @ : + only, up to USER_ID_MAX_CHARS; else ValueError.

    Typed strictly because it selects whose library is read: 7, ["alice"] or true must not
    quietly become a user named "7", "['alice']" or "True".
    """
    if not isinstance(value, str):
        raise ValueError(f"user_id must be a string, not {type(value).__name__}")
    text = value.strip()
    if not text or len(text) > USER_ID_MAX_CHARS or not _USER_ID.fullmatch(text):
        raise ValueError(
            f"user_id must be 1 to {USER_ID_MAX_CHARS} letters, digits or . _ - @ : + (got {len(text)} characters)"
        )
    return text


class ResearchRequest(BaseModel):
    """A research task as a GPT-Researcher client sends it; unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    task: str = Field(min_length=1)
    report_type: ReportType = ReportType.research_report
    report_source: ReportSource | None = None
    tone: str | None = None
    source_urls: list[str] = Field(default_factory=list)
    complement_source_urls: bool = False
    document_urls: list[str] = Field(default_factory=list)
    query_domains: list[str] = Field(default_factory=list)
    max_search_results: int | None = Field(None, ge=1, le=50)
    language: str | None = None
    citation_style: str | None = None  # a CSL style's name for the References (default: CITATION_STYLE)
    agent: str | None = None
    headers: dict[str, Any] = Field(default_factory=dict)
    detach: bool = False  # keep running when the socket that started it closes (resume it by research_id)
    # what custom_report follows: format, length, focus (GPT-Researcher's `custom_prompt`)
    custom_prompt: str | None = Field(None, max_length=4000)
    # subtopic_report: the main question this subtopic belongs to, and the sections already written
    # (GPT-Researcher's `parent_query`, `existing_headers`, `draft_section_titles`)
    parent_query: str | None = Field(None, max_length=4000)
    existing_headers: list[str] = Field(default_factory=list, max_length=200)
    draft_section_titles: list[str] = Field(default_factory=list, max_length=200)
    # set when the report type asked for is served as another (REPORT_TYPE_STAND_INS): what to tell
    report_type_note: SkipJsonSchema[str | None] = Field(None, exclude=True)
    # set when the report type asked for is none this server knows: the task is refused with this
    # (an error listing the known ones), and still ends with a short report and `path`
    report_type_error: SkipJsonSchema[str | None] = Field(None, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _stand_in(cls, data: object) -> object:
        if not isinstance(data, dict):
            return data
        ours = ("report_type_note", "report_type_error")  # ours alone to set
        data = {name: value for name, value in data.items() if name not in ours}
        asked = data.get("report_type")
        name = asked.strip().lower() if isinstance(asked, str) else None
        stand_in = REPORT_TYPE_STAND_INS.get(name) if name is not None else None
        if stand_in is not None:
            return {**data, "report_type": stand_in[0], "report_type_note": stand_in[1]}
        if name and name not in set(ReportType):
            known = ", ".join([*ReportType, *REPORT_TYPE_STAND_INS])
            error = f"unknown report_type {str(asked).strip()[:64]!r}: the known ones are {known}"
            return {**data, "report_type": ReportType.research_report, "report_type_error": error}
        return data

    @field_validator("task", mode="before")
    @classmethod
    def _strip_task(cls, value: object) -> object:
        return value.strip() if isinstance(value, str) else value

    @field_validator("report_type", mode="before")
    @classmethod
    def _report_type(cls, value: object) -> object:
        if value is None or value == "":
            return ReportType.research_report
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("report_source", mode="before")
    @classmethod
    def _lower_enum(cls, value: object) -> object:
        if value == "":
            return None
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("existing_headers", "draft_section_titles", mode="before")
    @classmethod
    def _headers_text(cls, value: object) -> object:
        """Section titles as GPT-Researcher sends them: strings, or objects whose values are titles."""
        if value is None:
            return []
        if not isinstance(value, list):
            return value
        found: list[object] = []
        for item in value:
            if isinstance(item, dict):
                found.extend(str(v) for v in item.values() if isinstance(v, str | int | float))
            else:
                found.append(item)
        return found

    @field_validator("custom_prompt", "parent_query", mode="before")
    @classmethod
    def _optional_prose(cls, value: object) -> object:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        return value.strip() if isinstance(value, str) else value

    @field_validator("tone", "language", "agent", mode="before")
    @classmethod
    def _optional_text(cls, value: object) -> object:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        return value.strip() if isinstance(value, str) else str(value)

    @field_validator("citation_style", mode="before")
    @classmethod
    def _citation_style(cls, value: object) -> object:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        return style_name(value) if isinstance(value, str) else value

    @field_validator("complement_source_urls", "detach", mode="before")
    @classmethod
    def _flag(cls, value: object) -> object:
        return False if value is None or value == "" else value

    @field_validator("source_urls", "document_urls", "query_domains", mode="before")
    @classmethod
    def _none_is_empty(cls, value: object) -> object:
        if value is None:
            return []
        return split_commas(value) if isinstance(value, str) else value

    @field_validator("headers", mode="before")
    @classmethod
    def _headers_object(cls, value: object) -> object:
        if isinstance(value, dict) and value.get("user_id") not in (None, ""):
            value = {**value, "user_id": checked_user_id(value["user_id"])}
        return {} if value is None else value

    def header(self, name: str) -> str | None:
        """A header as a trimmed string, or None when absent or blank."""
        value = self.headers.get(name)
        if value is None:
            return None
        text = str(value).strip()
        return text or None


SourceKind = Literal["library", "knowledge", "scholarly", "web"]
SOURCE_KINDS: tuple[SourceKind, ...] = ("library", "knowledge", "scholarly", "web")  # the order reports use


class SearchResult(BaseModel):
    """One normalized result; `href` and `body` are what every consumer relies on.

    `kind` is the kind of upstream that found it (the runner sets it from the adapter's `About`);
    `cosine` is the library's similarity to the question, when the library found it.
    """

    href: str
    body: str
    title: str = ""
    score: float | None = Field(None, ge=0.0, le=1.0)
    retriever: str
    rank: int = Field(ge=1)
    kind: SourceKind = "web"
    cosine: float | None = None
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
    kinds: list[SourceKind] = Field(default_factory=list)
    cosine: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def kind(self) -> SourceKind:
        """The kind a report files it under: the user's own sources first, then the scholarly record."""
        return next((kind for kind in SOURCE_KINDS if kind in self.kinds), "web")
