"""English questions over Chinese notes, offline: does a question find the note that says the same
thing in the other language?

    python -m bench.notes_crosslingual [--datasets DIR]

There is no collection of Chinese documents with judgments, so this is a known-item test built
from what there is: MED's 30 questions written in Chinese (med-zh) are a user's Chinese notes
(highlights), beside 109 English ones (CISI's and CACM's questions: other subjects, the same
generic words: "method", "relationship", "study"). Each English MED question has one relevant
note, its Chinese twin; each Chinese question likewise its English twin (its own words, a note too,
are left out of its ranking). Reported per mode (BM25,
dense, hybrid; the library's own search path, `Library.search`): MRR@10 and success@1/@10, for
the notes as the encoder read them before (the note's own characters), as it reads them now
(crosslingual.py: Chinese read in English), and with an English question's words also searched as
the Chinese words CC-CEDICT gives for them (crosslingual.Reverse), all from one run.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from fedresearch.library import crosslingual, facade
from fedresearch.library.embeddings import load_encoder
from fedresearch.library.facade import Library
from fedresearch.library.formats import Document, Section
from fedresearch.library.search import Mode

DEFAULT_DATASETS = Path(__file__).resolve().parents[2] / "shared" / "datasets"
DISTRACTORS = ("cisi", "cacm")


def _queries(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.open()]


def notes(datasets: Path) -> tuple[list[Document], dict[str, str], dict[str, str]]:
    """The notes, the English questions (id -> text) and the Chinese ones, each id naming its twin note."""
    twins = _queries(datasets / "med-zh" / "queries.jsonl")
    documents = [
        Document(kind="highlight", source=f"zh-{q['_id']}", title="", sections=[Section(q["text"])]) for q in twins
    ]
    for name in DISTRACTORS:
        for q in _queries(datasets / name / "queries.jsonl"):
            documents.append(
                Document(kind="highlight", source=f"{name}-{q['_id']}", title="", sections=[Section(q["text"])])
            )
    english = {q["_id"]: q["metadata"]["english"] for q in twins}
    for q in twins:  # the English twins as notes too, for the Chinese questions to find
        documents.append(
            Document(kind="highlight", source=f"en-{q['_id']}", title="", sections=[Section(english[q["_id"]])])
        )
    return documents, english, {q["_id"]: q["text"] for q in twins}


def score(library: Library, user: str, questions: dict[str, str], twin: str, mode: Mode) -> dict[str, float]:
    reciprocal, first, ten, seconds = 0.0, 0, 0, 0.0
    for query_id, text in questions.items():
        started = time.perf_counter()
        hits = library.search(user, text, kind="highlight", top_k=11, mode=mode, documents=True)
        seconds += time.perf_counter() - started
        sources = [hit.source for hit in hits if hit.source[3:] != query_id or hit.source[:2] == twin][:10]
        wanted = f"{twin}-{query_id}"
        if wanted in sources:
            place = sources.index(wanted) + 1
            reciprocal += 1 / place
            first += place == 1
            ten += 1
    n = len(questions)
    return {"mrr@10": reciprocal / n, "success@1": first / n, "success@10": ten / n, "ms": 1000 * seconds / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", type=Path, default=DEFAULT_DATASETS)
    args = parser.parse_args()
    encoder = load_encoder()
    if encoder is None:
        raise SystemExit("the embedding model is not installed (make installs it)")
    documents, english, chinese = notes(args.datasets)
    library = Library(Path(tempfile.mkdtemp(prefix="bench-notes-")), encoder=encoder)
    shipped: Callable[[str, str, str], str] = facade.embedding_text
    library.add_documents("now", documents)
    facade.embedding_text = lambda title, heading, text: text  # type: ignore[assignment]  # as before: raw
    try:
        library.add_documents("before", documents)
    finally:
        facade.embedding_text = shipped  # type: ignore[assignment]
    print(
        f"{len(documents)} notes ({len(chinese)} Chinese); dictionary loaded: {crosslingual.dictionary() is not None}"
    )
    shipped_reverse = crosslingual.reverse
    variants: dict[str, tuple[str, Callable[[], crosslingual.Reverse | None]]] = {
        "before: notes as written, questions as written": ("before", lambda: None),
        "notes read in English": ("now", lambda: None),
        "and English questions' Chinese words (shipped)": ("now", shipped_reverse),
    }
    directions = (
        ("English question -> Chinese note", english, "zh"),
        ("Chinese question -> English note", chinese, "en"),
    )
    try:
        for label, questions, twin in directions:
            print(f"\n{label:<48} {'mode':<7} MRR@10  success@1  success@10  ms/search")
            for variant, (user, reverse) in variants.items():
                crosslingual.reverse = reverse  # type: ignore[assignment]  # a benchmark-only switch
                for mode in ("bm25", "dense", "hybrid"):
                    found = score(library, user, questions, twin, mode)
                    print(
                        f"  {variant:<46} {mode:<7} {found['mrr@10']:.3f}   {found['success@1']:.2f}       "
                        f"{found['success@10']:.2f}        {found['ms']:.1f}"
                    )
    finally:
        crosslingual.reverse = shipped_reverse  # type: ignore[assignment]


if __name__ == "__main__":
    main()
