"""The server's operator settings, read from the environment or `.env` (the names are a contract with
operators: `.env.example` lists each one with its default). Each upstream declares its own settings
(`UpstreamSettings` in federation/contract.py), read the same way through `Settings.upstream`."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import urlsplit

import platformdirs
from pydantic import Field, PrivateAttr, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from fedresearch.core.citation_styles import DEFAULT_STYLE, style_name
from fedresearch.core.redis import SentinelAddress, is_sentinel_url
from fedresearch.core.text import split_commas

CommaList = Annotated[list[str], NoDecode]
Part = TypeVar("Part", bound=BaseSettings)

# How every settings class reads its values: given ones first, then the environment, then `.env`;
# a field is given by its name or its environment name, and names of other classes' are ignored.
SETTINGS_SOURCES = SettingsConfigDict(env_file=".env", extra="ignore", populate_by_name=True)


def _split_commas(value: object) -> object:
    return split_commas(value) if isinstance(value, str) else value


def load_toml(path: Path, setting: str) -> dict[str, Any]:
    """An operator's TOML file, or a ValueError naming the setting that points at it."""
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ValueError(f"{setting} ({path}): {error}") from error


def default_data_dir() -> Path:
    """The platform's folder for this user's data (platformdirs: XDG on Linux, Application Support
    on macOS, AppData on Windows)."""
    return Path(platformdirs.user_data_dir("fedresearch", appauthor=False))


# where data went before the platform's folder was the default: the folder the process started in
_OLD_DEFAULT = Path("data")


class Settings(BaseSettings):
    """The server's own settings, and what reads each upstream's (`upstream`): values given for upstreams
    (`upstreams=`, by field name) and the way these were read (`_env_file=None`: no `.env`) carry over."""

    model_config = SETTINGS_SOURCES

    host: str = Field("127.0.0.1", validation_alias="FEDRESEARCH_HOST")
    port: int = Field(8000, validation_alias="FEDRESEARCH_PORT")
    workers: int | Literal["auto"] = Field(1, validation_alias="FEDRESEARCH_WORKERS")
    # threads per process that write reports, read pages' text and save files (core/work.py says why
    # so few); unset: 1, or 2 with the embedding model
    work_threads: int | None = Field(None, ge=1, le=64, validation_alias="WORK_THREADS")
    redis_url: SecretStr | None = Field(None, validation_alias="FEDRESEARCH_REDIS_URL")
    # that URL is one node of a Redis or Valkey Cluster (managed ones in cluster mode included)
    redis_cluster: bool = Field(False, validation_alias="FEDRESEARCH_REDIS_CLUSTER")
    # with jobs in Redis: how long a worker unheard of (killed, its host lost) is taken to run its jobs
    # still; then another worker ends them, failed, and their followers are told
    worker_lease_s: float = Field(20.0, ge=1, le=3600, validation_alias="WORKER_LEASE_S")
    # SIGTERM (a deploy, a restart): how long the tasks running in a process may go on to their
    # reports while it takes no new ones; those still running then are stopped
    shutdown_grace_s: float = Field(25.0, ge=0, le=3600, validation_alias="SHUTDOWN_GRACE_S")
    # unset: the platform's folder for a user's data (~/.local/share/fedresearch on Linux), the same
    # whichever folder the server or the CLI is started from
    data_dir: Path = Field(default_factory=lambda: default_data_dir(), validation_alias="FEDRESEARCH_DATA_DIR")
    # unset: the embedded library under data_dir; postgresql://…: on PostgreSQL (secret: it may hold a password)
    library_url: SecretStr | None = Field(None, validation_alias="FEDRESEARCH_LIBRARY_URL")
    # that URL is a pooler in transaction mode (PgBouncer, Supavisor): no prepared statements, and
    # no session settings, as consecutive transactions may run on different server connections
    library_transaction_pooling: bool = Field(False, validation_alias="FEDRESEARCH_LIBRARY_TRANSACTION_POOLING")
    # the embedded library: how much of its users' passage vectors a process keeps in memory (the
    # least recently searched user's go first; a user beyond it alone is kept while searched)
    library_vector_cache_mb: int = Field(512, ge=1, validation_alias="LIBRARY_VECTOR_CACHE_MB")
    default_retrievers: CommaList = Field(["library"], validation_alias="DEFAULT_RETRIEVERS")
    default_user: str | None = Field(None, validation_alias="FEDRESEARCH_DEFAULT_USER")
    retriever_timeout_s: float = Field(10.0, gt=0, validation_alias="RETRIEVER_TIMEOUT_S")
    task_timeout_s: float = Field(60.0, gt=0, validation_alias="TASK_TIMEOUT_S")
    retriever_weights: dict[str, float] = Field(
        default_factory=dict,
        validation_alias="RETRIEVER_WEIGHTS",
        description="name=weight pairs for fusion, e.g. 'internal_biblio=1.5,google=0.8'",
    )
    max_search_results: int = Field(10, ge=1, le=50, validation_alias="MAX_SEARCH_RESULTS")
    embeddings: bool = Field(True, validation_alias="FEDRESEARCH_EMBEDDINGS")
    # where the embedding model's ONNX graph is written once and mapped by every process of the
    # host (unset: the user's cache folder's `models`); each process holds its own copy when it cannot write
    model_cache_dir: Path | None = Field(None, validation_alias="FEDRESEARCH_MODEL_CACHE_DIR")

    # reading the pages behind web results (and source_urls)
    fetch_pages: bool = Field(True, validation_alias="FETCH_PAGES")
    fetch_allowed_hosts: CommaList = Field([], validation_alias="FETCH_ALLOWED_HOSTS")
    fetch_max_pages: int = Field(8, ge=0, le=50, validation_alias="FETCH_MAX_PAGES")
    fetch_max_bytes: int = Field(5_000_000, ge=1024, validation_alias="FETCH_MAX_BYTES")
    fetch_timeout_s: float = Field(8.0, gt=0, validation_alias="FETCH_TIMEOUT_S")
    fetch_per_host: int = Field(2, ge=1, le=16, validation_alias="FETCH_PER_HOST")

    # origins whose pages may call this server from a browser (CORS): GPT-Researcher's NextJS app
    # runs at http://localhost:3000; any other origin's pages are refused by the browser
    cors_allow_origins: CommaList = Field(["http://localhost:3000"], validation_alias="CORS_ALLOW_ORIGINS")

    # limits
    max_frame_bytes: int = Field(65536, ge=1024, validation_alias="MAX_FRAME_BYTES")
    max_task_chars: int = Field(2000, ge=10, validation_alias="MAX_TASK_CHARS")
    upstream_max_bytes: int = Field(5_000_000, ge=1024, validation_alias="UPSTREAM_MAX_BYTES")
    max_tasks_per_key: int = Field(4, ge=1, validation_alias="MAX_TASKS_PER_KEY")
    max_queries_per_key: int = Field(32, ge=1, validation_alias="MAX_QUERIES_PER_KEY")
    ingest_max_file_mb: float = Field(100.0, gt=0, validation_alias="INGEST_MAX_FILE_MB")
    # one upload's files in all (the temporary disk it may take), and a key's uploads at once
    ingest_max_upload_mb: float = Field(500.0, gt=0, validation_alias="INGEST_MAX_UPLOAD_MB")
    max_uploads_per_key: int = Field(2, ge=1, validation_alias="MAX_UPLOADS_PER_KEY")

    # upstream faults
    retry_attempts: int = Field(2, ge=0, le=10, validation_alias="RETRY_ATTEMPTS")
    breaker_suspend_s: float = Field(180.0, ge=0, validation_alias="BREAKER_SUSPEND_S")
    breaker_error_threshold: int = Field(3, ge=1, validation_alias="BREAKER_ERROR_THRESHOLD")
    breaker_error_suspend_s: float = Field(30.0, ge=0, validation_alias="BREAKER_ERROR_SUSPEND_S")
    breaker_error_askers: int = Field(2, ge=1, validation_alias="BREAKER_ERROR_ASKERS")
    upstream_cache_ttl_s: float = Field(600.0, ge=0, validation_alias="UPSTREAM_CACHE_TTL_S")

    # hosts a client may name in headers.internal_api_base_url: request planning checks them, so the
    # setting is the server's, not the literature API adapter's (which has its own settings)
    internal_api_allowed_hosts: CommaList = Field([], validation_alias="INTERNAL_API_ALLOWED_HOSTS")

    # the LLM writer (unset: the extractive writer)
    llm_base_url: str | None = Field(None, validation_alias="LLM_BASE_URL")
    llm_api_key: SecretStr | None = Field(None, validation_alias="LLM_API_KEY")
    llm_model: str | None = Field(None, validation_alias="LLM_MODEL")
    llm_allowed_models: CommaList = Field([], validation_alias="LLM_ALLOWED_MODELS")
    llm_timeout_s: float = Field(30.0, gt=0, validation_alias="LLM_TIMEOUT_S")
    llm_max_retries: int = Field(2, ge=0, le=10, validation_alias="LLM_MAX_RETRIES")
    # a report's answer from the model, thinking included: past it the extractive writer finishes
    llm_max_answer_chars: int = Field(200_000, ge=1000, validation_alias="LLM_MAX_ANSWER_CHARS")
    # what one request to the model may hold, prompt and answer together: its server's context (8k:
    # small local models); a report is written section by section within it (report/tokens.py)
    llm_context_tokens: int = Field(8192, ge=2048, validation_alias="LLM_CONTEXT_TOKENS")
    # the page of PDF and DOCX exports
    report_page_size: Literal["A4", "Letter"] = Field("A4", validation_alias="REPORT_PAGE_SIZE")
    # the CSL style of every report's References (a task's `citation_style` overrides it)
    citation_style: str = Field(DEFAULT_STYLE, validation_alias="CITATION_STYLE")
    # PDF and DOCX files made at once (each in a process of its own; one per user at a time), how long
    # one may take and the memory it may use: past either it fails with a reason, the server unharmed
    export_processes: int = Field(2, ge=1, le=64, validation_alias="EXPORT_PROCESSES")
    export_timeout_s: float = Field(60.0, gt=0, validation_alias="EXPORT_TIMEOUT_S")
    export_memory_mb: int = Field(1024, ge=100, validation_alias="EXPORT_MEMORY_MB")
    report_support_threshold: float = Field(0.5, gt=0, le=1, validation_alias="REPORT_SUPPORT_THRESHOLD")
    deep_research_breadth: int = Field(3, ge=1, le=8, validation_alias="DEEP_RESEARCH_BREADTH")
    deep_research_depth: int = Field(2, ge=1, le=4, validation_alias="DEEP_RESEARCH_DEPTH")

    api_keys: SecretStr | None = Field(None, validation_alias="FEDRESEARCH_API_KEYS")
    api_keys_file: Path | None = Field(None, validation_alias="FEDRESEARCH_API_KEYS_FILE")
    knowledge_bases: Path | None = Field(None, validation_alias="FEDRESEARCH_KNOWLEDGE_BASES")
    webhook_url: str | None = Field(None, validation_alias="WEBHOOK_URL")
    webhook_api_key: SecretStr | None = Field(None, validation_alias="WEBHOOK_API_KEY")
    webhook_attempts: int = Field(5, ge=1, le=20, validation_alias="WEBHOOK_ATTEMPTS")
    webhook_backoff_s: float = Field(1.0, ge=0, validation_alias="WEBHOOK_BACKOFF_S")
    report_retention_days: float = Field(30.0, ge=0, validation_alias="REPORT_RETENTION_DAYS")
    report_max_per_user: int = Field(200, ge=0, validation_alias="REPORT_MAX_PER_USER")

    _split = field_validator(
        "default_retrievers",
        "internal_api_allowed_hosts",
        "fetch_allowed_hosts",
        "llm_allowed_models",
        "cors_allow_origins",
        mode="before",
    )(staticmethod(_split_commas))

    # not fields: nothing here is read from the environment, and only `upstream` hands them on
    _upstream_values: dict[str, Any] = PrivateAttr(default_factory=dict)
    _sources: dict[str, Any] = PrivateAttr(default_factory=dict)

    def __init__(self, *, upstreams: Mapping[str, Any] | None = None, **values: Any) -> None:
        super().__init__(**values)
        self._upstream_values = dict(upstreams or {})
        # pydantic-settings' init options (`_env_file`, `_env_file_encoding`, ...) say where values come from
        self._sources = {name: value for name, value in values.items() if name.startswith("_")}

    def upstream(self, settings: type[Part]) -> Part:
        """One upstream's settings, read as these were (the same `.env`, or none), with the values
        given for its fields in `upstreams`."""
        given = {name: value for name, value in self._upstream_values.items() if name in settings.model_fields}
        return settings(**self._sources, **given)

    @field_validator("default_retrievers", mode="after")
    @classmethod
    def _lower_names(cls, names: list[str]) -> list[str]:
        return [name.lower() for name in names]

    @field_validator("internal_api_allowed_hosts", "fetch_allowed_hosts", mode="after")
    @classmethod
    def _lower_hosts(cls, hosts: list[str]) -> list[str]:
        return [host.lower() for host in hosts]

    @field_validator("retriever_weights", mode="before")
    @classmethod
    def _parse_weights(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        weights: dict[str, float] = {}
        for pair in split_commas(value):
            name, sep, weight = pair.partition("=")
            if not sep:
                raise ValueError(f"RETRIEVER_WEIGHTS entry {pair!r} is not name=weight")
            weights[name.strip().lower()] = float(weight)
        return weights

    @field_validator("data_dir", mode="before")
    @classmethod
    def _data_dir(cls, value: object) -> object:
        return default_data_dir() if value in ("", None) else value

    @field_validator(
        "default_user",
        "webhook_url",
        "api_keys_file",
        "knowledge_bases",
        "llm_base_url",
        "llm_model",
        "model_cache_dir",
        "work_threads",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator(
        "api_keys",
        "webhook_api_key",
        "llm_api_key",
        "redis_url",
        "library_url",
        mode="before",
    )
    @classmethod
    def _empty_secret_is_unset(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("citation_style", mode="after")
    @classmethod
    def _citation_style(cls, value: str) -> str:
        return style_name(value)

    @field_validator("workers", mode="before")
    @classmethod
    def _workers(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        if isinstance(value, str | int) and not isinstance(value, bool) and int(value) < 1:
            raise ValueError("FEDRESEARCH_WORKERS is a number of processes (1 or more) or 'auto'")
        return value

    @property
    def reports_dir(self) -> Path:
        return self.data_dir / "reports"

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir / "jobs"

    @property
    def library_dir(self) -> Path:
        return self.data_dir / "library"

    @property
    def models_dir(self) -> Path:
        """Where the encoder's graph is written once (derived from the installed model, so a cache:
        every library and data folder of the user's shares it)."""
        return self.model_cache_dir or Path(platformdirs.user_cache_dir("fedresearch", appauthor=False)) / "models"

    def left_behind(self) -> str | None:
        """A hint when a library sits in ./data, where earlier versions kept it, and this process
        uses another folder: its documents would seem lost."""
        old = _OLD_DEFAULT / "library"
        if not old.is_dir() or _OLD_DEFAULT.resolve() == self.data_dir.resolve():
            return None
        return (
            f"a library from an earlier version is in {_OLD_DEFAULT.resolve()}, and this one uses "
            f"{self.data_dir}: move it there (mv {_OLD_DEFAULT.resolve()}/* {self.data_dir}/), or set "
            f"FEDRESEARCH_DATA_DIR={_OLD_DEFAULT.resolve()}"
        )

    @property
    def library_display(self) -> str:
        """Where the library lives, fit to show: the embedded library's folder, or the PostgreSQL
        server without its password."""
        if self.library_url is None:
            return str(self.library_dir.resolve())
        parts = urlsplit(self.library_url.get_secret_value())
        return f"{parts.scheme}://{parts.hostname or 'localhost'}:{parts.port or 5432}{parts.path}"

    @property
    def library_location(self) -> Path | str:
        """Where the library lives: the embedded library's folder, or FEDRESEARCH_LIBRARY_URL."""
        return self.library_url.get_secret_value() if self.library_url is not None else self.library_dir

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and is_sentinel_url(value.get_secret_value()):
            SentinelAddress.parse(value.get_secret_value())  # a malformed one says what the form is
        return value

    @field_validator("redis_cluster")
    @classmethod
    def _one_way_to_redis(cls, cluster: bool, info: ValidationInfo) -> bool:
        # a field's error shows its own value only: a model's would show every setting given
        url = info.data.get("redis_url")
        if cluster and isinstance(url, SecretStr) and is_sentinel_url(url.get_secret_value()):
            raise ValueError("FEDRESEARCH_REDIS_CLUSTER=true and a redis+sentinel:// URL exclude each other")
        return cluster

    @field_validator("library_url")
    @classmethod
    def _postgres_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().startswith(("postgresql://", "postgres://")):
            raise ValueError("FEDRESEARCH_LIBRARY_URL must be a postgresql:// URL (unset: the embedded library)")
        return value


def secret(value: SecretStr | None) -> str | None:
    return value.get_secret_value() if value is not None else None
