"""Europe PMC's REST search: `GET {EUROPEPMC_API_BASE_URL}/europepmc/webservices/rest/search?query=...
&format=json&resultType=core` (keyless). `core` results carry the abstract and the full-text links,
among them the open-access PDF. No rate is published; the adapter keeps to 10 requests/s.
"""

from __future__ import annotations

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
from fedresearch.retrievers.scholarly import Paper, as_dict, papers_to_hits, year_of


class EuropePmcSettings(UpstreamSettings):
    """Europe PMC's: where the API is."""

    europepmc_api_base_url: str = Field("https://www.ebi.ac.uk", validation_alias="EUROPEPMC_API_BASE_URL")


about = About(
    website="https://europepmc.org/RestfulWebService",
    kind="scholarly",
    needs_key=False,
    needs_user=False,
    rate=Rate(10),
    settings=EuropePmcSettings,
)

PATH = "/europepmc/webservices/rest/search"
_PAGE_SIZE = 100


def build_request(options: SearchOptions, base_url: str) -> HttpRequest:
    params = {
        "query": options.query,
        "format": "json",
        "resultType": "core",
        "pageSize": str(min(options.max_results, _PAGE_SIZE)),
    }
    return HttpRequest("GET", base_url.rstrip("/") + PATH, params=params)


def _open_pdf(item: dict[str, Any]) -> str | None:
    for link in as_dict(item.get("fullTextUrlList")).get("fullTextUrl") or []:
        link = as_dict(link)
        if link.get("documentStyle") == "pdf" and link.get("availabilityCode") in ("OA", "F"):
            return first_text(link, ("url",))
    return None


def _paper(item: Any) -> Paper | None:
    if not isinstance(item, dict):
        return None
    source, ident = first_text(item, ("source",)), first_text(item, ("id",))
    authors = author_names([as_dict(a).get("fullName") for a in as_dict(item.get("authorList")).get("author") or []])
    journal = as_dict(as_dict(item.get("journalInfo")).get("journal"))
    return Paper(
        title=first_text(item, ("title",)) or "",
        url=f"https://europepmc.org/article/{source}/{ident}" if source and ident else None,
        doi=first_text(item, ("doi",)),
        authors=authors or author_names(str(item.get("authorString") or "").replace(",", ";")),
        year=year_of(item.get("pubYear")),
        venue=first_text(journal, ("title",)) or first_text(item, ("journalTitle", "bookOrReportDetails")),
        abstract=first_text(item, ("abstractText",)),
        pdf_url=_open_pdf(item),
        extra={"pmid": first_text(item, ("pmid",)), "pmcid": first_text(item, ("pmcid",))},
    )


def parse_response(payload: Any, retriever: str = "europepmc") -> Hits:
    result_list = as_dict(payload).get("resultList")
    items = as_dict(result_list).get("result")
    if not isinstance(items, list):
        raise RetrieverFailed("Europe PMC answered JSON without resultList.result")
    results, warnings = papers_to_hits([_paper(item) for item in items], retriever, "Europe PMC")
    return Hits(results, warnings)


def describe_error(status: int, payload: Any) -> str:
    return f"Europe PMC answered HTTP {status}"


class EuropePmc:
    name = "europepmc"
    label = "Europe PMC"
    about = about

    def __init__(self, settings: EuropePmcSettings) -> None:
        self.settings = settings

    def missing_setup(self) -> str | None:
        return None

    def build_request(self, options: SearchOptions) -> HttpRequest:
        return build_request(options, self.settings.europepmc_api_base_url)

    def parse_response(self, answer: Answer, options: SearchOptions) -> Hits:
        assert isinstance(answer, HttpAnswer)
        return parse_response(answer.payload, self.name)

    def describe_error(self, answer: HttpAnswer) -> str:
        return describe_error(answer.status, answer.payload)


def adapters(settings: EuropePmcSettings) -> list[EuropePmc]:
    return [EuropePmc(settings)]
