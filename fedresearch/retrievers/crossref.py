"""Crossref's REST API: `GET {CROSSREF_API_BASE_URL}/works?query=...&rows=N`.

With `CROSSREF_MAILTO` set, requests carry `mailto` and join the polite pool (10 requests/s, 3 at a
time, against the public pool's 5 and 1); every answer restates the limit in `x-rate-limit-limit`,
`x-rate-limit-interval` and `x-concurrency-limit`, and the runner's limiter holds all tasks to it.
Abstracts arrive as JATS XML; a `link` to a PDF counts as open access only under a Creative Commons
license.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from pydantic import Field

from fedresearch.core.text import author_names
from fedresearch.federation.contract import (
    About,
    Answer,
    Hits,
    HttpAnswer,
    HttpRequest,
    RetrieverFailed,
    SearchOptions,
    UpstreamSettings,
    first_text,
)
from fedresearch.federation.ratelimit import Rate
from fedresearch.retrievers.scholarly import Paper, papers_to_hits


class CrossrefSettings(UpstreamSettings):
    """Crossref's: the address that joins the polite pool, and where the API is."""

    crossref_mailto: str | None = Field(None, validation_alias="CROSSREF_MAILTO")
    crossref_api_base_url: str = Field("https://api.crossref.org", validation_alias="CROSSREF_API_BASE_URL")


about = About(  # the public pool's; with CROSSREF_MAILTO, the polite pool's rate replaces it
    website="https://www.crossref.org/documentation/retrieve-metadata/rest-api/",
    kind="scholarly",
    needs_key=False,
    needs_user=False,
    rate=Rate(5, connections=1),
    settings=CrossrefSettings,
)
_POLITE = replace(about, rate=Rate(10, connections=3))

PATH = "/works"
_MAX_ROWS = 100
_JATS_HEADING = re.compile(r"<jats:title>.*?</jats:title>", re.DOTALL)  # "Abstract" is not the abstract
_FIELDS = "DOI,title,author,issued,published,container-title,abstract,URL,link,license,type"


def build_request(options: SearchOptions, base_url: str, mailto: str | None) -> HttpRequest:
    params = {"query": options.query, "rows": str(min(options.max_results, _MAX_ROWS)), "select": _FIELDS}
    if mailto:
        params["mailto"] = mailto
    return HttpRequest("GET", base_url.rstrip("/") + PATH, params=params)


def _first(value: object) -> str | None:
    return first_text({"v": value[0]}, ("v",)) if isinstance(value, list) and value else None


def _year(item: dict[str, Any]) -> int | None:
    for name in ("issued", "published"):
        parts = (item.get(name) or {}).get("date-parts") if isinstance(item.get(name), dict) else None
        if isinstance(parts, list) and parts and isinstance(parts[0], list) and parts[0]:
            year = parts[0][0]
            if isinstance(year, int):
                return year
    return None


def _open_pdf(item: dict[str, Any]) -> str | None:
    licensed = any("creativecommons.org" in str(entry.get("URL", "")) for entry in item.get("license") or [])
    links = [link for link in item.get("link") or [] if isinstance(link, dict)]
    pdf = next((link.get("URL") for link in links if link.get("content-type") == "application/pdf"), None)
    return pdf if licensed and isinstance(pdf, str) else None


def _paper(item: Any) -> Paper | None:
    if not isinstance(item, dict):
        return None
    return Paper(
        title=_first(item.get("title")) or "",
        url=first_text(item, ("URL",)),
        doi=first_text(item, ("DOI",)),
        authors=author_names(item.get("author")),
        year=_year(item),
        venue=_first(item.get("container-title")),
        abstract=_JATS_HEADING.sub(" ", first_text(item, ("abstract",)) or ""),
        pdf_url=_open_pdf(item),
        extra={"work_type": item.get("type")},
    )


def parse_response(payload: Any, retriever: str = "crossref") -> Hits:
    message = payload.get("message") if isinstance(payload, dict) else None
    items = message.get("items") if isinstance(message, dict) else None
    if not isinstance(items, list):
        raise RetrieverFailed("Crossref answered JSON without message.items")
    results, warnings = papers_to_hits([_paper(item) for item in items], retriever, "Crossref")
    return Hits(results, warnings)


def describe_error(status: int, payload: Any) -> str:
    if status == 429:
        return "Crossref rate limit exceeded (429): set CROSSREF_MAILTO for the polite pool"
    reasons = payload.get("message") if isinstance(payload, dict) else None
    if isinstance(reasons, list):
        text = "; ".join(str(reason.get("message")) for reason in reasons if isinstance(reason, dict))
        return f"Crossref rejected the request ({status}): {text}"
    return f"Crossref answered HTTP {status}"


class Crossref:
    name = "crossref"
    label = "Crossref"

    def __init__(self, settings: CrossrefSettings) -> None:
        self.settings = settings
        self.about = _POLITE if settings.crossref_mailto else about

    def missing_setup(self) -> str | None:
        return None

    def build_request(self, options: SearchOptions) -> HttpRequest:
        return build_request(options, self.settings.crossref_api_base_url, self.settings.crossref_mailto)

    def parse_response(self, answer: Answer, options: SearchOptions) -> Hits:
        assert isinstance(answer, HttpAnswer)
        return parse_response(answer.payload, self.name)

    def describe_error(self, answer: HttpAnswer) -> str:
        return describe_error(answer.status, answer.payload)


def adapters(settings: CrossrefSettings) -> list[Crossref]:
    return [Crossref(settings)]
