"""PubMed through NCBI's E-utilities: `esearch.fcgi` finds PMIDs, then `efetch.fcgi` (XML) returns
their titles, authors, journals, years, DOIs and abstracts (esummary carries no abstract).

NCBI asks every client to send `tool` and `email`, and allows 3 requests/s, or 10 with `api_key`;
`About.rate` follows the key, and the runner keeps every task of the process under it (one search is
two requests). Both steps answer XML; errors come as `<ERROR>` elements or, for the rate limit, a
429 with a small JSON body.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import replace
from typing import Any

from pydantic import Field, SecretStr

from fedresearch.core.settings import secret
from fedresearch.federation.contract import (
    About,
    Answer,
    Hits,
    HttpAnswer,
    HttpRequest,
    RetrieverFailed,
    SearchOptions,
    UpstreamSettings,
)
from fedresearch.federation.ratelimit import Rate
from fedresearch.retrievers.scholarly import Paper, papers_to_hits, parse_xml, xml_text, year_of


class PubMedSettings(UpstreamSettings):
    """PubMed's: the optional API key, the `email` and `tool` NCBI asks for, and where E-utilities are."""

    pubmed_api_key: SecretStr | None = Field(None, validation_alias="PUBMED_API_KEY")
    pubmed_email: str | None = Field(None, validation_alias="PUBMED_EMAIL")
    pubmed_tool: str = Field("fedresearch", validation_alias="PUBMED_TOOL")
    pubmed_api_base_url: str = Field("https://eutils.ncbi.nlm.nih.gov", validation_alias="PUBMED_API_BASE_URL")


about = About(  # keyless; with PUBMED_API_KEY, the keyed rate replaces it
    website="https://www.ncbi.nlm.nih.gov/books/NBK25497/",
    kind="scholarly",
    needs_key=False,
    needs_user=False,
    results="XML",
    rate=Rate(3),
    settings=PubMedSettings,
)
_KEYED = replace(about, rate=Rate(10))

ESEARCH = "/entrez/eutils/esearch.fcgi"
EFETCH = "/entrez/eutils/efetch.fcgi"
_RETMAX = 100


def _identity(settings: PubMedSettings) -> dict[str, str]:
    params = {"tool": settings.pubmed_tool}
    if settings.pubmed_email:
        params["email"] = settings.pubmed_email
    if api_key := secret(settings.pubmed_api_key):
        params["api_key"] = api_key
    return params


def build_request(options: SearchOptions, settings: PubMedSettings) -> HttpRequest:
    params = {"db": "pubmed", "term": options.query, "retmax": str(min(options.max_results, _RETMAX))}
    params["sort"] = "relevance"
    url = settings.pubmed_api_base_url.rstrip("/") + ESEARCH
    return HttpRequest("GET", url, params={**params, **_identity(settings)})


def fetch_request(search: HttpRequest, pmids: list[str]) -> HttpRequest:
    """The second step: efetch for the PMIDs esearch found, with the same identity parameters."""
    assert search.params is not None
    identity = {name: value for name, value in search.params.items() if name in ("tool", "email", "api_key")}
    params = {"db": "pubmed", "id": ",".join(pmids), "retmode": "xml", "rettype": "abstract", **identity}
    return HttpRequest("GET", search.url.replace(ESEARCH, EFETCH), params=params)


def _authors(article: ET.Element) -> list[str]:
    names = []
    for author in article.findall("AuthorList/Author"):
        name = " ".join(
            xml_text(author.find(part)) for part in ("ForeName", "LastName") if author.find(part) is not None
        )
        names.append(name or xml_text(author.find("CollectiveName")))
    return [name for name in names if name]


def _abstract(article: ET.Element) -> str:
    parts = []
    for text in article.findall("Abstract/AbstractText"):
        label = text.get("Label")
        parts.append(f"{label}: {xml_text(text)}" if label else xml_text(text))
    return " ".join(parts)


def _paper(record: ET.Element) -> Paper | None:
    citation, article = record.find("MedlineCitation"), record.find("MedlineCitation/Article")
    if citation is None or article is None:
        return None
    pmid = xml_text(citation.find("PMID"))
    ids = {item.get("IdType"): xml_text(item) for item in record.findall("PubmedData/ArticleIdList/ArticleId")}
    issue = article.find("Journal/JournalIssue/PubDate")
    year = year_of(xml_text(issue.find("Year")) or xml_text(issue.find("MedlineDate"))) if issue is not None else None
    doi = ids.get("doi") or next(
        (xml_text(e) for e in article.findall("ELocationID") if e.get("EIdType") == "doi"), None
    )
    return Paper(
        title=xml_text(article.find("ArticleTitle")),
        url=f"https://pubmed.ncbi.nlm.nih.gov/{pmid}/" if pmid else None,
        doi=doi,
        authors=_authors(article),
        year=year,
        venue=xml_text(article.find("Journal/Title")) or None,
        abstract=_abstract(article),
        extra={"pmid": pmid or None, "pmcid": ids.get("pmc")},
    )


def parse_response(payload: Any, request: HttpRequest, retriever: str = "pubmed") -> Hits:
    root = parse_xml(payload, "PubMed")
    if root.tag == "eSearchResult":
        if (error := root.find("ERROR")) is not None:
            raise RetrieverFailed(f"PubMed rejected the search: {xml_text(error)}")
        pmids = [xml_text(item) for item in root.findall("IdList/Id") if xml_text(item)]
        return Hits(follow=[fetch_request(request, pmids)] if pmids else [])
    if root.tag != "PubmedArticleSet":
        raise RetrieverFailed(f"PubMed answered unexpected XML <{root.tag}>")
    results, warnings = papers_to_hits(
        [_paper(record) for record in root.findall("PubmedArticle")], retriever, "PubMed"
    )
    return Hits(results, warnings)


def describe_error(status: int, payload: Any) -> str:
    try:
        body = json.loads(payload) if isinstance(payload, str) and payload.lstrip().startswith("{") else {}
    except json.JSONDecodeError:
        body = {}
    error = body.get("error") if isinstance(body, dict) else None  # its `api-key` field is our address: not shown
    if status == 429:
        return "PubMed rate limit exceeded (429): 3 requests/s without PUBMED_API_KEY, 10 with one"
    return f"PubMed answered HTTP {status}" + (f": {error}" if isinstance(error, str) else "")


class PubMed:
    name = "pubmed"
    label = "PubMed"

    def __init__(self, settings: PubMedSettings) -> None:
        self.settings = settings
        self.about = _KEYED if secret(settings.pubmed_api_key) else about

    def missing_setup(self) -> str | None:
        return None

    def build_request(self, options: SearchOptions) -> HttpRequest:
        return build_request(options, self.settings)

    def parse_response(self, answer: Answer, options: SearchOptions) -> Hits:
        assert isinstance(answer, HttpAnswer)
        return parse_response(answer.payload, answer.request, self.name)

    def describe_error(self, answer: HttpAnswer) -> str:
        return describe_error(answer.status, answer.payload)


def adapters(settings: PubMedSettings) -> list[PubMed]:
    return [PubMed(settings)]
