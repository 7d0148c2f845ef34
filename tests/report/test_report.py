"""Report invariants: every [n] resolves, every reference is cited, one paper is one reference."""

from __future__ import annotations

import re

import websockets

from fedresearch.core.models import ReportType, SearchResult
from fedresearch.federation.fusion import fuse
from fedresearch.report.chat import report_sources
from fedresearch.report.language import REFERENCES_HEADING
from fedresearch.report.writer import Brief, write_report
from tests.conftest import make_settings, report_of, run_task, saved_record

CITATION = re.compile(r"\[(\d+)\]")


def _split(markdown: str) -> tuple[str, str]:
    """The report's body and its References block, under either language's heading."""
    found = REFERENCES_HEADING.search(markdown)
    return (markdown[: found.start()], markdown[found.end() :]) if found else (markdown, "")


def references_of(markdown: str) -> dict[int, str]:
    tail = _split(markdown)[1]
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^\[(\d+)\] (.+)$", tail, re.MULTILINE)}


def check_invariants(markdown: str) -> dict[int, str]:
    body = _split(markdown)[0]
    cited = [int(n) for n in CITATION.findall(body)]
    references = references_of(markdown)
    assert set(cited) == set(references), (cited, references)
    first_seen = list(dict.fromkeys(cited))
    assert first_seen == sorted(first_seen) == list(range(1, len(references) + 1))
    return references


def sample_results() -> list[SearchResult]:
    return [
        SearchResult(
            href="https://a.example/x",
            title="A [draft]",
            retriever="tavily",
            rank=1,
            body="Rank fusion combines rankings from lexical and dense retrieval systems well [12]. "
            "## Injected heading should not become a heading in the report at all.",
        ),
        SearchResult(
            href="biblio:7",
            title="",
            retriever="internal_biblio",
            rank=1,
            body="Dense retrieval finds passages that share meaning but not words with the query.",
        ),
        SearchResult(
            href="https://b.example",
            title="B",
            retriever="google",
            rank=1,
            body="Unrelated text about cooking pasta with tomatoes and basil for dinner.",
        ),
    ]


def test_every_report_type_keeps_the_invariants():
    sources = fuse(sample_results())
    for report_type in ReportType:
        markdown, references = write_report(Brief("How does rank fusion combine retrieval?", report_type, sources))
        found = check_invariants(markdown)
        assert len(found) == len(references)
        assert "(12)" in markdown or report_type is ReportType.outline_report
        assert "\n## Injected" not in markdown
        assert "[draft]" not in markdown.partition("## References")[2]


def test_id_sources_are_listed_by_id_not_an_invented_url():
    markdown, _ = write_report(Brief("dense retrieval meaning", ReportType.research_report, fuse(sample_results())))
    references = check_invariants(markdown)
    assert any(line.endswith("— biblio:7") for line in references.values())


def test_no_results_gives_a_report_without_references():
    markdown, references = write_report(Brief("anything", ReportType.research_report, []))
    assert references == [] and "No source answered" in markdown and "## References" not in markdown


async def test_one_doi_from_three_retrievers_is_one_reference(tmp_path, fakes, start_server):
    doi = "10.1145/1571941.1572114"
    body = "Reciprocal rank fusion sums one over sixty plus rank across the input rankings."
    fakes["tavily"].behaviour.items = [{"url": f"https://doi.org/{doi}", "title": "RRF", "content": body, "score": 0.9}]
    fakes["google"].behaviour.items = [
        {"link": f"https://dx.doi.org/{doi}", "title": "RRF paper", "snippet": body + " More."}
    ]
    fakes["internal"].behaviour.items = [
        {
            "id": f"doi:{doi}",
            "content": body,
            "score": 0.7,
            "metadata": {"structured_data": {"title": "Reciprocal rank fusion outperforms Condorcet"}},
        }
    ]
    settings = make_settings(tmp_path, fakes, internal_api_base_url=fakes["internal"].url)
    server = await start_server(settings)
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(
            ws,
            {
                "task": "what is reciprocal rank fusion",
                "headers": {"retrievers": "tavily,google,internal_biblio", "user_id": "u"},
            },
        )
    markdown = report_of(frames)
    references = check_invariants(markdown)
    assert len(references) == 1
    assert next(iter(references.values())).endswith(f"(https://doi.org/{doi})")
    record = await saved_record(server, frames)
    assert sorted(record["sources"][0]["retrievers"]) == ["google", "internal_biblio", "tavily"]


def test_diversify_keeps_one_source_or_one_point_from_filling_the_report():
    from fedresearch.report.evidence import Evidence, Ranked, diversify

    loud = fuse([SearchResult(href="https://loud.example", body="x", retriever="tavily", rank=1)])[0]
    quiet = fuse([SearchResult(href="https://quiet.example", body="y", retriever="google", rank=1)])[0]
    same = "Rank fusion merges lexical and dense rankings into one list for the reader."
    ranked = [Ranked(Evidence(f"{same} Variant {i}.", loud, "snippet"), 1.0 - i * 0.01) for i in range(6)]
    ranked.append(
        Ranked(
            Evidence("Dense retrieval embeds passages so meaning matches beyond shared words.", quiet, "snippet"), 0.8
        )
    )
    chosen = diversify(ranked, k=3, per_source=3)
    assert quiet.key in {r.evidence.source.key for r in chosen}  # relevant but different beats the fourth echo
    assert sum(r.evidence.source.key == loud.key for r in chosen) <= 2


def test_diversify_picks_what_maximal_marginal_relevance_defines():
    """Each pick maximizes 0.7 x relevance - 0.3 x likeness to the closest earlier pick, among sources
    with picks left: checked against that definition, computed from scratch each round, on random
    evidence with word overlap and with vectors (whose cosines may be negative)."""
    import random

    import numpy as np

    from fedresearch.report.evidence import Evidence, Ranked, diversify, jaccard, terms

    def by_definition(ranked: list[Ranked], k: int, per_source: int) -> list[Ranked]:
        top, pool, chosen = ranked[0].score or 1.0, list(ranked[: k * 4]), []

        def like(a: Ranked, b: Ranked) -> float:
            if a.vector is not None and b.vector is not None:
                return float(a.vector @ b.vector)
            return jaccard(set(terms(a.evidence.text)), set(terms(b.evidence.text)))

        while pool and len(chosen) < k:
            picks = [r.evidence.source.key for r in chosen]
            open_ = [c for c in pool if picks.count(c.evidence.source.key) < per_source]
            if not open_:
                break
            value = [0.7 * c.score / top - 0.3 * max((like(c, o) for o in chosen), default=0.0) for c in open_]
            best = open_[max(range(len(open_)), key=lambda i: (value[i], -i))]  # the first of equals
            pool.remove(best)
            chosen.append(best)
        return chosen

    words = ["lens", "crystal", "protein", "cataract", "retina", "light", "vision", "water", "fiber", "age"]
    rng = random.Random(7)
    sources = [
        fuse([SearchResult(href=f"https://s{i}.example", body="x", retriever="tavily", rank=1)])[0] for i in range(6)
    ]
    for trial in range(200):
        ranked = []
        for _ in range(rng.randint(1, 40)):
            vector = None
            if trial % 2:
                vector = np.array([rng.gauss(0, 1) for _ in range(3)])
                vector /= np.linalg.norm(vector)
            text = " ".join(rng.choice(words) for _ in range(rng.randint(0, 12)))
            ranked.append(Ranked(Evidence(text, rng.choice(sources), "snippet"), rng.random(), vector))
        ranked.sort(key=lambda r: r.score, reverse=True)
        k, per_source = rng.randint(1, 12), rng.randint(1, 3)
        assert [id(r) for r in diversify(ranked, k, per_source)] == [
            id(r) for r in by_definition(ranked, k, per_source)
        ], trial
    assert jaccard(set(), {"lens"}) == jaccard(set(), set()) == 0.0


def test_sentences_split_at_a_stop_before_a_capital_a_cjk_stop_or_a_line_break():
    from fedresearch.core.text import split_sentences

    assert split_sentences("Lenses focus light. The retina senses it!  (Both) age? 3 cells.") == [
        "Lenses focus light.",
        "The retina senses it!",
        "(Both) age?",
        "3 cells.",
    ]
    assert split_sentences("e.g. the lens, 3.5 mm thick.. Then more") == ["e.g. the lens, 3.5 mm thick..", "Then more"]
    assert split_sentences("晶状体透明。视网膜感光！为什么？\n\nNext line.\nlower case") == [
        "晶状体透明。",
        "视网膜感光！",
        "为什么？",
        "Next line.",
        "lower case",
    ]
    assert split_sentences("ends with a stop.\n\nlower") == ["ends with a stop.", "lower"]
    assert split_sentences("") == split_sentences(" \n\n ") == []


def test_a_report_cuts_each_page_read_into_passages_once(monkeypatch):
    """The claims, their verification and each part of a detailed report read the same pages:
    cutting each page again for each of them was most of a report's time when pages were read."""
    from fedresearch.library.formats import Section
    from fedresearch.report import evidence
    from fedresearch.report.compose import write_extractive
    from fedresearch.report.writer import Part, Writing

    cuts: list[str] = []
    real = evidence.chunk_sections

    def counted(sections: list[Section], size: int = 220, overlap: int = 40) -> list[evidence.Chunk]:
        cuts.append(sections[0].text[:20])
        return real(sections, size, overlap)

    monkeypatch.setattr(evidence, "chunk_sections", counted)
    prose = "Federated search sends one query to several engines at once. The engines answer in parallel. "
    results = fuse(
        [
            SearchResult(
                href=f"https://s{i}.example/page", title=f"S{i}", body=f"Snippet {i}.", retriever="tavily", rank=i
            )
            for i in range(1, 5)
        ]
    )
    pages = {result.key: [Section(f"Page {n} says so. " + prose * 20)] for n, result in enumerate(results[:3])}
    writing = Writing(pages=pages)
    parts = [Part("How do engines answer?", results[:2]), Part("What is federated search?", results[1:])]
    markdown, references, _ = write_extractive(
        Brief("federated search engines", ReportType.detailed_report, results, [], writing, parts)
    )
    assert "Federated search sends one query" in markdown and len(references) >= 2  # from the pages
    assert sorted(cuts) == [f"Page {n} says so. Fede" for n in range(3)]  # each once


def test_agreeing_sources_are_cited_together():
    sentence = "Reciprocal rank fusion sums one over k plus rank across the input rankings."
    results = [
        SearchResult(href="https://a.example/rrf", title="A", body=sentence, retriever="tavily", rank=1),
        SearchResult(href="https://b.example/rrf", title="B", body=sentence + " ", retriever="google", rank=1),
    ]
    markdown, references = write_report(Brief("reciprocal rank fusion", ReportType.research_report, fuse(results)))
    check_invariants(markdown)
    assert len(references) == 2 and "[[1]](https://a.example/rrf)[[2]](https://b.example/rrf)" in markdown


def test_a_link_with_parentheses_stays_one_link():
    """DOIs such as 10.1016/0306-4573(88)90021-0 must not end a Markdown link early (nor let the
    verifier split a citation and mark the broken half)."""
    sentence = "Cosine-normalized tf-idf emerges as a robust default for the vector space model in retrieval."
    href = "https://doi.org/10.1016/0306-4573(88)90021-0"
    results = [SearchResult(href=href, title="Term weighting", body=sentence, retriever="internal_biblio", rank=1)]
    markdown, _ = write_report(Brief("tf-idf term weighting", ReportType.research_report, fuse(results)))
    check_invariants(markdown)
    target = "https://doi.org/10.1016/0306-4573%2888%2990021-0"
    assert f"[[1]]({target})" in markdown and references_of(markdown)[1].endswith(f"]({target})")
    body = markdown.partition("## References")[0]  # the reference shows the DOI as it is written
    assert "⚠" not in markdown and "(88)" not in body


def test_a_saved_reports_sentences_are_the_evidence_of_the_sources_they_cite():
    """The writers cite after the full stop, as links ("… well. [[1]](url)[[2]](url) Next …"): a
    chat about a saved report found every source's evidence empty and answered that nothing was known."""
    markdown = (
        "# Fusion\n\n## Summary\n\n"
        "Rank fusion combines lexical and dense retrieval well. [[1]](https://a.example/1)[[2]](https://b.example/2) "
        "Reciprocal rank fusion sums 1/(k + rank) [2].\n\n"
        "## References\n\n[1] [First](https://a.example/1)\n[2] [Second](https://b.example/2)\n"
    )
    first, second = report_sources(markdown)
    claim = "Rank fusion combines lexical and dense retrieval well."
    assert first.body == claim and second.body == claim + " Reciprocal rank fusion sums 1/(k + rank)."


def test_remembered_vectors_are_the_encoders_each_text_encoded_once():
    import numpy as np

    from fedresearch.report.evidence import RememberedEmbed

    asked: list[list[str]] = []

    def embed(texts: list[str]) -> np.ndarray:
        asked.append(list(texts))
        return np.array([[float(len(text)), float(ord(text[0]))] for text in texts])

    remembered = RememberedEmbed(embed, limit=3)
    assert remembered(["ab", "c", "ab"]).tolist() == [[2, 97], [1, 99], [2, 97]]
    assert remembered(["c", "def"]).tolist() == [[1, 99], [3, 100]]
    assert asked == [["ab", "c"], ["def"]]  # within a call and across calls, each text once
    remembered(["gh"])  # a fourth text: the oldest ("ab") is forgotten
    remembered(["ab", "c"])
    assert asked[-1] == ["ab"]
    assert remembered([]).shape[0] == 0 and remembered(["ab", "c"]).shape == (2, 2)


def test_a_reports_chat_encodes_only_what_it_has_not_seen(tmp_path, encoder, monkeypatch):
    """Each chat message about a report ranked the report's passages with the model again: half a
    second of a core a message for 48 passages, of which only the message was new."""
    from fedresearch.core.models import ResearchRequest
    from fedresearch.federation.runner import Deps
    from fedresearch.library.facade import Library
    from fedresearch.library.formats import Section
    from fedresearch.report import chat, writer
    from fedresearch.report.task import writing_for

    encoded: list[str] = []
    real = encoder.encode

    def counted(texts: list[str], batch_size: int = 32, int8: bool = False, max_tokens: int | None = None):
        encoded.extend(texts)
        return real(texts, batch_size, int8, max_tokens)

    monkeypatch.setattr(encoder, "encode", counted)
    deps = Deps(session=None, settings=make_settings(tmp_path), library=Library(tmp_path / "lib", encoder=encoder))  # type: ignore[arg-type]
    results = fuse(sample_results())
    prose = "Reciprocal rank fusion sums one over k plus rank {}. Dense retrieval embeds passage {}. "
    pages = {r.key: [Section("".join(prose.format(n, i) for i in range(60)))] for n, r in enumerate(results)}
    writing = writing_for(ResearchRequest(task="rank fusion"), deps, pages)
    draft = writer.Draft(writer.Brief("rank fusion", ReportType.research_report, results, writing=writing))
    draft.claims("rank fusion", draft.pool("rank fusion", results), budget=24)
    passages = len(encoded)
    assert passages > 10
    message = "What constant k does fusion use?"
    answer = chat._claims(message, results, writing)
    assert encoded[passages:] == [message]  # the passages' vectors were remembered
    again = chat._claims("And dense retrieval?", results, writing)
    assert encoded[passages + 1 :] == ["And dense retrieval?"]
    fresh = writing_for(ResearchRequest(task="rank fusion"), deps, pages)
    assert [c.text for c in chat._claims(message, results, fresh)] == [c.text for c in answer]
    assert again
