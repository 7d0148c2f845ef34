"""Markdown from outside is shown, never obeyed: a question, a source's title, address and text, an
upstream's error and a model's answer can hold `![x](http://…)`, links, autolinks, raw HTML, code
fences and line breaks; the report keeps its invariants (every [n] is one line under References) and
links nowhere but to its sources. Found by an adversarial run: a newline in a result's URL turned into
two images in the HTML export, and a question or a model's heading put an image in the report."""

from __future__ import annotations

from collections.abc import Iterator

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt
from markdown_it.token import Token

from fedresearch.core.models import ReportType, RetrieverOutcome, RetrieverStatus, SearchResult
from fedresearch.federation.fusion import fuse
from fedresearch.report.citations import display_title
from fedresearch.report.compose import compose
from fedresearch.report.exports import to_html
from fedresearch.report.llm import LlmConfig
from fedresearch.report.markup import inline_text, link_target, read_link, read_text
from fedresearch.report.writer import Brief, write_report
from tests.fakes.openai_chat import Answer, FakeOpenAI
from tests.report.test_report import check_invariants, references_of

TRAP = "http://127.0.0.2:9/x.png"
HOSTILE = [
    f"![i]({TRAP})",
    "[l](http://elsewhere.example/)",
    f"<img src={TRAP}>",
    "<http://auto.example/>",
    "`",
    "```",
    "\n\n",
    "\n",
    "\n\n[r]: http://ref.example/\n\n",
    "![r][r]",
    "\\",
    "(",
    ")",
    "[",
    "]",
    "# ",
    "|",
    "&#91;",
    "<script>alert(1)</script>",
]
WORDS = ["rank", "fusion", "combines", "lexical", "dense", "retrieval", "rankings", "reciprocal", "systems"]
hostile_text = st.lists(st.sampled_from(HOSTILE + WORDS), min_size=1, max_size=24).map(" ".join)
# CommonMark with raw HTML recognised: what the most permissive of our readers' viewers would parse
VIEWER = MarkdownIt("commonmark", {"html": True}).enable("table")
BODY = (
    "Reciprocal rank fusion combines the rankings of lexical and dense retrieval systems by summing reciprocal ranks."
)


def tokens(markdown: str) -> Iterator[Token]:
    for token in VIEWER.parse(markdown):
        yield token
        yield from token.children or ()


def assert_inert(markdown: str, sources: list[str]) -> None:
    """No image, no raw HTML, and links only to the sources, each reference one line."""
    kinds = {token.type for token in tokens(markdown)}
    assert not kinds & {"image", "html_inline", "html_block"}, markdown
    targets = {link_target(href) for href in sources}
    links = {str(token.attrs["href"]) for token in tokens(markdown) if token.type == "link_open"}
    normalized = {VIEWER.normalizeLink(target.replace("\\&", "&")) for target in targets}
    assert links <= normalized, (links, normalized)
    references = check_invariants(markdown)
    _, _, tail = markdown.partition("\n## References\n")
    assert len([line for line in tail.splitlines() if line.strip()]) == len(references), tail


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(question=hostile_text, title=hostile_text, path=hostile_text, note=hostile_text, error=hostile_text)
def test_what_a_question_or_a_source_says_is_shown_not_obeyed(
    question: str, title: str, path: str, note: str, error: str
) -> None:
    results = [
        SearchResult(
            href=f"https://b.example/x?{path}", title=title, retriever="tavily", rank=1, body=f"{BODY} {note}"
        ),
        SearchResult(href=f"highlight:{path}", title=title, retriever="internal_highlight", rank=1, body=BODY),
        SearchResult(
            href="https://doi.org/10.1016/0306-4573(88)90021-0",
            title="T",
            retriever="crossref",
            rank=2,
            body=f"{note} Dense retrieval finds passages that share meaning with the query.",
        ),
    ]
    sources = fuse(results)
    outcomes = [RetrieverOutcome(name="google", status=RetrieverStatus.failed, error=error)]
    for report_type in ReportType:
        markdown, _ = write_report(Brief(f"rank fusion {question}", report_type, sources, outcomes))
        assert_inert(markdown, [source.href for source in sources])
        assert "<img" not in to_html(markdown, "t")


def test_a_newline_in_an_address_stays_inside_its_link() -> None:
    href = f"https://b.example/x?\n\n![r][r]\n\n[r]:{TRAP}"
    results = [SearchResult(href=href, title="B", retriever="tavily", rank=1, body=BODY)]
    markdown, _ = write_report(Brief("rank fusion", ReportType.research_report, fuse(results)))
    assert_inert(markdown, [fuse(results)[0].href])
    assert references_of(markdown)[1].endswith(f"]({link_target(fuse(results)[0].href)})")
    assert "<img" not in to_html(markdown, "t") and "%0A%0A" in markdown


def test_escaped_text_reads_back_as_it_was() -> None:
    text = "a [x](y) ![i](http://h/) <b> `c` \\z"
    assert read_text(inline_text(text)) == text
    for url in (
        "https://b.example/x?a=1&b=2&#91;",
        "https://doi.org/10.1016/0306-4573(88)90021-0",
        "https://z.example/中 文",
    ):
        assert read_link(link_target(url)) == url
    assert display_title(fuse([SearchResult(href="h:1", title="A\n[b]", retriever="t", rank=1, body="")])[0]) == "A (b)"


async def test_a_models_images_links_and_html_are_shown_not_obeyed() -> None:
    fake = await FakeOpenAI().start()
    fake.script = [
        lambda body: Answer(
            pieces=[
                f"## Findings ![h]({TRAP})\n\n",
                f"{BODY} [1] ![m]({TRAP}) <img src={TRAP}> <http://auto.example/> [l](http://elsewhere.example/).\n\n",
                "[r]: http://ref.example/\n\n",
            ]
        )
    ]
    results = [SearchResult(href="https://rrf.example", title="RRF", retriever="tavily", rank=1, body=BODY)]
    try:
        config = LlmConfig(fake.url, "sk-test", "fake-model", timeout_s=2.0, max_retries=1)

        async def quiet(_: object) -> None:
            return None

        composed = await compose(
            Brief(
                f"rank fusion of lexical and dense retrieval ![q]({TRAP})", ReportType.research_report, fuse(results)
            ),
            config,
            quiet,
            None,
        )
    finally:
        await fake.stop()
    assert composed.writer == "llm", composed.markdown
    assert_inert(composed.markdown, ["https://rrf.example"])
    assert "### Findings !\\[h\\]" in composed.markdown  # a heading the model wrote inside its section
    assert "<img" not in to_html(composed.markdown, "t")
