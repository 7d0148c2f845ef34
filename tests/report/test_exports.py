"""Every report as Markdown, HTML, PDF, DOCX, JSON, BibTeX and RIS, listed in the path frame and fetchable."""

from __future__ import annotations

import asyncio
import io
import re

import aiohttp
import bibtexparser
import docx
import pypdf
import pytest
import rispy
import websockets
from aiohttp import web

from fedresearch.library.facade import Library
from fedresearch.library.ingest import ingest
from fedresearch.report import exports
from fedresearch.report.exports import PAGE_SIZES
from fedresearch.report.store import delete_report, export, record_bytes, report_markdown, save_report
from tests.conftest import EXAMPLES, make_settings, run_task


async def test_path_frame_lists_every_format_and_each_one_is_served(tmp_path, start_server):
    settings = make_settings(tmp_path, default_user="alice", embeddings=False)
    ingest(Library(settings.library_dir), "alice", [EXAMPLES])
    server = await start_server(settings)
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(ws, {"task": "reciprocal rank fusion of lexical and dense rankings"})
    files = frames[-1]["output"]
    assert set(files) == {
        "md",
        "pdf",
        "docx",
        "html",
        "json",
        "bib",
        "ris",
    }  # GPT-Researcher's page reads pdf, docx, md, json
    fetched = {}
    async with aiohttp.ClientSession() as session:
        for kind, path in files.items():
            async with session.get(f"{server.url}/{path}") as response:
                assert response.status == 200, kind
                assert response.headers["X-Content-Type-Options"] == "nosniff"
                fetched[kind] = (response.headers["Content-Type"], await response.read())
                policy = response.headers.get("Content-Security-Policy", "")
                assert ("sandbox" in policy and "default-src 'none'" in policy) if kind == "html" else not policy
    assert fetched["pdf"][0] == "application/pdf" and fetched["pdf"][1].startswith(b"%PDF-")
    pages = pypdf.PdfReader(io.BytesIO(fetched["pdf"][1])).pages
    pdf_text = " ".join(" ".join(page.extract_text() for page in pages).split())
    assert "References" in pdf_text and "Reciprocal Rank Fusion Outperforms" in pdf_text
    document = docx.Document(io.BytesIO(fetched["docx"][1]))
    texts = [paragraph.text for paragraph in document.paragraphs]
    assert "References" in texts and any("doi.org" in rel.target_ref for rel in document.part.rels.values())
    html = fetched["html"][1].decode()
    assert "<script" not in html and 'href="https://doi.org/' in html and "<h2>References</h2>" in html
    # the references for a reference manager, one entry per reference of the report
    listed = len(re.findall(r"^\[\d+\] ", fetched["md"][1].decode().partition("## References")[2], re.MULTILINE))
    assert fetched["bib"][0].startswith("application/x-bibtex")
    assert len(bibtexparser.parse_string(fetched["bib"][1].decode()).entries) == listed > 0
    assert len(rispy.loads(fetched["ris"][1].decode())) == listed
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{server.url}/reports/{'0' * 32}.pdf") as response:
            assert response.status == 404
        async with session.get(f"{server.url}/reports/..%2Fx.pdf") as response:
            assert response.status == 404


def test_a_report_is_saved_as_its_record_and_every_other_format_rendered_when_fetched(tmp_path):
    markdown = "# Fusion\n\nReciprocal rank fusion sums 1/(k + rank) [1].\n"
    files = save_report(tmp_path, "a" * 32, record_bytes(markdown, {"owner": "alice", "question": "fusion"}))
    assert set(files) == {"md", "pdf", "docx", "html", "json", "bib", "ris"}
    assert [path.name for path in tmp_path.iterdir()] == ["a" * 32 + ".json"]  # one file created per task
    assert report_markdown(tmp_path, "a" * 32) == markdown
    assert export(tmp_path, "a" * 32, "md") == tmp_path / ("a" * 32 + ".md")
    assert (tmp_path / ("a" * 32 + ".md")).read_text(encoding="utf-8") == markdown
    html = export(tmp_path, "a" * 32, "html")
    assert html is not None and "<h1" in html.read_text(encoding="utf-8")
    assert export(tmp_path, "b" * 32, "md") is None and report_markdown(tmp_path, "b" * 32) is None


def test_a_report_saved_by_an_earlier_version_is_read_from_its_markdown_file(tmp_path):
    # earlier versions wrote <id>.md beside a record that need not hold the report
    (tmp_path / ("c" * 32 + ".json")).write_text('{"owner": "alice"}', encoding="utf-8")
    (tmp_path / ("c" * 32 + ".md")).write_text("# Old\n\nText.\n", encoding="utf-8")
    assert report_markdown(tmp_path, "c" * 32) == "# Old\n\nText.\n"
    docx_file = export(tmp_path, "c" * 32, "docx")
    assert docx_file is not None and docx.Document(str(docx_file)).paragraphs[0].text == "Old"


@pytest.mark.parametrize(("page", "points"), [("A4", (595, 842)), ("Letter", (612, 792))])
def test_the_pdf_and_the_docx_share_one_page_size(tmp_path, page, points):
    save_report(tmp_path, "d" * 32, record_bytes("# Fusion\n\nRank fusion.\n", {"owner": "alice"}))
    pdf = export(tmp_path, "d" * 32, "pdf", page)
    assert pdf is not None
    box = pypdf.PdfReader(str(pdf)).pages[0].mediabox
    assert (round(float(box.width)), round(float(box.height))) == points
    word = export(tmp_path, "d" * 32, "docx", page)
    assert word is not None
    section = docx.Document(str(word)).sections[0]
    width, height = PAGE_SIZES[page]
    assert (round(section.page_width.mm), round(section.page_height.mm)) == (round(width), round(height))


def test_a_pdf_of_chinese_without_a_font_for_it_says_so_and_is_not_kept(tmp_path, monkeypatch):
    markdown = "# 中文分词\n\n中文分词对检索的影响很大。\n"
    save_report(tmp_path, "e" * 32, record_bytes(markdown, {"owner": "alice"}))
    monkeypatch.setattr(exports, "cjk_font_installed", lambda: False)
    boxed = export(tmp_path, "e" * 32, "pdf")
    assert boxed is not None and boxed.name != "e" * 32 + ".pdf"  # served, not kept
    text = " ".join(" ".join(page.extract_text() for page in pypdf.PdfReader(str(boxed)).pages).split())
    assert "no font with Chinese characters is installed on the server" in text and "fonts-noto-cjk" in text
    assert not (tmp_path / ("e" * 32 + ".pdf")).exists()
    monkeypatch.setattr(exports, "cjk_font_installed", lambda: True)  # the font installed since
    kept = export(tmp_path, "e" * 32, "pdf")
    assert kept == tmp_path / ("e" * 32 + ".pdf")
    assert "no font" not in " ".join(page.extract_text() for page in pypdf.PdfReader(str(kept)).pages)
    assert delete_report(tmp_path, "e" * 32) and not any(tmp_path.iterdir())  # the unkept file goes too


async def test_rendering_a_pdf_fetches_nothing_a_report_names(tmp_path):
    """A question, a source or a model can put `![x](http://…)` in a report: its PDF export used to
    make the server GET that address (any host, redirects followed), when the report was downloaded."""
    asked: list[str] = []

    async def trap(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.Response(body=b"\x89PNG\r\n", content_type="image/png")

    app = web.Application()
    app.router.add_get("/{name}", trap)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        markdown = (
            f"# Fusion ![q](http://127.0.0.1:{port}/question.png)\n\n"
            f"Rank fusion [1].\n\n![s](http://127.0.0.1:{port}/source.png)\n\n![f](file:///etc/hostname)\n"
        )
        save_report(tmp_path, "f" * 32, record_bytes(markdown, {"owner": "alice"}))
        pdf = await asyncio.to_thread(export, tmp_path, "f" * 32, "pdf")
        assert pdf is not None and pdf.read_bytes().startswith(b"%PDF-")
    finally:
        await runner.cleanup()
    assert asked == []
