"""arXiv's Atom API, as export.arxiv.org answers it (a billion-laughs body included)."""

from __future__ import annotations

from xml.sax.saxutils import escape

from aiohttp import web

from tests.fakes.base import ScholarlyFake
from tests.fakes.papers import DPR_ABSTRACT, DPR_ARXIV, DPR_AUTHORS, DPR_DOI

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
