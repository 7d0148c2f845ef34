"""Every report as Markdown, HTML, PDF, DOCX and JSON, listed in the path frame and fetchable."""

from __future__ import annotations

import io

import aiohttp
import docx
import pypdf
import websockets

from fedresearch.library.embedded import Library
from fedresearch.library.ingest import ingest
from tests.conftest import EXAMPLES, make_settings, run_task


async def test_path_frame_lists_every_format_and_each_one_is_served(tmp_path, start_server):
    settings = make_settings(tmp_path, default_user="alice", embeddings=False)
    ingest(Library(settings.library_dir), "alice", [EXAMPLES])
    server = await start_server(settings)
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(ws, {"task": "reciprocal rank fusion of lexical and dense rankings"})
    files = frames[-1]["output"]
    assert set(files) == {"md", "pdf", "docx", "html", "json"}  # GPT-Researcher's page reads pdf, docx, md, json
    fetched = {}
    async with aiohttp.ClientSession() as session:
        for kind, path in files.items():
            async with session.get(f"{server.url}/{path}") as response:
                assert response.status == 200, kind
                fetched[kind] = (response.headers["Content-Type"], await response.read())
    assert fetched["pdf"][0] == "application/pdf" and fetched["pdf"][1].startswith(b"%PDF-")
    pages = pypdf.PdfReader(io.BytesIO(fetched["pdf"][1])).pages
    pdf_text = " ".join(" ".join(page.extract_text() for page in pages).split())
    assert "References" in pdf_text and "Reciprocal Rank Fusion Outperforms" in pdf_text
    document = docx.Document(io.BytesIO(fetched["docx"][1]))
    texts = [paragraph.text for paragraph in document.paragraphs]
    assert "References" in texts and any("doi.org" in rel.target_ref for rel in document.part.rels.values())
    html = fetched["html"][1].decode()
    assert "<script" not in html and 'href="https://doi.org/' in html and "<h2>References</h2>" in html
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{server.url}/reports/{'0' * 32}.pdf") as response:
            assert response.status == 404
        async with session.get(f"{server.url}/reports/..%2Fx.pdf") as response:
            assert response.status == 404
