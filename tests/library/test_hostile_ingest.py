"""Issue 16: hostile files never abort an ingest run, never escape the tree, never make a huge passage."""

from __future__ import annotations

import json
import os
import resource

from fedresearch.library.facade import Library
from fedresearch.library.ingest import ingest
from fedresearch.library.pdf import MAX_PDF_PAGES
from tests.pdfs import write_flate_bomb, write_page_tree_cycle, write_pdf


def test_one_bad_file_never_aborts_the_run(tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a_csl.json").write_text(json.dumps([{"title": "Odd date", "issued": {"date-parts": [5]}}]))
    (notes / "b_nested.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    (notes / "c_superscript.md").write_text("---\ntitle: Sup\npage: ²\n---\n# Sup\n\nA note with a superscript page.\n")
    (notes / "d_highlight.json").write_text(json.dumps([{"text": "a quote", "page": "³"}]))
    os.close(os.open(bytes(notes) + b"/e_latin1_\xe9.md", os.O_CREAT | os.O_WRONLY))
    (notes / "z_good.md").write_text("# Good\n\nThe last file is read although the ones before it are hostile.\n")
    library = Library(tmp_path / "lib")
    report = ingest(library, "alice", [notes])
    titles = {document.title for document in library.list_documents("alice")}
    assert "Good" in titles and "Odd date" in titles and "Sup" in titles, (titles, report.skipped)
    assert any("b_nested.jsonl" in reason and "nested too deeply" in reason for reason in report.skipped)
    assert any("not UTF-8" in reason and "\\xe9" in reason for reason in report.skipped), report.skipped
    assert report.files == 6


def test_links_out_of_the_tree_are_not_followed(tmp_path):
    outside = tmp_path / "secret.md"
    outside.write_text("# Secret\n\nroot:x:0:0:root:/root:/bin/bash\n")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "passwd.md").symlink_to(outside)
    (notes / "inside.md").write_text("# Inside\n\nAn ordinary note.\n")
    (notes / "alias.md").symlink_to(notes / "inside.md")
    library = Library(tmp_path / "lib")
    report = ingest(library, "alice", [notes])
    titles = {document.title for document in library.list_documents("alice")}
    assert "Secret" not in titles and "Inside" in titles
    assert any("passwd.md" in reason and "outside the folders given" in reason for reason in report.skipped)


def test_text_without_sentence_ends_is_split_into_bounded_passages(tmp_path):
    huge = tmp_path / "dump.txt"
    huge.write_text("token " * 400_000 + "x" * 100_000)  # 2.5 MB, no sentence end, one 100k-character word
    library = Library(tmp_path / "lib")
    assert ingest(library, "alice", [huge]).added == 1
    longest = library.records.db().execute("SELECT MAX(LENGTH(text)), COUNT(*) FROM chunks").fetchone()
    assert longest[0] <= 220 * 12 and longest[1] > 1000, tuple(longest)


def test_a_flate_bomb_pdf_is_refused_within_bounded_memory(tmp_path):
    bomb = write_flate_bomb(tmp_path / "bomb.pdf", 45_000_000)  # 0.15 MB that inflates to 45 MB of text operators
    assert bomb.stat().st_size < 300_000
    (tmp_path / "good.md").write_text("# Good\n\nRead after the bomb.\n")
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    library = Library(tmp_path / "lib")
    report = ingest(library, "alice", [bomb, tmp_path / "good.md"])
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024
    assert report.added == 1 and any("bomb.pdf" in r and "decompression bomb" in r for r in report.skipped), report
    assert grown_mb < 300, grown_mb  # read in this process, it took over 700 MB


def test_a_pdf_over_the_page_limit_is_refused(tmp_path):
    many = write_pdf(tmp_path / "many.pdf", ["a page"] * (MAX_PDF_PAGES + 1))
    report = ingest(Library(tmp_path / "lib"), "alice", [many])
    assert report.added == 0 and any(f"{MAX_PDF_PAGES + 1} pages, over the" in r for r in report.skipped), report


def test_a_pdf_page_tree_cycle_is_reported_and_the_run_goes_on(tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    write_page_tree_cycle(notes / "a_cycle.pdf")
    (notes / "b_good.md").write_text("# Good\n\nRead after the cycle.\n")
    report = ingest(Library(tmp_path / "lib"), "alice", [notes])
    assert report.added == 1 and any("a_cycle.pdf" in r and "unreadable" in r for r in report.skipped), report
