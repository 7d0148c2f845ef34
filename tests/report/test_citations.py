"""References a researcher can use: full entries in a CSL style, one per line in every export, and
the same references as BibTeX and RIS that parse back and import into a reference manager."""

from __future__ import annotations

import io
import re
from datetime import date

import bibtexparser
import docx
import pypdf
import pytest
import rispy
from markdown_it import MarkdownIt
from pydantic import ValidationError

from fedresearch.core.models import FusedResult, ReportType, ResearchRequest
from fedresearch.library.facade import Library
from fedresearch.library.ingest import ingest
from fedresearch.report.bibfiles import bibtex, record_citations, ris
from fedresearch.report.bibliography import citation_from, citation_of
from fedresearch.report.exports import EXPORT_FORMATS, to_docx, to_html, to_pdf
from fedresearch.report.store import export, record_bytes, save_report
from fedresearch.report.styles import entries
from fedresearch.report.writer import Brief, Writing, write_report
from fedresearch.retrievers.internal_api import parse_item, passage_result
from fedresearch.web.literature import item_of
from tests.conftest import EXAMPLES, make_settings
from tests.report.test_report import check_invariants

RRF = {
    "type": "biblio",
    "document_id": "10",
    "venue": "SIGIR",
    "doi": "10.1145/1571941.1572114",
    "year": 2009,
    "authors": ["Gordon V. Cormack", "Charles L. A. Clarke", "Stefan Büttcher"],
}
RRF_TITLE = "Reciprocal Rank Fusion Outperforms Condorcet and Individual Rank Learning Methods"
NOTE = {
    "type": "highlight",
    "highlight_id": "8",
    "document_id": "6",
    "section": "Fusing rankings",
    "file": "hybrid_search.md",
}
PDF_PAGE = {"type": "file", "file_id": "12#page=3", "document_id": "12", "page": 3, "authors": ["张三"], "year": 2023}
PDF_PAGE["file"] = "dense_survey.pdf"
WEB = {"type": "web"}


def sources() -> list[FusedResult]:
    listed = [
        (
            "https://doi.org/10.1145/1571941.1572114",
            RRF_TITLE,
            RRF,
            "Reciprocal rank fusion sums one over k plus the rank of each document in every input ranking.",
        ),
        (
            "highlight:8",
            "Notes on hybrid search › Fusing rankings",
            NOTE,
            "Reciprocal rank fusion is robust because it ignores raw scores that live on different scales.",
        ),
        (
            "file:12#page=3",
            "稠密检索综述",
            PDF_PAGE,
            "Reciprocal rank fusion of dense retrieval and BM25 rankings improved recall on every collection.",
        ),
        (
            "https://weaviate.io/blog/hybrid-search",
            "Hybrid search explained",
            WEB,
            "Hybrid search merges lexical and dense rankings with reciprocal rank fusion by default.",
        ),
    ]
    return [
        FusedResult(
            key=href, href=href, title=title, body=body, score=1.0 / n, retrievers=["x"], ranks={}, metadata=meta
        )
        for n, (href, title, meta, body) in enumerate(listed, start=1)
    ]


def test_each_source_becomes_one_typed_record_from_what_its_upstream_knew():
    paper, note, page, web = (citation_of(source, accessed=date(2026, 11, 28)) for source in sources())
    assert (paper.kind, paper.year, paper.venue, paper.doi) == ("proceedings", 2009, "SIGIR", "10.1145/1571941.1572114")
    assert [a.family for a in paper.authors] == ["Cormack", "Clarke", "Büttcher"]
    assert (note.kind, note.title, note.section, note.document_id) == (
        "note",
        "Notes on hybrid search",
        "Fusing rankings",
        "6",
    )
    assert (page.kind, page.page, page.authors[0].literal) == ("file", 3, "张三")  # a Chinese name stays whole
    assert (web.kind, web.site, web.accessed) == ("webpage", "weaviate.io", date(2026, 11, 28))
    # a scholarly adapter's record: OpenAlex, Crossref, Semantic Scholar, arXiv, PubMed (retrievers/scholarly.py)
    preprint = citation_from(
        "MS MARCO", "https://arxiv.org/abs/1611.09268", {"type": "paper", "arxiv_id": "1611.09268"}
    )
    assert preprint.kind == "preprint" and preprint.link == "https://arxiv.org/abs/1611.09268"


def test_an_apa_entry_names_authors_year_title_venue_and_links_its_doi():
    paper, note, page, web = entries([citation_of(s, accessed=date(2026, 11, 28)) for s in sources()])
    assert paper.startswith("Cormack, G. V., Clarke, C. L. A., & Büttcher, S. (2009). Reciprocal Rank Fusion")
    assert "*SIGIR*" in paper and paper.endswith(
        "[https://doi.org/10.1145/1571941.1572114](https://doi.org/10.1145/1571941.1572114)"
    )
    # a note of the user's library names its document, its section and where it is, linked to the
    # page's view of that passage
    assert note == (
        "*Notes on hybrid search*. (n.d.). — note in your library, file hybrid\\_search.md, "
        "section “Fusing rankings”, [highlight:8](#library/6/8)"
    )
    assert page.startswith("张三. (2023). *稠密检索综述*. — file in your library, file dense\\_survey.pdf, p. 3")
    assert web.startswith("weaviate.io. (n.d.). *Hybrid search explained*. Retrieved November 28, 2026, from [https")


def test_other_styles_and_languages():
    citations = [citation_of(s, accessed=date(2026, 11, 28)) for s in sources()]
    ieee = entries(citations, "ieee")
    assert ieee[0].startswith("G. V. Cormack, C. L. A. Clarke, and S. Büttcher, “Reciprocal Rank Fusion")
    assert not any(re.match(r"\[\d+\]", entry) for entry in ieee)  # the report numbers them, not the style
    chinese = entries(citations, "apa", "zh")
    assert "你的文献库中的笔记, 文件 hybrid\\_search.md, 章节“Fusing rankings”" in chinese[1]
    assert "第 3 页" in chinese[2] and "2026年11月28日" in chinese[3]


def test_a_library_passage_names_the_file_it_was_read_from(tmp_path):
    """The library's hits carry their document's file name (never its folders), through the
    embedded library and the literature API's JSON alike."""
    settings = make_settings(tmp_path, embeddings=False)
    library = Library(settings.library_dir)
    ingest(library, "alice", [EXAMPLES])
    (passage,) = library.search("alice", "reciprocal rank fusion default constant", "highlight", 1, mode="bm25")
    assert passage.file == "hybrid_search.md" and "/" not in passage.file
    result = passage_result(passage, "internal_highlight", 1)
    assert result.metadata["file"] == "hybrid_search.md"
    parsed = parse_item(item_of(passage), "internal_highlight", "highlight", 1)
    assert not isinstance(parsed, str) and parsed.metadata["file"] == "hybrid_search.md"
    (entry,) = entries([citation_from(result.title, result.href, result.metadata)])
    assert "file hybrid\\_search.md, section “Fusing rankings”" in entry


def test_text_a_source_gives_stays_inert_in_its_entry():
    hostile = citation_from(
        "![x](http://127.0.0.2/x.png) <script>*bold*</script>",
        "https://a.example/x_y",
        {"type": "paper", "authors": ["Eve [a](javascript:1)"], "venue": "`code`"},
    )
    (entry,) = entries([hostile])
    tokens = [t for block in MarkdownIt("commonmark").parse(entry) for t in [block, *(block.children or [])]]
    assert {t.type for t in tokens} & {"image", "html_inline", "html_block", "code_inline", "em_open"} <= {"em_open"}
    assert [t.attrs["href"] for t in tokens if t.type == "link_open"] == ["https://a.example/x_y"]


def test_a_style_the_processor_cannot_name_is_refused_in_words():
    with pytest.raises(ValidationError, match=r"not a citation style known here.*apa, ieee"):
        ResearchRequest(task="q", citation_style="no-such-style")
    assert ResearchRequest(task="q", citation_style="IEEE.csl").citation_style == "ieee"
    with pytest.raises(ValidationError, match="not a citation style known here"):
        make_settings(__import__("pathlib").Path("/tmp"), citation_style="../../etc/passwd")


def _report(style: str | None = None) -> str:
    writing = Writing(citation_style=style)
    markdown, _ = write_report(Brief("reciprocal rank fusion", ReportType.research_report, sources(), writing=writing))
    check_invariants(markdown)
    return markdown


def test_each_reference_is_its_own_paragraph_in_every_export():
    markdown = _report()
    tail = markdown.partition("\n## References\n")[2]
    lines = [line for line in tail.splitlines() if line.strip()]
    assert len(lines) == 4 and all(re.match(r"\[\d\] ", line) for line in lines)
    html = to_html(markdown, "t")
    listed = html.partition("<h2>References</h2>")[2]
    assert listed.count("<p>[") == 4  # one paragraph each, as the page turns them into list items
    word = docx.Document(io.BytesIO(to_docx(markdown, "t")))
    paragraphs = [p.text for p in word.paragraphs]
    after = paragraphs[paragraphs.index("References") + 1 :]
    assert len(after) == 4 and all(re.match(r"\[\d\] ", text) for text in after), after
    assert after[0].startswith("[1] Cormack, G. V., Clarke, C. L. A., & Büttcher, S. (2009).")
    text = "\n".join(page.extract_text() for page in pypdf.PdfReader(io.BytesIO(to_pdf(markdown, "t"))).pages)
    starts = [line for line in text.partition("References")[2].splitlines() if re.match(r"\[\d\] ", line)]
    assert [line[:3] for line in starts] == ["[1]", "[2]", "[3]", "[4]"], text


def test_the_task_style_writes_the_references():
    assert "G. V. Cormack, C. L. A. Clarke, and S. Büttcher, “Reciprocal" in _report("ieee")


def _record(markdown: str) -> dict:
    listed = [
        {"number": n, "title": s.title, "href": s.href, "metadata": s.metadata} for n, s in enumerate(sources(), 1)
    ]
    listed.append(
        {
            "number": 5,
            "title": "Über {Ranking} \\emph{fusion}",
            "href": "https://doi.org/10.1145/1571941.1572115",
            "metadata": {"type": "paper", "authors": ["Gordon V. Cormack"], "year": 2009, "venue": "SIGIR"},
        }
    )
    return {"owner": "alice", "question": "rrf", "created_at": "2026-11-28T03:00:00+00:00", "sources": listed}


def test_bibtex_parses_back_with_unique_keys_known_types_and_its_text():
    citations = record_citations(_record(""))
    parsed = bibtexparser.parse_string(bibtex(citations))
    assert not parsed.failed_blocks and len(parsed.entries) == 5
    keys = [entry.key for entry in parsed.entries]
    assert len(set(keys)) == 5 and keys[0] == "cormack2009reciprocal" and keys[4] == "cormack2009uber"
    assert {entry.entry_type for entry in parsed.entries} <= {"article", "inproceedings", "misc"}
    first = {name: field.value for name, field in parsed.entries[0].fields_dict.items()}
    assert first["author"] == "Cormack, Gordon V. and Clarke, Charles L. A. and Büttcher, Stefan"  # non-ASCII kept
    assert (first["year"], first["booktitle"], first["doi"], first["title"]) == (
        "2009",
        "SIGIR",
        "10.1145/1571941.1572114",
        RRF_TITLE,
    )
    note = {name: field.value for name, field in parsed.entries[1].fields_dict.items()}
    assert note["note"] == "Note in your library, file hybrid_search.md, section “Fusing rankings”, (highlight:8)"
    assert parsed.entries[2].fields_dict["author"].value == "张三"
    assert parsed.entries[3].fields_dict["urldate"].value == "2026-11-28"
    # braces and backslashes a title carries would change what BibTeX reads: replaced
    assert parsed.entries[4].fields_dict["title"].value == "Über (Ranking) /emph(fusion)"


def test_ris_parses_back_with_zoteros_types():
    text = ris(record_citations(_record("")))
    assert text.startswith("TY  - CPAPER") and "\n1." not in text
    records = rispy.loads(text)
    assert [r["type_of_reference"] for r in records] == ["CPAPER", "GEN", "GEN", "ELEC", "CPAPER"]
    assert records[0]["authors"] == ["Cormack, Gordon V.", "Clarke, Charles L. A.", "Büttcher, Stefan"]
    assert (records[0]["year"], records[0]["doi"], records[0]["secondary_title"]) == (
        "2009",
        "10.1145/1571941.1572114",
        "SIGIR",
    )
    assert records[2]["notes"] == ["File in your library, file dense_survey.pdf, p. 3, (file:12#page=3)"]
    assert (
        records[3]["urls"] == ["https://weaviate.io/blog/hybrid-search"] and records[3]["access_date"] == "2026/11/28"
    )


def test_bib_and_ris_are_formats_made_from_the_saved_record(tmp_path):
    assert list(EXPORT_FORMATS)[-2:] == ["bib", "ris"]
    markdown = _report()
    save_report(tmp_path, "f" * 32, record_bytes(markdown, _record(markdown)))
    bib = export(tmp_path, "f" * 32, "bib")
    assert bib is not None and len(bibtexparser.parse_file(str(bib)).entries) == 5
    ris_file = export(tmp_path, "f" * 32, "ris")
    assert ris_file is not None and len(rispy.loads(ris_file.read_text(encoding="utf-8"))) == 5
    assert export(tmp_path, "0" * 32, "bib") is None
