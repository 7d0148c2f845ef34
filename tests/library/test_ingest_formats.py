"""Every ingest format, broken files, idempotency, replacement and deletion."""

from __future__ import annotations

import json

import pytest
from pypdf import PdfWriter

from fedresearch.library.facade import Library
from fedresearch.library.formats import UnsupportedFile, read_file
from fedresearch.library.ingest import ingest
from tests.pdfs import write_pdf


def test_pdf_one_section_per_page_with_page_numbers(tmp_path):
    pdf = write_pdf(
        tmp_path / "paper.pdf",
        ["Page one talks about lexical retrieval.", "", "Page three covers dense passage retrieval."],
        title="A Test Paper",
    )
    (document,) = read_file(pdf)
    assert document.kind == "file" and document.title == "A Test Paper"
    assert [(s.page, s.text) for s in document.sections] == [
        (1, "Page one talks about lexical retrieval."),
        (3, "Page three covers dense passage retrieval."),
    ]


def test_pdf_passages_are_searchable_by_page(tmp_path, encoder):
    pdf = write_pdf(tmp_path / "paper.pdf", ["Nothing relevant here at all.", "The axolotl regenerates limbs."])
    library = Library(tmp_path / "lib", encoder=encoder)
    report = ingest(library, "alice", [pdf])
    assert report.added == 1
    (item,) = library.search("alice", "axolotl limb regeneration", "file", 1)
    assert item.page == 2 and item.source_id[1].endswith("#page=2")
    assert item.source_id[0] == "file_id"


def test_broken_encrypted_and_image_only_pdfs_are_reported_and_nothing_is_stored(tmp_path):
    broken = tmp_path / "broken.pdf"
    broken.write_bytes(b"%PDF-1.4\nthis is not really a pdf")
    image_only = write_pdf(tmp_path / "scan.pdf", ["", ""])
    writer = PdfWriter()
    writer.add_blank_page(width=612, height=792)
    writer.encrypt("secret")
    encrypted = tmp_path / "locked.pdf"
    with encrypted.open("wb") as handle:
        writer.write(handle)
    library = Library(tmp_path / "lib")
    report = ingest(library, "alice", [broken, image_only, encrypted])
    assert report.added == 0 and len(report.skipped) == 3
    assert "unreadable" in report.skipped[0]
    assert "image-only" in report.skipped[1]
    assert "encrypted" in report.skipped[2]
    assert library.list_documents("alice") == []


def test_ris_and_csl_json_records(tmp_path):
    ris = tmp_path / "refs.ris"
    ris.write_text(
        "TY  - JOUR\nAU  - Cormack, Gordon V.\nAU  - Clarke, Charles L. A.\n"
        "TI  - Reciprocal rank fusion outperforms condorcet\nPY  - 2009\nDO  - 10.1145/1571941.1572114\n"
        "AB  - Our summary of RRF.\nKW  - fusion\nUR  - https://example.org/rrf\nER  - \n"
    )
    (record,) = read_file(ris)
    assert (record.kind, record.year, record.doi, record.url) == (
        "biblio",
        2009,
        "10.1145/1571941.1572114",
        "https://example.org/rrf",
    )
    assert record.authors == ["Cormack, Gordon V.", "Clarke, Charles L. A."] and record.tags == ["fusion"]
    csl = tmp_path / "refs.json"
    csl.write_text(
        json.dumps(
            [
                {
                    "id": "k1",
                    "type": "article-journal",
                    "title": "Dense Passage Retrieval",
                    "author": [{"family": "Karpukhin", "given": "Vladimir"}],
                    "issued": {"date-parts": [[2020, 11]]},
                    "DOI": "10.18653/v1/2020.emnlp-main.550",
                    "abstract": "Dual encoders.",
                    "keyword": "dense, qa",
                }
            ]
        )
    )
    (item,) = read_file(csl)
    assert (item.title, item.year, item.authors, item.tags) == (
        "Dense Passage Retrieval",
        2020,
        ["Vladimir Karpukhin"],
        ["dense", "qa"],
    )


def test_highlights_json_are_linked_to_paper_and_page(tmp_path, encoder):
    highlights = tmp_path / "highlights.json"
    highlights.write_text(
        json.dumps(
            {
                "paper": {"title": "Dense Passage Retrieval", "doi": "10.18653/v1/2020.emnlp-main.550"},
                "highlights": [
                    {
                        "text": "In-batch negatives make training efficient.",
                        "page": 4,
                        "note": "Try this for our model.",
                    },
                    {"text": "BM25 wins on rare entities.", "page": 7},
                ],
            }
        )
    )
    library = Library(tmp_path / "lib", encoder=encoder)
    assert ingest(library, "alice", [highlights]).added == 2
    (item,) = library.search("alice", "in-batch negatives training", "highlight", 1)
    assert item.page == 4 and item.extra["paper_doi"] == "10.18653/v1/2020.emnlp-main.550"
    assert "Note: Try this" in item.text and "p. 4" in item.display_title


def test_unknown_and_malformed_files_are_clear(tmp_path):
    with pytest.raises(UnsupportedFile, match=r"unsupported file type \.docx"):
        read_file(tmp_path / "x.docx")
    bad = tmp_path / "bad.ris"
    bad.write_text("this is not ris")
    with pytest.raises(UnsupportedFile, match="RIS"):
        read_file(bad)


def test_chunks_respect_sections_size_and_position(tmp_path):
    note = tmp_path / "long.md"
    sentence = "Retrieval systems rank documents by estimated relevance to a query. "
    note.write_text("# Long\n\n## First\n\n" + sentence * 60 + "\n\n## Second\n\nShort section.\n")
    library = Library(tmp_path / "lib")
    ingest(library, "alice", [note])
    (info,) = library.list_documents("alice")
    assert info.chunks >= 4  # ~600 tokens with 220-token chunks, plus the short section alone
    rows = library.records.db().execute("SELECT heading, position, text FROM chunks ORDER BY position").fetchall()
    assert [r["position"] for r in rows] == list(range(len(rows)))
    assert rows[-1]["heading"] == "Second" and rows[-1]["text"] == "Short section."
    assert all(r["heading"] == "First" for r in rows[:-1])


def test_delete_removes_chunks_and_vectors(tmp_path, encoder):
    note = tmp_path / "n.md"
    note.write_text("# N\n\nThe pangolin has scales.\n")
    library = Library(tmp_path / "lib", encoder=encoder)
    ingest(library, "alice", [note])
    (info,) = library.list_documents("alice")
    assert library.delete_document("alice", info.id)
    assert library.records.db().execute("SELECT COUNT(*) FROM chunks").fetchone()[0] == 0
    for mode in ("bm25", "dense", "hybrid"):
        assert library.search("alice", "pangolin scales", None, 5, mode) == []


def test_jsonl_lines_end_at_newlines_only(tmp_path):
    records = [
        {"doi": "10.1000/a", "title": "Line\u2028separator", "abstract": "A paragraph\u2029and a next line\u0085here."},
        {"doi": "10.1000/b", "title": "Second record", "abstract": "Written with CRLF line ends."},
    ]
    path = tmp_path / "records.jsonl"
    path.write_bytes("\r\n".join(json.dumps(record, ensure_ascii=False) for record in records).encode())
    documents = read_file(path)
    assert [document.title for document in documents] == ["Line separator", "Second record"]
