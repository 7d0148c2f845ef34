"""`fedresearch library migrate`: the embedded library, every user, into PostgreSQL; re-runs copy only what changed."""

from __future__ import annotations

import pytest

from fedresearch.cli import main
from fedresearch.library.facade import Library
from fedresearch.library.ingest import ingest
from tests.conftest import EXAMPLES

QUERIES = ["reciprocal rank fusion", "中文分词问题", "merging the ordered outputs of several search systems"]


@pytest.fixture
def embedded(tmp_path, monkeypatch, encoder):
    monkeypatch.setenv("FEDRESEARCH_DATA_DIR", str(tmp_path / "data"))
    library = Library(tmp_path / "data" / "library", encoder=encoder)
    ingest(library, "alice", [EXAMPLES])
    secret = tmp_path / "secret.md"
    secret.write_text("# Bob only\n\nThe zebrafish experiment results are confidential.\n")
    ingest(library, "bob", [secret])
    return library


def test_migrate_copies_every_user_with_vectors_then_only_what_changed(
    tmp_path, embedded, postgres_url, encoder, capsys
):
    assert main(["library", "migrate", "--to", postgres_url]) == 0
    out = capsys.readouterr().out
    alice, bob = len(embedded.list_documents("alice")), len(embedded.list_documents("bob"))
    assert f"2 users: {alice + bob} documents copied" in out and "0 already there" in out
    moved = Library(postgres_url, encoder=encoder)
    assert [d.title for d in moved.list_documents("alice")] == [d.title for d in embedded.list_documents("alice")]
    for query in QUERIES:
        # vectors are copied, not recomputed: the dense ranking and its cosines are the same
        before = embedded.search("alice", query, None, 5, mode="dense")
        after = moved.search("alice", query, None, 5, mode="dense")
        assert [(p.text, round(p.cosine or 0, 5)) for p in before] == [(p.text, round(p.cosine or 0, 5)) for p in after]
        assert [p.text for p in moved.search("alice", query, None, 1)] == [
            p.text for p in embedded.search("alice", query, None, 1)
        ]
    assert moved.search("bob", "zebrafish", None, 5)[0].text.startswith("The zebrafish")
    assert not any("zebrafish" in p.text for p in moved.search("alice", "zebrafish experiment", None, 50))

    assert main(["library", "migrate", "--to", postgres_url]) == 0
    assert (
        f"0 documents copied (0 of them replacing other content), {alice + bob} already there"
        in capsys.readouterr().out
    )
    changed = tmp_path / "secret.md"
    changed.write_text("# Bob only\n\nThe axolotl experiment results are confidential.\n")
    ingest(embedded, "bob", [changed])
    assert main(["library", "migrate", "--to", postgres_url]) == 0
    assert "1 documents copied (1 of them replacing other content)" in capsys.readouterr().out
    assert moved.search("bob", "axolotl", None, 5)[0].text.startswith("The axolotl")
    assert moved.search("bob", "zebrafish", None, 5, mode="bm25") == []


def test_migrate_says_what_is_wrong(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FEDRESEARCH_DATA_DIR", str(tmp_path / "nothing"))
    assert main(["library", "migrate", "--to", "postgresql://127.0.0.1:9/x"]) == 1
    assert "no embedded library" in capsys.readouterr().err
    assert main(["library", "migrate", "--to", "mysql://x"]) == 2
    monkeypatch.delenv("FEDRESEARCH_LIBRARY_URL", raising=False)
    assert main(["library", "migrate"]) == 2
    assert "FEDRESEARCH_LIBRARY_URL" in capsys.readouterr().err
    monkeypatch.setenv("FEDRESEARCH_LIBRARY_URL", "postgresql://127.0.0.1:9/x")  # the target without --to
    assert main(["library", "migrate"]) == 1
    assert "no embedded library" in capsys.readouterr().err
