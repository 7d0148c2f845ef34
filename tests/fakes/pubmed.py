"""PubMed's E-utilities: esearch (PMIDs) then efetch (XML articles)."""

from __future__ import annotations

from xml.sax.saxutils import escape

from aiohttp import web

from tests.fakes.base import ScholarlyFake

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
