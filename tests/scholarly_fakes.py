"""Fake scholarly and web upstreams: real HTTP servers on 127.0.0.1 answering the shapes OpenAlex,
Crossref, arXiv, Semantic Scholar, PubMed E-utilities, Europe PMC, SearxNG and Brave answer (read
from their documentation and from SearxNG's engines), errors, empty results, 429s with and without
Retry-After and malformed bodies included.

One real paper runs through them all: Dense Passage Retrieval (arXiv 2004.04906, published at
EMNLP 2020 as 10.18653/v1/2020.emnlp-main.550).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from xml.sax.saxutils import escape

from aiohttp import web

from tests.fakes import FakeUpstream

DPR_DOI = "10.18653/v1/2020.emnlp-main.550"
DPR_ARXIV = "2004.04906"
DPR_TITLE = "Dense Passage Retrieval for Open-Domain Question Answering"
DPR_ABSTRACT = (
    "Open-domain question answering relies on efficient passage retrieval to select candidate contexts, "
    "where traditional sparse vector space models, such as TF-IDF or BM25, are the de facto method."
)
DPR_AUTHORS = [("Vladimir", "Karpukhin"), ("Barlas", "Oguz"), ("Sewon", "Min")]


class ScholarlyFake(FakeUpstream):
    """Shared by every fake here: request log with arrival times, in-flight count, common faults."""

    path = "/"

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0
        self.most_in_flight = 0
        self.extra_headers: dict[str, str] = {}

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get(self.path, self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append({"query": dict(request.query), "headers": dict(request.headers), "at": time.monotonic()})
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self._wait()
            mode = self._mode()
            if mode == "429":
                return self.too_many()
            if mode == "500":
                return web.Response(status=500, text="<html><body>Internal Server Error</body></html>")
            response = await self.answer(request, mode)
            response.headers.update(self.extra_headers)
            return response
        finally:
            self.in_flight -= 1

    def too_many(self) -> web.Response:
        return web.Response(status=429, text="Too Many Requests", headers=self._headers())

    async def answer(self, request: web.Request, mode: str) -> web.Response:
        raise NotImplementedError

    def per_second(self) -> int:
        """The most requests that arrived within any one second."""
        times = sorted(entry["at"] for entry in self.requests)
        return max((sum(1 for t in times if start <= t < start + 1.0) for start in times), default=0)


def _inverted(text: str) -> dict[str, list[int]]:
    index: dict[str, list[int]] = {}
    for position, word in enumerate(text.split()):
        index.setdefault(word, []).append(position)
    return index


class FakeOpenAlex(ScholarlyFake):
    path = "/works"
    api_key = "oa-test-key"

    async def answer(self, request: web.Request, mode: str) -> web.Response:
        if mode == "403":
            return web.json_response({"error": "Rate limit exceeded", "message": "Slow down."}, status=403)
        if mode == "malformed":
            return web.Response(text='{"results": [', content_type="application/json")
        works = [] if mode == "empty" else (self.behaviour.items or [dpr_openalex()])
        meta = {"count": len(works), "db_response_time_ms": 12, "page": 1, "per_page": int(request.query["per-page"])}
        return web.json_response({"meta": meta, "results": works, "group_by": []})


def dpr_openalex() -> dict[str, Any]:
    return {
        "id": "https://openalex.org/W3099700870",
        "doi": f"https://doi.org/{DPR_DOI}",
        "title": DPR_TITLE,
        "display_name": DPR_TITLE,
        "publication_year": 2020,
        "ids": {"openalex": "https://openalex.org/W3099700870", "doi": f"https://doi.org/{DPR_DOI}"},
        "primary_location": {
            "is_oa": True,
            "landing_page_url": f"https://doi.org/{DPR_DOI}",
            "pdf_url": "https://www.aclweb.org/anthology/2020.emnlp-main.550.pdf",
            "source": {"id": "https://openalex.org/S4363608991", "display_name": "Proceedings of EMNLP 2020"},
        },
        "best_oa_location": {"is_oa": True, "pdf_url": "https://www.aclweb.org/anthology/2020.emnlp-main.550.pdf"},
        "locations": [
            {"landing_page_url": f"https://doi.org/{DPR_DOI}", "source": None},
            {"landing_page_url": f"https://arxiv.org/abs/{DPR_ARXIV}", "source": {"display_name": "arXiv"}},
        ],
        "authorships": [
            {"author_position": "first", "author": {"id": "https://openalex.org/A1", "display_name": f"{g} {f}"}}
            for g, f in DPR_AUTHORS
        ],
        "cited_by_count": 3000,
        "abstract_inverted_index": _inverted(DPR_ABSTRACT),
    }


class FakeCrossref(ScholarlyFake):
    path = "/works"

    async def answer(self, request: web.Request, mode: str) -> web.Response:
        limits = {"x-rate-limit-limit": "5", "x-rate-limit-interval": "1s", "x-concurrency-limit": "1"}
        if "mailto" in request.query:
            limits = {"x-rate-limit-limit": "10", "x-rate-limit-interval": "1s", "x-concurrency-limit": "3"}
        if mode == "400":
            reason = {"type": "integer-not-valid", "value": "x", "message": "Integer specified as x but must be int"}
            body = {"status": "failed", "message-type": "validation-failure", "message": [reason]}
            return web.json_response(body, status=400, headers=limits)
        if mode == "malformed":
            return web.Response(text='{"status":"ok","message":{', content_type="application/json", headers=limits)
        items = [] if mode == "empty" else (self.behaviour.items or [dpr_crossref()])
        message = {
            "facets": {},
            "total-results": len(items),
            "items": items,
            "items-per-page": int(request.query.get("rows", 20)),
            "query": {"start-index": 0, "search-terms": request.query.get("query")},
        }
        body = {"status": "ok", "message-type": "work-list", "message-version": "1.0.0", "message": message}
        return web.json_response(body, headers=limits)


def dpr_crossref() -> dict[str, Any]:
    return {
        "DOI": DPR_DOI,
        "type": "proceedings-article",
        "title": [DPR_TITLE],
        "author": [{"given": g, "family": f, "sequence": "first", "affiliation": []} for g, f in DPR_AUTHORS],
        "issued": {"date-parts": [[2020]]},
        "published": {"date-parts": [[2020, 11]]},
        "container-title": ["Proceedings of the 2020 Conference on Empirical Methods in Natural Language Processing"],
        "abstract": f"<jats:title>Abstract</jats:title><jats:p>{escape(DPR_ABSTRACT)}</jats:p>",
        "URL": f"https://doi.org/{DPR_DOI}",
        "license": [{"URL": "https://creativecommons.org/licenses/by/4.0/", "content-version": "unspecified"}],
        "link": [
            {
                "URL": "https://www.aclweb.org/anthology/2020.emnlp-main.550.pdf",
                "content-type": "application/pdf",
                "content-version": "vor",
                "intended-application": "text-mining",
            }
        ],
        "score": 31.5,
    }


ATOM_HEAD = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<feed xmlns="http://www.w3.org/2005/Atom" '
    'xmlns:opensearch="http://a9.com/-/spec/opensearch/1.1/" xmlns:arxiv="http://arxiv.org/schemas/atom">'
    '<link href="http://arxiv.org/api/query" rel="self" type="application/atom+xml"/>'
    '<title type="html">ArXiv Query</title><id>http://arxiv.org/api/q</id><updated>2026-11-22T00:00:00-05:00</updated>'
)


def dpr_atom_entry(journal_doi: bool = True) -> str:
    authors = "".join(f"<author><name>{g} {f}</name></author>" for g, f in DPR_AUTHORS)
    doi = f"<arxiv:doi>{DPR_DOI}</arxiv:doi>" if journal_doi else ""
    return (
        f"<entry><id>http://arxiv.org/abs/{DPR_ARXIV}v3</id><updated>2020-09-30T21:00:00Z</updated>"
        f"<published>2020-04-10T17:59:40Z</published><title>Dense Passage Retrieval for Open-Domain\n  Question "
        f"Answering</title><summary>  {escape(DPR_ABSTRACT)}\n</summary>{authors}"
        f"<arxiv:comment>EMNLP 2020</arxiv:comment>{doi}<arxiv:journal_ref>EMNLP 2020</arxiv:journal_ref>"
        f'<link href="http://arxiv.org/abs/{DPR_ARXIV}v3" rel="alternate" type="text/html"/>'
        f'<link title="pdf" href="http://arxiv.org/pdf/{DPR_ARXIV}v3" rel="related" type="application/pdf"/>'
        '<arxiv:primary_category term="cs.CL" scheme="http://arxiv.org/schemas/atom"/>'
        '<category term="cs.CL" scheme="http://arxiv.org/schemas/atom"/></entry>'
    )


class FakeArxiv(ScholarlyFake):
    path = "/api/query"

    async def answer(self, request: web.Request, mode: str) -> web.Response:
        atom = "application/atom+xml; charset=utf-8"
        if mode == "400":
            error = (
                "<entry><id>http://arxiv.org/api/errors#max_results_must_be_an_integer</id><title>Error</title>"
                "<summary>max_results must be an integer</summary><updated>2026-11-22T00:00:00-05:00</updated>"
                '<link href="http://arxiv.org/api/errors#max" rel="alternate" type="text/html"/>'
                "<author><name>arXiv api core</name></author></entry>"
            )
            return web.Response(status=400, text=f"{ATOM_HEAD}{error}</feed>", content_type="application/atom+xml")
        if mode == "malformed":
            return web.Response(text=ATOM_HEAD + "<entry><id>http://arxiv.org/abs/1", headers={"Content-Type": atom})
        if mode == "bomb":
            return web.Response(text=BILLION_LAUGHS, headers={"Content-Type": atom})
        entries = (
            "" if mode == "empty" else (self.behaviour.items[0]["xml"] if self.behaviour.items else dpr_atom_entry())
        )
        total = f"<opensearch:totalResults>{0 if mode == 'empty' else 1}</opensearch:totalResults>"
        return web.Response(text=f"{ATOM_HEAD}{total}{entries}</feed>", headers={"Content-Type": atom})


BILLION_LAUGHS = (
    '<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
    + "".join(f'<!ENTITY lol{i} "{("&lol" + (str(i - 1) if i > 1 else "") + ";") * 10}">' for i in range(1, 10))
    + ']><feed xmlns="http://www.w3.org/2005/Atom"><title>&lol9;</title></feed>'
)


class FakeSemanticScholar(ScholarlyFake):
    path = "/graph/v1/paper/search"
    api_key = "s2-test-key"

    def too_many(self) -> web.Response:
        message = (
            "Too Many Requests. Please wait and try again or apply for a key for higher rate limits. "
            "https://www.semanticscholar.org/product/api#api-key-form"
        )
        return web.json_response({"message": message, "code": "429"}, status=429, headers=self._headers())

    async def answer(self, request: web.Request, mode: str) -> web.Response:
        key = request.headers.get("x-api-key")
        if key is not None and key != self.api_key:
            return web.json_response({"message": "Forbidden"}, status=403)
        if mode == "400":
            return web.json_response({"error": "Unrecognized or unsupported fields: [bogus]"}, status=400)
        if mode == "malformed":
            return web.Response(text="{'data': [", content_type="application/json")
        if mode == "empty":
            return web.json_response({"total": 0, "offset": 0})
        data = self.behaviour.items or [dpr_semantic_scholar()]
        return web.json_response({"total": len(data), "offset": 0, "data": data})


def dpr_semantic_scholar() -> dict[str, Any]:
    return {
        "paperId": "79cd9f77e5258f62c0e15d11534aea6393ef73fe",
        "externalIds": {
            "ArXiv": DPR_ARXIV,
            "DBLP": "conf/emnlp/KarpukhinOMLWEC20",
            "DOI": DPR_DOI,
            "CorpusId": 215737187,
        },
        "url": "https://www.semanticscholar.org/paper/79cd9f77e5258f62c0e15d11534aea6393ef73fe",
        "title": DPR_TITLE,
        "abstract": DPR_ABSTRACT,
        "venue": "Conference on Empirical Methods in Natural Language Processing",
        "year": 2020,
        "openAccessPdf": {"url": "https://www.aclweb.org/anthology/2020.emnlp-main.550.pdf", "status": "HYBRID"},
        "authors": [{"authorId": str(i), "name": f"{g} {f}"} for i, (g, f) in enumerate(DPR_AUTHORS)],
    }


ESEARCH_HEAD = (
    '<?xml version="1.0" encoding="UTF-8" ?>\n<!DOCTYPE eSearchResult PUBLIC "-//NLM//DTD esearch 20060628//EN" '
    '"https://eutils.ncbi.nlm.nih.gov/eutils/dtd/20060628/esearch.dtd">\n'
)
EFETCH_HEAD = (
    '<?xml version="1.0" ?>\n<!DOCTYPE PubmedArticleSet PUBLIC "-//NLM//DTD PubMedArticle, 1st January 2025//EN" '
    '"https://dtd.nlm.nih.gov/ncbi/pubmed/out/pubmed_250101.dtd">\n'
)


def pubmed_article(pmid: str, title: str, doi: str | None = None) -> str:
    doi_id = f'<ArticleId IdType="doi">{doi}</ArticleId>' if doi else ""
    return (
        f'<PubmedArticle><MedlineCitation Status="MEDLINE" Owner="NLM"><PMID Version="1">{pmid}</PMID>'
        '<Article PubModel="Print"><Journal><ISSN IssnType="Electronic">1476-4687</ISSN>'
        '<JournalIssue CitedMedium="Internet"><Volume>596</Volume><PubDate><Year>2021</Year><Month>Aug</Month>'
        f"</PubDate></JournalIssue><Title>Nature</Title></Journal><ArticleTitle>{escape(title)}</ArticleTitle>"
        '<Abstract><AbstractText Label="BACKGROUND">Proteins are <i>essential</i> to life.</AbstractText>'
        '<AbstractText Label="RESULTS">We validate an entirely redesigned version.</AbstractText></Abstract>'
        '<AuthorList CompleteYN="Y"><Author ValidYN="Y"><LastName>Jumper</LastName><ForeName>John</ForeName>'
        '<Initials>J</Initials></Author><Author ValidYN="Y"><CollectiveName>DeepMind Team</CollectiveName></Author>'
        "</AuthorList></Article></MedlineCitation><PubmedData><ArticleIdList>"
        f'<ArticleId IdType="pubmed">{pmid}</ArticleId>{doi_id}<ArticleId IdType="pmc">PMC8371605</ArticleId>'
        "</ArticleIdList></PubmedData></PubmedArticle>"
    )


class FakePubMed(ScholarlyFake):
    api_key = "ncbi-test-key"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/entrez/eutils/esearch.fcgi", self.handle)
        app.router.add_get("/entrez/eutils/efetch.fcgi", self.handle)
        return app

    def too_many(self) -> web.Response:
        body = {"error": "API rate limit exceeded", "api-key": "127.0.0.1", "count": "4", "limit": "3"}
        return web.json_response(body, status=429, headers=self._headers())

    async def answer(self, request: web.Request, mode: str) -> web.Response:
        xml = "text/xml; charset=UTF-8"
        if request.path.endswith("esearch.fcgi"):
            if mode == "error":
                body = "<eSearchResult><ERROR>Invalid query syntax</ERROR></eSearchResult>"
                return web.Response(text=ESEARCH_HEAD + body, headers={"Content-Type": xml})
            ids = [] if mode == "empty" else ["34265844", "30000000"]
            idlist = "".join(f"<Id>{i}</Id>" for i in ids[: int(request.query.get("retmax", 20))])
            body = (
                f"<eSearchResult><Count>{len(ids)}</Count><RetMax>{len(ids)}</RetMax><RetStart>0</RetStart>"
                f"<IdList>{idlist}</IdList><TranslationSet/><QueryTranslation>q</QueryTranslation></eSearchResult>"
            )
            return web.Response(text=ESEARCH_HEAD + body, headers={"Content-Type": xml})
        if mode == "malformed":
            return web.Response(text=EFETCH_HEAD + "<PubmedArticleSet><PubmedArticle>", headers={"Content-Type": xml})
        articles = {
            "34265844": pubmed_article(
                "34265844", "Highly accurate protein structure prediction", "10.1038/s41586-021-03819-2"
            ),
            "30000000": pubmed_article("30000000", "A second study"),
        }
        wanted = request.query["id"].split(",")
        body = "<PubmedArticleSet>" + "".join(articles[i] for i in wanted if i in articles) + "</PubmedArticleSet>"
        return web.Response(text=EFETCH_HEAD + body, headers={"Content-Type": xml})


class FakeEuropePmc(ScholarlyFake):
    path = "/europepmc/webservices/rest/search"

    async def answer(self, request: web.Request, mode: str) -> web.Response:
        if mode == "malformed":
            return web.Response(text='{"resultList": {"result": [', content_type="application/json")
        items = [] if mode == "empty" else (self.behaviour.items or [alphafold_europepmc()])
        body = {
            "version": "6.9",
            "hitCount": len(items),
            "nextCursorMark": "AoIIP4AAACgyNzg0MzQ3Ng==",
            "request": {
                "queryString": request.query["query"],
                "resultType": "core",
                "cursorMark": "*",
                "pageSize": int(request.query["pageSize"]),
                "sort": "",
                "synonym": False,
            },
            "resultList": {"result": items},
        }
        return web.json_response(body)


def alphafold_europepmc() -> dict[str, Any]:
    return {
        "id": "34265844",
        "source": "MED",
        "pmid": "34265844",
        "pmcid": "PMC8371605",
        "doi": "10.1038/s41586-021-03819-2",
        "title": "Highly accurate protein structure prediction with AlphaFold.",
        "authorString": "Jumper J, Evans R, Pritzel A.",
        "authorList": {
            "author": [
                {"fullName": "Jumper J", "firstName": "John", "lastName": "Jumper"},
                {"fullName": "Evans R", "firstName": "Richard", "lastName": "Evans"},
            ]
        },
        "journalInfo": {"yearOfPublication": 2021, "journal": {"title": "Nature", "isoabbreviation": "Nature"}},
        "pubYear": "2021",
        "abstractText": "Proteins are essential to life, and understanding their structure <b>can</b> facilitate.",
        "isOpenAccess": "Y",
        "fullTextUrlList": {
            "fullTextUrl": [
                {
                    "availability": "Subscription required",
                    "availabilityCode": "S",
                    "documentStyle": "doi",
                    "site": "DOI",
                    "url": "https://doi.org/10.1038/s41586-021-03819-2",
                },
                {
                    "availability": "Open access",
                    "availabilityCode": "OA",
                    "documentStyle": "pdf",
                    "site": "Europe_PMC",
                    "url": "https://europepmc.org/articles/PMC8371605?pdf=render",
                },
            ]
        },
    }


class FakeSearxng(ScholarlyFake):
    path = "/search"

    async def answer(self, request: web.Request, mode: str) -> web.Response:
        if mode == "403" or request.query.get("format") != "json":
            # what SearxNG's flask.abort(403) sends when json is not in search.formats
            return web.Response(
                status=403,
                text="<!doctype html><title>403 Forbidden</title><h1>Forbidden</h1>",
                content_type="text/html",
            )
        if mode == "malformed":
            return web.Response(text='{"query": "x", "results": [', content_type="application/json")
        results = [] if mode == "empty" else (self.behaviour.items or searxng_results())
        body = {
            "query": request.query["q"],
            "number_of_results": 0,
            "results": results,
            "answers": [],
            "corrections": [],
            "infoboxes": [],
            "suggestions": ["dense retrieval"],
            "unresponsive_engines": [["google", "timeout"]],
        }
        return web.json_response(body)


def searxng_results() -> list[dict[str, Any]]:
    return [
        {
            "url": f"https://arxiv.org/abs/{DPR_ARXIV}",
            "title": DPR_TITLE,
            "content": "We show that retrieval can be practically implemented using dense representations alone.",
            "engine": "duckduckgo",
            "parsed_url": ["https", "arxiv.org", f"/abs/{DPR_ARXIV}", "", "", ""],
            "template": "default.html",
            "engines": ["duckduckgo", "brave"],
            "positions": [1, 2],
            "score": 4.0,
            "category": "general",
            "publishedDate": None,
            "thumbnail": "",
        },
        {
            "url": "https://example.org/dpr-explained",
            "title": "DPR explained",
            "content": "A blog post on DPR.",
            "engine": "duckduckgo",
            "engines": ["duckduckgo"],
            "positions": [2],
            "score": 0.5,
            "category": "general",
        },
    ]


class FakeBrave(ScholarlyFake):
    path = "/res/v1/web/search"
    api_key = "brave-test-key"

    def too_many(self) -> web.Response:
        error = {
            "id": "e1",
            "status": 429,
            "code": "RATE_LIMITED",
            "detail": "Request rate limit exceeded for plan.",
            "meta": {"plan": "Free", "rate_limit": 1, "rate_current": 2, "quota_limit": 2000, "quota_current": 5},
        }
        headers = {"X-RateLimit-Limit": "1, 2000", "X-RateLimit-Remaining": "0, 1995", "X-RateLimit-Reset": "1, 86000"}
        return web.json_response(
            {"type": "ErrorResponse", "error": error, "time": 1}, status=429, headers={**headers, **self._headers()}
        )

    async def answer(self, request: web.Request, mode: str) -> web.Response:
        if request.headers.get("X-Subscription-Token") != self.api_key:
            error = {
                "id": "e2",
                "status": 422,
                "code": "SUBSCRIPTION_TOKEN_INVALID",
                "detail": "The provided subscription token is invalid.",
                "meta": {},
            }
            return web.json_response({"type": "ErrorResponse", "error": error, "time": 1}, status=422)
        if mode == "malformed":
            return web.Response(text='{"type": "search", "web": {', content_type="application/json")
        query = {"original": request.query["q"], "show_strict_warning": False, "is_navigational": False}
        if mode == "empty":
            return web.json_response({"type": "search", "query": query, "mixed": {"type": "mixed", "main": []}})
        results = self.behaviour.items or [
            {
                "title": f"<strong>Dense</strong> Passage Retrieval {i}",
                "url": f"https://brave.example/{i}",
                "is_source_local": False,
                "is_source_both": False,
                "description": f"Result {i} on <strong>DPR</strong>.",
                "page_age": "2020-04-10T00:00:00",
                "profile": {"name": "Example"},
                "language": "en",
                "family_friendly": True,
                "type": "search_result",
                "subtype": "generic",
                "extra_snippets": [f"More on {i}."],
                "age": "April 10, 2020",
            }
            for i in (1, 2, 3)
        ]
        return web.json_response(
            {"type": "search", "query": query, "web": {"type": "search", "results": results, "family_friendly": True}}
        )


async def start_scholarly() -> dict[str, ScholarlyFake]:
    fakes: list[tuple[str, ScholarlyFake]] = [
        ("openalex", FakeOpenAlex()),
        ("crossref", FakeCrossref()),
        ("arxiv", FakeArxiv()),
        ("semantic_scholar", FakeSemanticScholar()),
        ("pubmed", FakePubMed()),
        ("europepmc", FakeEuropePmc()),
        ("searxng", FakeSearxng()),
        ("brave", FakeBrave()),
    ]
    await asyncio.gather(*(fake.start() for _, fake in fakes))
    return dict(fakes)


def scholarly_settings(fakes: dict[str, ScholarlyFake]) -> dict[str, Any]:
    """Settings overrides that point every adapter at its fake (with keys where one is needed)."""
    return {
        "openalex_api_key": FakeOpenAlex.api_key,
        "openalex_api_base_url": fakes["openalex"].url,
        "crossref_api_base_url": fakes["crossref"].url,
        "arxiv_api_base_url": fakes["arxiv"].url,
        "semantic_scholar_api_base_url": fakes["semantic_scholar"].url,
        "pubmed_api_base_url": fakes["pubmed"].url,
        "europepmc_api_base_url": fakes["europepmc"].url,
        "searxng_url": fakes["searxng"].url,
        "brave_api_key": FakeBrave.api_key,
        "brave_api_base_url": fakes["brave"].url,
    }
