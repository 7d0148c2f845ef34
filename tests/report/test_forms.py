"""What each report type promises, which sources a report cites, and how its sentences and headings
read (issue 47): the offline writer, on sources made to show each point."""

from __future__ import annotations

import re

from fedresearch.core.models import FusedResult, ReportType, RetrieverOutcome, RetrieverStatus, SearchResult
from fedresearch.federation.fusion import fuse
from fedresearch.library.formats import Section
from fedresearch.report.compose import write_extractive
from fedresearch.report.custom import read_custom_prompt
from fedresearch.report.language import labels_for
from fedresearch.report.writer import Asked, Brief, Part, Writing, write_report
from tests.report.test_report import check_invariants

QUESTION = "How does HNSW build its proximity graph for nearest neighbour search?"
HNSW = [
    "HNSW builds a layered proximity graph in which each layer holds a subset of the points of the layer below.",
    "Search in the proximity graph starts at the top layer and greedily descends to the nearest neighbour below.",
    "The proximity graph keeps a bounded number of neighbours per point, so memory grows linearly with points.",
    "Insertion picks a random top layer for each point, which gives the layered graph its logarithmic search.",
    "However, the graph search may miss a true nearest neighbour when the graph is poorly connected.",
]
OFF_TOPIC = [
    "A Bloom filter answers set membership with false positives and no false negatives at all.",
    "MinHash estimates the Jaccard similarity of two sets from the minima of random permutations.",
]


def result(n: int, body: str, title: str = "", **metadata: object) -> SearchResult:
    return SearchResult(
        href=f"https://s{n}.example/paper",
        title=title or f"Paper {n}",
        body=body,
        retriever="tavily",
        rank=n,
        metadata=dict(metadata),
    )


def hnsw_sources(off_topic: bool = True) -> list[FusedResult]:
    found = [result(i + 1, body, f"Graph indexing study {i + 1}") for i, body in enumerate(HNSW)]
    if off_topic:
        found += [result(10 + i, body, f"Sketches {i}") for i, body in enumerate(OFF_TOPIC)]
    return fuse(found)


def body_of(markdown: str) -> str:
    return re.split(r"\n## (?:Sources searched|References|检索的来源|参考文献)\n", markdown)[0]


def sentences(markdown: str) -> list[str]:
    text = re.sub(r"(\[\[\d+\]\]\([^)]*\))+|\[\d+\]", "\n", body_of(markdown))
    return [s.strip(" .-") for s in text.splitlines() if len(s.strip(" .-")) > 20 and not s.startswith("#")]


def headings(markdown: str) -> list[str]:
    return [line.lstrip("#").strip() for line in body_of(markdown).splitlines() if line.startswith("## ")]


def parts_for(sources: list[FusedResult]) -> list[Part]:
    return [
        Part(
            "What is known about proximity graph?", sources[:3], focus="proximity graph HNSW", phrase="proximity graph"
        ),
        Part(
            "What evidence is there on layered graph?", sources[2:5], focus="layered graph HNSW", phrase="layered graph"
        ),
    ]


def test_only_sources_that_bear_on_the_question_are_cited():
    markdown, references = write_report(Brief(QUESTION, ReportType.research_report, hnsw_sources()))
    check_invariants(markdown)
    assert "Bloom" not in markdown and "MinHash" not in markdown
    assert {r.title for r in references} <= {f"Graph indexing study {i}" for i in range(1, 6)}


def test_thin_evidence_gives_a_short_report_that_says_so():
    sources = fuse([result(1, HNSW[0], "Graph indexing study"), *(result(9 + i, t) for i, t in enumerate(OFF_TOPIC))])
    markdown, references = write_report(Brief(QUESTION, ReportType.research_report, sources))
    assert "Only 1 of the 3 sources found bear on this question" in markdown
    assert len(references) == 1


def test_no_bearing_source_gives_a_report_saying_so_with_nothing_cited():
    sources = fuse([result(9 + i, t) for i, t in enumerate(OFF_TOPIC)])
    markdown, references = write_report(Brief(QUESTION, ReportType.detailed_report, sources))
    assert "None of the 2 sources found bears on this question" in markdown
    assert references == [] and "## References" not in markdown


def test_every_type_is_its_own_form():
    sources = hnsw_sources()
    written = {}
    for report_type in ReportType:
        parts = parts_for(sources) if report_type in (ReportType.detailed_report, ReportType.deep) else []
        if report_type is ReportType.deep:
            greedy = fuse([result(20, "Greedy search descends layer by layer, keeping a list of ef candidates.")])
            parts[0].children.append(Part("What more is known about search?", greedy, focus="greedy search"))
        asked = Asked(custom_prompt="Bullet points, at most 100 words.", parent_query="Vector databases")
        brief = Brief(QUESTION, report_type, sources, parts=parts, asked=asked)
        markdown, _ = write_report(brief)
        check_invariants(markdown)
        written[report_type] = markdown
    assert len(set(written.values())) == len(written)  # no two types alike

    research = headings(written[ReportType.research_report])
    assert research[0] == "Answer" and research[-2:] == ["Disagreements and open questions", "Conclusion"]
    assert "However, the graph search may miss" in written[ReportType.research_report]

    detailed = headings(written[ReportType.detailed_report])
    assert detailed[0] == "Introduction" and detailed[-1] == "Conclusion"
    assert all(h.endswith("?") for h in detailed[1:-1]) and len(detailed) >= 3
    deep = written[ReportType.deep]
    assert "\n### What more is known about search?" in deep and "Deep research: 2 levels" in deep

    outline = written[ReportType.outline_report]
    assert outline.startswith("# Outline: ") and re.search(r"^## 1\. ", outline, re.M) and "\n- 1.1 " in outline

    resources = written[ReportType.resource_report]
    assert resources.startswith("# Resources: ") and "\n### [Graph indexing study" in resources
    assert "*Found by: tavily.*" in resources

    custom = written[ReportType.custom_report]
    assert "Written as the custom prompt asks: bullet points; about 100 words." in custom
    assert len(re.findall(r"^- ", body_of(custom), re.M)) <= 5  # about 100 words of quotations

    subtopic = written[ReportType.subtopic_report]
    assert "A subtopic of “Vector databases”." in subtopic


def test_a_custom_prompt_it_cannot_follow_is_named():
    ask = read_custom_prompt("Write it as a table in a humorous tone, focusing on memory use.")
    assert ask.unmet == ["a table", "a tone or style"] and ask.focus == "memory use"
    markdown, _ = write_report(
        Brief(QUESTION, ReportType.custom_report, hnsw_sources(), asked=Asked(custom_prompt="A table, please."))
    )
    assert "The offline writer could not follow this part of the custom prompt: a table." in markdown
    assert read_custom_prompt("Make it sing").unmet  # nothing it knows: said, not ignored


def test_a_subtopic_leaves_out_what_existing_headers_cover():
    sources = hnsw_sources(off_topic=False)
    whole, _ = write_report(Brief(QUESTION, ReportType.subtopic_report, sources))
    first = headings(whole)[0]
    asked = Asked(parent_query="Vector search", existing_headers=(first,))
    markdown, _ = write_report(Brief(QUESTION, ReportType.subtopic_report, sources, asked=asked))
    assert first not in headings(markdown) and f"Left out, as sections already written cover it: {first}" in markdown


def test_a_deep_report_is_longer_than_a_detailed_one():
    sources = hnsw_sources()
    detailed_parts, deep_parts = parts_for(sources), parts_for(sources)
    deep_parts[0].children.append(Part("What more is known about insertion?", sources[3:5], focus="insertion layer"))
    detailed, _ = write_report(Brief(QUESTION, ReportType.detailed_report, sources, parts=detailed_parts))
    deep, _ = write_report(Brief(QUESTION, ReportType.deep, sources, parts=deep_parts))
    assert len(sentences(deep)) > len(sentences(detailed))


def test_sentences_are_whole_attributed_and_said_once():
    bodies = [
        "Builds a layered proximity graph over the points for nearest neighbour search.",
        "Our summary: the proximity graph makes nearest neighbour search logarithmic in the points.",
        "HNSW graph search is my default for nearest neighbour search in every project.",
        "The proximity graph search needs no score norm…",
    ]
    found = fuse(
        [
            result(1, bodies[0], "Efficient search", authors=["Yu. A. Malkov", "D. A. Yashunin"], year=2018),
            result(2, bodies[1]),
            SearchResult(
                href="highlight:4",
                title="My notes",
                body=bodies[2],
                retriever="internal_highlight",
                rank=1,
                kind="library",
                metadata={"type": "highlight"},
            ),
            result(3, bodies[3], "Graph search explained"),
            result(4, "Twice said: the proximity graph links each point to its nearest neighbour search candidates."),
            result(5, "Twice said: the proximity graph links each point to its nearest neighbour search candidates."),
        ]
    )
    page = (
        "Graph search explained\nGraph search explained The proximity graph search needs no score normalisation "
        "across the layers at all."
    )
    writing = Writing(pages={found[3].key: [Section(page)]})
    markdown, _, _ = write_extractive(Brief(QUESTION, ReportType.research_report, found, writing=writing))
    assert "Malkov and Yashunin (2018) build a layered proximity graph" in markdown
    assert "Our summary" not in markdown and "The proximity graph makes nearest neighbour search" in markdown
    assert "Your note says: “HNSW graph search is my default" in markdown
    assert "score norm…" not in markdown and "needs no score normalisation across the layers" in markdown
    assert "Graph search explained The proximity" not in markdown and "Graph search explained [" not in markdown
    said = [s for s in sentences(markdown) if "Twice said" in s]
    assert len(said) == 1  # stated once, citing both sources


def test_headings_are_phrases_of_the_evidence_never_pieces_of_titles_or_words():
    sources = hnsw_sources()
    for report_type in (ReportType.research_report, ReportType.outline_report, ReportType.resource_report):
        markdown, _ = write_report(Brief(QUESTION, report_type, sources))
        titles = [s.title.lower() for s in sources]
        evidence_words = {w.lower() for s in sources for w in re.findall(r"[A-Za-z]+", s.body)}
        for heading in headings(markdown):
            text = re.sub(r"^\d+\. ", "", heading)
            if text.startswith("[") or text in {
                "Answer",
                "Conclusion",
                "Disagreements and open questions",
                "Further findings",
                "Findings",
            }:
                continue
            assert not any(text.lower() in title for title in titles), heading
            assert {w.lower() for w in re.findall(r"[A-Za-z]+", text)} <= evidence_words, heading


def test_a_chinese_question_gets_a_chinese_report_quoting_english_evidence_as_it_is():
    assert labels_for("HNSW 如何构建邻近图来做最近邻搜索？", None).code == "zh"  # the question's script
    question = "HNSW proximity graph for nearest neighbour search"  # or the task's `language`
    outcomes = [
        RetrieverOutcome(name="internal_biblio", status=RetrieverStatus.done, count=4, elapsed_ms=12.4),
        RetrieverOutcome(name="tavily", status=RetrieverStatus.failed, error="HTTP 500"),
    ]
    brief = Brief(
        question, ReportType.research_report, hnsw_sources(), outcomes=outcomes, writing=Writing(language="chinese")
    )
    markdown, _ = write_report(brief)
    check_invariants(markdown)
    found = headings(markdown)
    assert found[0] == "回答" and "结论" in found and "Answer" not in found
    searched = markdown.split("## 检索的来源\n", 1)[1]
    assert "- internal_biblio：4 条结果，用时 12 毫秒" in searched and "- tavily：失败 — HTTP 500" in searched
    assert all(re.search(r"[\u4e00-\u9fff]", h) for h in found)  # every heading in Chinese
    assert "部分来源为其他语言（如英文）：其句子按原文引用，未经翻译。" in markdown  # quoted as it is, and said so
    assert "“Search in the proximity graph" not in markdown and "Search in the proximity graph" in markdown
    assert labels_for(question, "zh").references == "参考文献"


def test_an_unknown_report_type_is_refused_listing_the_known_ones():
    from fedresearch.core.models import ResearchRequest

    request = ResearchRequest.model_validate({"task": "x", "report_type": "poem"})
    assert request.report_type_error is not None and "research_report" in request.report_type_error
    assert "multi_agents" in request.report_type_error
    served = ResearchRequest.model_validate({"task": "x", "report_type": "multi_agents"})
    assert served.report_type is ReportType.detailed_report and served.report_type_error is None


def test_the_model_is_asked_for_the_form_the_request_asks():
    from fedresearch.report.prompts import asked_of_model

    custom = asked_of_model(ReportType.custom_report, Asked(custom_prompt="Three bullet points."))
    assert custom.endswith("The user asks, within those rules: Three bullet points.")
    asked = Asked(parent_query="Vector search", existing_headers=("Memory use",))
    said = asked_of_model(ReportType.subtopic_report, asked)
    assert "one subtopic of: Vector search" in said and "written already, cover: Memory use" in said
    assert asked_of_model(ReportType.research_report, asked) == ""  # its form is its sections'


CHINESE_NOTES = [
    "中文没有空格，全文检索需要先做分词，否则整段文字会被当成一个词。二元切分把每两个相邻汉字当作一个词。",
    "结巴分词基于词典和隐马尔可夫模型做分词，适合中文检索中的关键词匹配。分词错误会直接降低召回率。",
    "向量检索把文本编码成稠密向量，用余弦相似度排序。多语言编码器可以把中文和英文放进同一个向量空间。",
    "倒数排名融合把关键词检索和向量检索的排序合并。它只看名次，不需要把两种分数校准到同一尺度。",
]


def test_a_chinese_report_over_chinese_notes_takes_its_headings_from_their_words():
    found = [result(i + 1, body, f"笔记 {i + 1}") for i, body in enumerate(CHINESE_NOTES)]
    question = "中文全文检索怎样处理词语边界和排序？"
    markdown, _ = write_report(Brief(question, ReportType.research_report, fuse(found)))
    check_invariants(markdown)
    themed = [h for h in headings(markdown) if h.startswith("关于“")]
    assert themed, headings(markdown)  # not all "其他发现"
    for heading in themed:
        word = heading.removeprefix("关于“").removesuffix("”")
        assert any(word in note for note in CHINESE_NOTES), heading  # a word of the evidence, whole
        assert word not in ("检索", "中文", "研究", "方法")  # asked already, or said by any text


def test_a_plural_subject_agrees_with_each_of_its_verbs():
    from fedresearch.report.sentences import attributed

    (salton,) = fuse(
        [result(1, "x", "A Vector Space Model", authors=["G. Salton", "A. Wong", "C. S. Yang"], year=1975)]
    )
    said = attributed("Represents documents and queries as term vectors and ranks by similarity.", salton, "{text}")
    assert said == "Salton et al. (1975) represent documents and queries as term vectors and rank by similarity."
    (one,) = fuse([result(2, "x", "Alone", authors=["G. Salton"], year=1971)])
    alone = attributed("Represents documents and ranks them by similarity.", one, "{text}")
    assert alone == "Salton (1971) represents documents and ranks them by similarity."


def test_a_notes_question_is_an_open_question_and_its_fragment_goes_with_it():
    note = SearchResult(
        href="highlight:9",
        title="My notes",
        body=(
            "The proximity graph search is fast for nearest neighbour search in practice. "
            "Should the proximity graph be rebuilt after many deletions? Worth measuring on our data first."
        ),
        retriever="internal_highlight",
        rank=1,
        kind="library",
        metadata={"type": "highlight"},
    )
    found = fuse([*(result(i + 1, body, f"Graph indexing study {i + 1}") for i, body in enumerate(HNSW)), note])
    markdown, _, verification = write_extractive(Brief(QUESTION, ReportType.research_report, found))
    check_invariants(markdown)
    open_part = markdown.split("## Disagreements and open questions", 1)[1].split("\n## ", 1)[0]
    assert "Your note asks: “Should the proximity graph be rebuilt after many deletions?”" in open_part
    assert "Your note says: “Worth measuring on our data first.”" in open_part
    assert markdown.count("Worth measuring") == 1  # not a finding of its own elsewhere
    asked = [s for s in verification.sentences if "rebuilt after many deletions" in s.text or "Worth" in s.text]
    assert asked and all(s.verdict == "supported" for s in asked), [(s.text, s.verdict) for s in asked]


def test_a_sentence_that_is_only_a_noun_phrase_is_said_to_be_its_authors_and_still_checked():
    from fedresearch.report.sentences import attributed, unattributed, verbless

    survey = "A long survey of the probabilistic relevance framework that explains where BM25 comes from."
    (robertson,) = fuse([result(1, survey, "BM25 and Beyond", authors=["S. Robertson", "H. Zaragoza"], year=2009)])
    said = attributed(survey, robertson, "{text}")
    assert said == (
        "Robertson and Zaragoza (2009) present a long survey of the probabilistic relevance framework that "
        "explains where BM25 comes from."
    )
    assert unattributed(said) == survey[:1].lower() + survey[1:]  # what the verifier checks: the source's words
    (untitled,) = fuse([result(2, survey, "BM25 and Beyond")])
    assert attributed(survey, untitled, "{text}").startswith("“BM25 and Beyond” presents a long survey")
    # a sentence with a verb in its main clause is left as it is
    for sentence in ("A study of documents shows that stemming helps.", "An index was built per user.", survey[2:]):
        assert not verbless(sentence)


TOPICS = {
    "fusion": [
        "Rank fusion in hybrid retrieval adds one over sixty plus the rank of each document in each input ranking.",
        "Condorcet fusion in hybrid retrieval orders documents by pairwise majority over the input rankings.",
        "Weighted rank fusion in hybrid retrieval trusts one input ranking more than the other input rankings.",
    ],
    "weighting": [
        "Term weighting in hybrid retrieval lifts rare words above common words by inverse document frequency.",
        "Length normalization keeps long documents of hybrid retrieval from winning on term weighting alone.",
        "Term weighting schemes for hybrid retrieval differ in how they damp the frequency of a word in a document.",
    ],
    "dense": [
        "A dense retriever in hybrid retrieval encodes questions and passages as vectors compared by cosine.",
        "Dense retrievers of hybrid retrieval trained on one collection lose recall on another domain.",
        "Dense retrievers of hybrid retrieval need a nearest neighbour index over the vectors of every passage.",
    ],
}


def test_a_theme_is_the_sources_that_share_it_named_by_what_they_share():
    question = "How does hybrid retrieval rank documents?"
    found = fuse(
        [
            result(10 * n + k + 1, body, f"{topic.title()} paper {k}")
            for n, (topic, bodies) in enumerate(TOPICS.items())
            for k, body in enumerate(bodies)
        ]
    )
    markdown, _ = write_report(Brief(question, ReportType.research_report, found))
    check_invariants(markdown)
    sections = {block.split("\n", 1)[0]: block for block in body_of(markdown).split("\n## ")[1:] if "[" in block}
    for topic, bodies in TOPICS.items():
        holding = {heading for heading, block in sections.items() for body in bodies if body[:40] in block}
        # both sources of a topic in one section (the answer's sentences aside)
        assert len(holding - {"Answer"}) <= 1, (topic, holding)
    unnamed = {"Answer", "Findings", "Further findings", "Disagreements and open questions"}
    named = [h for h in sections if h not in unnamed]
    for heading in named:  # a phrase two of its section's sources state, not one paragraph's words
        block = sections[heading].lower()
        words = heading.lower().split()
        stating = [b for bodies in TOPICS.values() for b in bodies if b[:40].lower() in block]
        assert sum(all(w.rstrip("s") in b.lower() for w in words) for b in stating) >= 2, heading


def test_sub_questions_ask_about_whole_terms_never_a_subject_and_its_verb():
    from fedresearch.report.planner import sub_questions

    bodies = [
        "Reciprocal rank fusion merges rankings; judged pools undercount what dense rankings find in a test.",
        "We tune reciprocal rank fusion on MED; dense rankings find other passages than lexical ones do.",
        "Reciprocal rank fusion needs no scores, and dense rankings find paraphrases that words miss.",
    ]
    found = fuse([result(n + 1, body, f"Study {n + 1}") for n, body in enumerate(bodies)])
    asked = sub_questions("How are retrieval results merged?", found, count=3)
    phrases = [q.phrase for q in asked]
    assert "reciprocal rank fusion" in phrases  # the whole term its uses always write, not "reciprocal rank"
    assert not any("rankings find" in phrase for phrase in phrases)


def test_a_text_says_a_term_in_its_plural_or_singular_as_whole_words():
    from fedresearch.report.planner import says

    assert says("Dense retrievers trained on MS MARCO fall below BM25.", "dense retriever")
    assert says("Each input ranking is a voter.", "input rankings")
    assert not says("A dense index retriever.", "dense retriever")  # not the term: other words between
    assert not says("The condensed retriever.", "dense retriever")  # not a piece of a word
    assert says("倒数排名融合把排序合并", "排名融合") and not says("排名和融合", "排名融合")


def test_a_sub_questions_section_quotes_what_says_its_phrase_and_the_rest_follows_by_theme():
    sources = hnsw_sources(off_topic=False)
    parts = [Part("What is known about top layers?", sources, focus="top layer HNSW", phrase="top layers")]
    markdown, _ = write_report(Brief(QUESTION, ReportType.detailed_report, sources, parts=parts))
    check_invariants(markdown)
    section = markdown.split("## What is known about top layers?\n", 1)[1].split("\n## ", 1)[0]
    said = sentences(section)
    assert said and all("top layer" in s.lower() for s in said), said
    assert "## Conclusion" in markdown and len(headings(markdown)) > 3  # the rest, after the sub-question
