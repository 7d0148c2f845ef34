"""The page at `/` in a real browser: Debian's Chromium driven by Playwright, against the real server
with the example library and the fake upstreams on 127.0.0.1."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import docx
import pypdf
import pytest
from aiohttp import web

from fedresearch.library.facade import Library
from fedresearch.library.ingest import ingest
from fedresearch.report.exports import EXPORT_FORMATS
from fedresearch.report.store import file_name
from fedresearch.report.types import offered_forms
from fedresearch.web.keys import SOCKETS
from tests.conftest import EXAMPLES, make_settings
from tests.report.test_pages import StaticResolver

CHROMIUM = "/usr/bin/chromium"
# Chromium as Debian ships it, headless and quiet: no GPU, no sandbox (tests may run as root), and
# nothing that would reach the network on its own
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
KEY = "page-test-key"
QUESTION = "How should lexical BM25 and dense retrieval be combined with rank fusion?"
FINAL_STATES = {"done", "failed", "skipped"}
DESKTOP, PHONE = 1280, 390
HEIGHTS = {DESKTOP: 900, PHONE: 844}
SHOTS = Path("/tmp/page-shots")  # where whoever reviews a change finds the screenshots the tests took


def _chromium_or_skip() -> None:
    if not os.path.exists(CHROMIUM) and os.environ.get("CI") != "true":
        pytest.skip(f"{CHROMIUM} is missing: `apt-get install chromium` to run the browser tests (CI installs it)")


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    _chromium_or_skip()
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def articles() -> AsyncIterator[str]:
    """A web site the Tavily results point at, so the task reads pages (pages.test is 127.0.0.1)."""

    async def article(request: web.Request) -> web.Response:
        paragraph = "Reciprocal rank fusion merged the lexical and dense rankings of the pilot without tuning. " * 8
        html = f"<html><head><title>Pilot</title></head><body><article><h1>Pilot</h1><p>{paragraph}</p></article>"
        return web.Response(text=html + "</body></html>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/article/{n}", article)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://pages.test:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    await runner.cleanup()


async def _server(tmp_path: Path, fakes: Any, start_server: Any, **overrides: Any) -> Any:
    settings = make_settings(tmp_path, fakes, embeddings=False, api_keys=f"{KEY}:alice", **overrides)
    ingest(Library(settings.library_dir), "alice", [EXAMPLES])
    resolver = StaticResolver({"pages.test": "127.0.0.1", "evil.test": "127.0.0.1"})
    return await start_server(settings, resolver=resolver)


def _tavily_results(site: str) -> list[dict[str, Any]]:
    urls = [f"{site}/article/1", f"{site}/article/2", "http://evil.test/admin"]
    return [
        {
            "url": url,
            "title": f"Pilot study {i}",
            "content": f"Pilot {i}: rank fusion combines lexical and dense retrieval well.",
            "score": 0.9 - i / 10,
            "raw_content": None,
        }
        for i, url in enumerate(urls, 1)
    ]


async def _open(browser: Any, url: str, lang: str = "en-US", width: int = DESKTOP) -> Any:
    viewport = {"width": width, "height": HEIGHTS.get(width, 900)}
    context = await browser.new_context(locale=lang, accept_downloads=True, viewport=viewport)
    page = await context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.errors = errors
    await page.goto(url + "/")
    return page


async def _sign_in(page: Any) -> None:
    await page.wait_for_selector("#key-box:not([hidden])")  # the server has keys: the page asks for one
    assert "API key" in await page.inner_text("#notice-text") or await page.is_visible("#key-box")
    await page.fill("#api-key", KEY)
    await page.click("#save-key")
    await page.wait_for_selector("#retriever-list input[value=tavily]")


async def _downloaded(page: Any, kind: str, question: str = QUESTION) -> bytes:
    async with page.expect_download() as info:
        await page.click(f"#downloads button[data-kind={kind}]")
    download = await info.value
    assert download.suggested_filename == file_name(question, kind)  # named after the question, not its id
    return Path(await download.path()).read_bytes()


async def _shot(page: Any, tmp_path: Path, name: str) -> None:
    """A full-page screenshot, kept with the test and copied where a reviewer looks."""
    path = tmp_path / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    SHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, SHOTS / path.name)


async def _fits_sideways(page: Any) -> None:
    widths = await page.evaluate("[document.documentElement.scrollWidth, innerWidth]")
    assert widths[0] <= widths[1], f"the page is {widths[0]} px wide in a {widths[1]} px window"


async def _report_in_view(page: Any) -> None:
    """The report card comes into view by itself (smoothly: it is waited for)."""
    where = (
        "[document.getElementById('report-card').getBoundingClientRect().top, innerHeight, scrollY,"
        " document.documentElement.scrollHeight - innerHeight]"
    )
    for _ in range(50):
        top, height, scrolled, most = await page.evaluate(where)
        at_its_top = -2 <= top <= height / 3
        as_far_as_it_goes = scrolled >= most - 1 and 0 <= top < height / 2  # a short report near the page's end
        if scrolled > 0 and (at_its_top or as_far_as_it_goes):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the report is {top} px down a {height} px window, scrolled {scrolled} px")


async def _jobs(server: Any, headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession(headers=headers) as session, session.get(f"{server.url}/api/jobs") as response:
        assert response.status == 200
        jobs: list[dict[str, Any]] = (await response.json())["jobs"]
        return jobs


async def test_a_question_runs_to_a_cited_report_with_exports_chat_history_and_upload(
    tmp_path, fakes, start_server, browser, articles
):
    fakes["google"].behaviour.mode = "500"  # one upstream fails; the page says so and the rest goes on
    fakes["tavily"].behaviour.items = _tavily_results(articles)
    server = await _server(tmp_path, fakes, start_server, fetch_pages=True, fetch_allowed_hosts=["pages.test"])
    page = await _open(browser, server.url)
    await _sign_in(page)
    brave = page.locator("#retriever-list label[data-name=brave]")
    assert await brave.locator("input").is_disabled() and "not configured" in await brave.inner_text()

    for name in ("internal_biblio", "internal_highlight", "tavily", "google"):
        await page.check(f"#retriever-list input[value={name}]")
    menu = await page.eval_on_selector_all("#report-type option", "options => options.map(o => o.value)")
    assert menu == [form.name for form in offered_forms()]  # the report types' registry, in its order
    await page.fill("#question", QUESTION)
    await page.click("#run")
    await page.wait_for_selector("#downloads button[data-kind=pdf]", timeout=30_000)

    rows = await page.eval_on_selector_all(
        "#retriever-table tbody tr", "rows => rows.map(r => [r.dataset.name, r.dataset.state, r.cells[2].textContent])"
    )
    assert {name for name, _, _ in rows} == {"internal_biblio", "internal_highlight", "tavily", "google"}
    assert all(state in FINAL_STATES for _, state, _ in rows), rows
    states = {name: (state, count) for name, state, count in rows}
    assert states["tavily"] == ("done", "3") and states["google"][0] == "failed"
    assert "500" in await page.inner_text("#retriever-table tr[data-name=google]")
    read = await page.eval_on_selector_all("#pages li", "items => items.map(i => [i.dataset.status, i.textContent])")
    assert sorted(status for status, _ in read) == ["fetched", "fetched", "skipped"], read
    assert any("evil.test" in text and "127.0.0.1" in text for _, text in read)  # skipped, and why

    await _check_citations(page)
    await _check_library_passage(page)
    await _check_exports(page)
    await _check_chat(page)
    await _check_upload(page, tmp_path)
    await _check_history(page)
    await _check_chinese(page)
    await page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
    if shot := os.environ.get("FEDRESEARCH_PAGE_SCREENSHOT"):
        shutil.copy(tmp_path / "page.png", shot)
    assert page.errors == []


async def _check_citations(page: Any) -> None:
    references = page.locator("#report ol.references li[id^=ref-]")
    assert await references.count() >= 3
    assert "## References" not in await page.inner_text("#report")
    cite = page.locator("#report a.cite").first
    number = (await cite.inner_text()).strip("[]")
    assert await cite.get_attribute("href") == f"#ref-{number}"
    await cite.click()
    assert await page.evaluate("location.hash") == f"#ref-{number}"
    target = page.locator(f"#ref-{number}")
    assert await target.evaluate("node => node.matches(':target')")
    assert await target.is_visible()
    source = page.locator("#report ol.references a[href^='https://doi.org/']").first
    assert await source.get_attribute("target") == "_blank"
    assert "noopener" in (await source.get_attribute("rel") or "")


async def _check_library_passage(page: Any) -> None:
    """A reference to one of the user's notes opens its passages here, the cited one marked."""
    note = page.locator("#report ol.references a[href^='#library/']").first
    label = await note.inner_text()
    assert label.startswith("highlight:") and await note.get_attribute("target") is None
    await note.click()
    cited = page.locator("#passage-view[open] #passage-body section.cited")
    await cited.wait_for(timeout=10_000)
    title = await page.inner_text("#passage-title")
    assert title and title != "In your library"  # the note's own title
    assert len((await cited.inner_text()).strip()) > 20
    assert await page.evaluate("location.hash") != (await note.get_attribute("href"))  # no navigation
    SHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(SHOTS / "library-passage.png"))  # where a reviewer looks
    await page.click("#passage-close")
    assert await page.locator("#passage-view[open]").count() == 0


async def _check_exports(page: Any) -> None:
    kinds = await page.eval_on_selector_all("#downloads button", "buttons => buttons.map(b => b.dataset.kind)")
    assert kinds == list(EXPORT_FORMATS) == ["md", "html", "pdf", "docx", "json", "bib", "ris"]  # the formats' registry
    pdf = await _downloaded(page, "pdf")
    assert pdf.startswith(b"%PDF-")
    text = " ".join(" ".join(p.extract_text() for p in pypdf.PdfReader(io.BytesIO(pdf)).pages).split())
    assert "References" in text and "Reciprocal Rank Fusion Outperforms" in text
    assert "highlight:" in text and "#library/" not in text  # a note's id as text: its page link opens nothing here
    word = docx.Document(io.BytesIO(await _downloaded(page, "docx")))
    paragraphs = [paragraph.text for paragraph in word.paragraphs]
    assert "References" in paragraphs
    assert not [rel for rel in word.part.rels.values() if "#library/" in str(rel._target)]
    assert any("Reciprocal Rank Fusion Outperforms" in text for text in paragraphs)


async def _check_chat(page: Any) -> None:
    await page.fill("#chat-input", "Which paper introduced reciprocal rank fusion?")
    await page.click("#chat-send")
    answer = page.locator("#chat-log .chat.assistant").first
    await answer.wait_for(timeout=20_000)
    assert len((await answer.inner_text()).strip()) > 20


async def _check_upload(page: Any, tmp_path: Path) -> None:
    note = tmp_path / "fusion-note.md"
    note.write_text("# Weighted fusion\n\nWeighted reciprocal rank fusion gives each retriever its own weight.\n")
    binary = tmp_path / "tool.exe"
    binary.write_bytes(b"MZ\x90\x00")
    await page.set_input_files("#upload-files", [str(note), str(binary)])
    await page.click("#upload-send")
    await page.wait_for_selector("#upload-result tr[data-status=added]")
    skipped = page.locator("#upload-result tr[data-status=skipped]")
    assert "tool.exe" in await skipped.inner_text() and "unsupported file type" in await skipped.inner_text()
    assert "1 added" in await page.inner_text("#upload-summary")


async def _check_history(page: Any) -> None:
    entry = page.locator("#history-list li button", has_text=QUESTION)
    await entry.wait_for()
    await page.evaluate("document.getElementById('report').replaceChildren()")
    await entry.click()
    await page.wait_for_selector("#report ol.references li#ref-1")
    assert await page.is_hidden("#history-note")  # the server's list (GET /api/reports), not the browser's
    assert await page.get_attribute("#retriever-table tr[data-name=tavily]", "data-state") == "done"
    await page.fill("#chat-input", "What does nDCG reward?")  # a saved report: POST /api/chat answers
    await page.click("#chat-send")
    answer = page.locator("#chat-log .chat.assistant").first
    await answer.wait_for(timeout=20_000)
    assert len((await answer.inner_text()).strip()) > 20


async def _check_chinese(page: Any) -> None:
    await page.click("#language")
    assert await page.get_attribute("html", "lang") == "zh-CN"
    assert await page.inner_text("#run") == "开始研究"
    assert "状态" in await page.inner_text("#retriever-table thead")
    assert await page.inner_text("#retriever-table tr[data-name=tavily] td.state") == "完成"
    missing = await page.evaluate("Object.keys(STRINGS.en).filter(key => !(key in STRINGS.zh))")
    assert missing == []


async def test_hostile_sources_cannot_run_script_in_the_page(tmp_path, fakes, start_server, browser):
    hostile = '<img src=x onerror="window.pwned=1"><script>window.pwned=1</script>'
    fakes["tavily"].behaviour.items = [
        {
            "url": "https://example.org/hostile",
            "title": f"Hostile {hostile}",
            "content": f"Rank fusion combines lexical and dense retrieval {hostile} [x](javascript:window.pwned=1).",
            "score": 0.9,
            "raw_content": None,
        }
    ]
    server = await _server(tmp_path, fakes, start_server)
    page = await _open(browser, server.url, lang="zh-CN")
    assert await page.inner_text("#run") == "开始研究"  # navigator.language picks Chinese
    await page.fill("#api-key", KEY)
    await page.click("#save-key")
    await page.wait_for_selector("#retriever-list input[value=tavily]")
    await page.check("#retriever-list input[value=tavily]")
    await page.fill("#question", "rank fusion of lexical and dense retrieval")
    await page.click("#run")
    await page.wait_for_selector("#downloads button[data-kind=md]", timeout=30_000)
    assert "Hostile" in await page.inner_text("#report")
    assert await page.evaluate("window.pwned") is None
    assert await page.locator("#report script, #report img[onerror], #report a[href^='javascript:']").count() == 0


async def test_the_page_and_its_files_are_served_safely(tmp_path, start_server):
    server = await start_server(make_settings(tmp_path))
    async with aiohttp.ClientSession() as session:
        async with session.get(server.url + "/") as response:
            assert response.status == 200 and response.content_type == "text/html"
            assert "script-src 'self'" in response.headers["Content-Security-Policy"]
            assert 'src="static/page.js"' in await response.text()
        for name in ("page.js", "strings.js", "page.css", "vendor/marked.min.js", "vendor/purify.min.js"):
            async with session.get(f"{server.url}/static/{name}") as response:
                assert response.status == 200, name
        for name in ("..%2F..%2Fpage.py", "../page.py", "vendor/refresh.sh", "nothing.js"):
            async with session.get(f"{server.url}/static/{name}") as response:
                assert response.status == 404, name


async def test_errors_are_said_in_words(tmp_path, fakes, start_server, browser):
    server = await _server(tmp_path, fakes, start_server)
    page = await _open(browser, server.url)
    await page.wait_for_selector("#key-box:not([hidden])")
    await page.fill("#api-key", "not-a-key")
    await page.click("#save-key")
    await page.wait_for_selector("#notice:not([hidden])")
    assert "needs a valid API key" in await page.inner_text("#notice-text")
    assert "needs a valid API key" in await page.inner_text("#retriever-list")

    keyless = await start_server(make_settings(tmp_path / "keyless", embeddings=False))
    page = await _open(browser, keyless.url)
    await page.wait_for_selector("#retriever-list input[value=internal_biblio]")

    # a tab that remembers a task the server no longer has (expired, or another server's) stops waiting
    gone = {"id": "f" * 32, "question": "rank fusion"}
    await page.evaluate(f"sessionStorage.setItem('fedresearch.research', JSON.stringify({json.dumps(gone)}))")
    await page.reload()
    # a locator, not wait_for_function: its string predicate is eval'd in the page, which the page's CSP
    # refuses when the first check does not already pass
    await page.locator("#notice-text", has_text="no job").wait_for()
    assert "unknown, expired or not yours" in await page.inner_text("#notice-text")
    assert await page.is_enabled("#run")
    assert await page.evaluate("sessionStorage.getItem('fedresearch.research')") is None
    assert page.errors == []


async def test_a_reload_or_a_dropped_connection_mid_task_resumes_it(tmp_path, fakes, start_server, browser):
    fakes["tavily"].behaviour.delay_s = 3.0  # long enough to reload, then to lose the socket, mid-task
    server = await _server(tmp_path, fakes, start_server)
    page = await _open(browser, server.url)
    await _sign_in(page)
    for name in ("internal_biblio", "tavily"):
        await page.check(f"#retriever-list input[value={name}]")
    await page.fill("#question", QUESTION)
    await page.click("#run")
    await page.wait_for_selector("#retriever-table tr[data-name=tavily][data-state=searching]")
    research_id = await page.evaluate("JSON.parse(sessionStorage.getItem('fedresearch.research')).id")

    await page.reload()  # the task was started detached: it goes on, and the page follows it again
    await page.wait_for_selector("#retriever-table tr[data-name=tavily][data-state=searching]")
    assert await page.is_disabled("#run")
    for socket in list(server.app[SOCKETS]):  # the network drops: the page reconnects by itself
        await socket.ws.close()
    await page.wait_for_selector("#downloads button[data-kind=pdf]", timeout=30_000)

    states = await page.eval_on_selector_all("#retriever-table tbody tr", "rows => rows.map(r => r.dataset.state)")
    assert states == ["done", "done"]
    assert await page.locator("#report ol.references li[id^=ref-]").count() >= 2
    assert len(fakes["tavily"].requests) == 1  # resumed, never run twice
    assert await page.evaluate("sessionStorage.getItem('fedresearch.research')") is None
    await page.wait_for_selector("#history-list li[data-id]")
    ids = await page.eval_on_selector_all("#history-list li[data-id]", "items => items.map(i => i.dataset.id)")
    assert ids == [research_id]

    page.on("dialog", lambda dialog: dialog.accept())  # "Delete this report and its files?"
    await page.click(f"#history-list li[data-id='{research_id}'] button.delete")
    await page.wait_for_selector(f"#history-list li[data-id='{research_id}']", state="detached")
    bearer = {"Authorization": f"Bearer {KEY}"}
    async with (
        aiohttp.ClientSession(headers=bearer) as session,
        session.get(f"{server.url}/reports/{research_id}.md") as gone,
    ):
        assert gone.status == 404

    await page.fill("#question", "What does nDCG reward?")  # a new question, stopped while Tavily searches
    await page.click("#run")
    await page.wait_for_selector("#retriever-table tr[data-name=tavily][data-state=searching]")
    await page.click("#stop")
    await page.wait_for_selector("#retriever-table tr[data-name=tavily][data-state=stopped]")
    assert await page.is_enabled("#run") and await page.is_hidden("#stop")
    assert await page.evaluate("sessionStorage.getItem('fedresearch.research')") is None
    assert page.errors == []


async def _default_server(tmp_path: Path, fakes: Any, start_server: Any, **overrides: Any) -> Any:
    """A server as it starts by default: no API keys and no default user (alice's library is there)."""
    settings = make_settings(tmp_path, fakes, embeddings=False, **overrides)
    ingest(Library(settings.library_dir), "alice", [EXAMPLES])
    return await start_server(settings)


@pytest.mark.parametrize("width", [DESKTOP, PHONE])
async def test_first_use_on_a_default_server(tmp_path, fakes, start_server, browser, width):
    """A new user on a default server: asked for their user id beside the question, told in words
    what is missing or too long before anything is sent, then their report comes into view and
    downloads under its question's name."""
    fakes["tavily"].behaviour.delay_s = 1.0  # time to scroll away while a task runs
    server = await _default_server(tmp_path, fakes, start_server)
    page = await _open(browser, server.url, width=width)
    await page.wait_for_selector("#retriever-list input[value=tavily]")
    box = page.locator("#user-slot #user-box")  # beside the question, not in a collapsed section
    assert await box.is_visible() and "needed" in (await box.get_attribute("class") or "")
    assert "Your library" in await box.inner_text()
    assert await page.is_hidden("#access")  # no key on this server: nothing to open there
    await _fits_sideways(page)
    await _shot(page, tmp_path, f"first-use-{width}")

    await page.fill("#question", QUESTION)  # no retriever ticked: the defaults search the library
    await page.click("#run")
    notice = page.locator("#notice-text")
    await notice.wait_for()
    words = await notice.inner_text()
    assert words.startswith("Type your user id under “Your library” first"), words
    assert "FEDRESEARCH_DEFAULT_USER" not in words and "user_id" not in words
    assert "missing" in (await box.get_attribute("class") or "")
    assert await page.evaluate("document.activeElement.id") == "user-id"
    assert await page.is_hidden("#progress") and await page.is_enabled("#run")
    await _fits_sideways(page)
    await _shot(page, tmp_path, f"first-use-no-user-{width}")
    note = tmp_path / "note.md"
    note.write_text("# Fusion\n\nReciprocal rank fusion.\n")
    await page.set_input_files("#upload-files", [str(note)])
    await page.click("#upload-send")
    await notice.filter(has_text="whose library to add to").wait_for()
    await page.fill("#user-id", "Alice Smith")  # the server would refuse it: said before sending
    await page.click("#run")
    await notice.filter(has_text="no spaces").wait_for()
    await page.fill("#user-id", "")

    await page.fill("#question", "rank fusion " * 834)  # 10,008 characters, trimmed to 10,007
    await page.click("#run")
    await page.locator("#notice-text", has_text="this server takes at most").wait_for()
    words = await page.inner_text("#notice-text")
    assert words == "Your question is 10,007 characters; this server takes at most 2,000. Shorten it and try again."
    await _shot(page, tmp_path, f"first-use-too-long-{width}")
    await page.click("#language")
    await page.click("#run")
    await page.locator("#notice-text", has_text="此服务器最多接受").wait_for()
    assert (
        await page.inner_text("#notice-text") == "你的问题有 10,007 个字符，此服务器最多接受 2,000 个。请缩短后再试。"
    )
    await page.click("#language")
    assert await _jobs(server) == []  # nothing was sent

    await page.fill("#user-id", "alice")
    await page.press("#user-id", "Tab")  # remembered when it changes
    assert await page.evaluate("localStorage.getItem('fedresearch.user')") == "alice"
    await page.fill("#question", QUESTION)
    await page.evaluate("window.scrollTo(0, 0)")
    await page.click("#run")
    await page.wait_for_selector("#downloads button[data-kind=pdf]", timeout=30_000)
    await _report_in_view(page)
    assert await page.locator("#report ol.references li[id^=ref-]").count() >= 2  # alice's library and the web
    await _fits_sideways(page)
    await _shot(page, tmp_path, f"first-use-report-{width}")
    assert (await _downloaded(page, "pdf")).startswith(b"%PDF-")  # how-should-lexical-bm25-….pdf

    # a reader who scrolled away while the next one ran is left where they are; a Chinese question's file
    # keeps its characters
    chinese = "中文分词"
    await page.evaluate("window.scrollTo(0, 0)")
    await page.fill("#question", chinese)
    await page.click("#run")
    await page.wait_for_selector("#retriever-table tr[data-name=tavily][data-state=searching]")
    before = await page.evaluate("scrollY")  # where clicking Research put it
    await page.mouse.move(width / 2, 200)
    await page.mouse.wheel(0, 250)  # the reader scrolls
    await page.wait_for_selector("#downloads button[data-kind=md]", timeout=30_000)
    where = "[scrollY, document.getElementById('report-card').getBoundingClientRect().top, innerHeight]"
    settled, last = 0, None
    while settled < 4:  # every scroll, the wheel's and any the page began, has ended
        now = await page.evaluate(where)
        settled, last = (settled + 1 if now == last else 0), now
        await asyncio.sleep(0.2)
    assert last is not None
    scrolled, top, height = last
    assert before < scrolled <= before + 300 and top > height / 3, (before, last)  # where the reader left it
    await _downloaded(page, "md", chinese)
    assert file_name(chinese, "md") == "中文分词.md"
    entries = page.locator("#history-list li[data-state=completed]")
    await entries.nth(1).wait_for()
    assert await entries.count() == 2
    assert page.errors == []


@pytest.mark.parametrize("width", [DESKTOP, PHONE])
async def test_a_run_that_could_not_run_is_shown_as_failed(tmp_path, fakes, start_server, browser, width):
    """A task that failed is no report: said in words, in the page and in the history, with nothing to
    download or ask about."""
    fakes["tavily"].behaviour.delay_s = 10.0  # another client's task holds the key's one place meanwhile
    server = await _server(tmp_path, fakes, start_server, max_tasks_per_key=1)
    bearer = {"Authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession(headers=bearer) as session:
        body = {"task": "rank fusion", "headers": {"retrievers": "nosuch"}}
        async with session.post(f"{server.url}/report/", json=body) as response:
            assert response.status == 400  # refused at once, and kept as a failed job
        body = {"task": "dense retrieval", "headers": {"retrievers": "tavily"}}
        async with session.post(f"{server.url}/report/", json=body) as response:
            assert response.status == 200  # runs in the background, 10 s
    page = await _open(browser, server.url, width=width)
    await _sign_in(page)
    refused = page.locator("#history-list li[data-state=failed]")
    await refused.wait_for()
    assert "Could not run: unknown retriever 'nosuch'" in await refused.inner_text()  # the server's reason
    assert await refused.locator("button.question").count() == 0  # nothing to open

    await page.check("#retriever-list input[value=tavily]")
    await page.fill("#question", QUESTION)
    await page.click("#run")
    await page.locator("#report-card.failed").wait_for(timeout=30_000)
    await page.locator("#run:enabled").wait_for()
    why = "Could not run: you already run as many researches as this server allows at once; wait for one to finish"
    assert await page.inner_text("#report .failure") == why
    assert await page.inner_text("#notice-text") == why
    assert await page.is_hidden("#downloads-row") and await page.is_hidden("#chat-card")
    assert await page.inner_text("#status-line") == "The research could not run."
    failed = page.locator("#history-list li[data-state=failed]", has_text=QUESTION)
    await failed.wait_for()
    assert why in await failed.inner_text()  # the page's words for what it saw on the socket
    assert await failed.locator("button.question").count() == 0
    assert await page.locator("#history-list li[data-state=failed]").count() == 2
    assert [job["status"] for job in await _jobs(server, bearer)] == ["failed", "running", "failed"]
    await _fits_sideways(page)
    await _shot(page, tmp_path, f"failed-run-{width}")

    await page.reload()  # the server's list (GET /api/reports with GET /api/jobs) says the same
    await page.locator("#history-list li[data-state=failed]", has_text=QUESTION).wait_for()
    assert why in await page.inner_text("#history-list")
    assert page.errors == []


@pytest.mark.parametrize("width", [DESKTOP, PHONE])
async def test_a_long_question_keeps_the_page_short(tmp_path, fakes, start_server, browser, width):
    """A 10,000-character question is shown in a few lines, whole on demand; the page stays near the
    height a short question gives it, and nothing runs off a phone's screen sideways."""
    server = await _default_server(tmp_path, fakes, start_server, default_user="alice", max_task_chars=20_000)
    page = await _open(browser, server.url, width=width)
    await page.wait_for_selector("#retriever-list input[value=tavily]")
    assert await page.is_hidden("#user-slot #user-box")  # a default user: asked for nowhere near the question
    assert await page.is_visible("#access")  # acting as another user than alice: under Access
    assert await page.get_attribute("#access #user-id", "placeholder") == "alice"

    height = "document.documentElement.scrollHeight"
    await page.check("#retriever-list input[value=internal_biblio]")
    await page.fill("#question", QUESTION)
    await page.click("#run")
    await page.wait_for_selector("#downloads button[data-kind=pdf]", timeout=30_000)
    await page.wait_for_selector("#history-list li[data-state=completed]")
    short = await page.evaluate(height)
    await _fits_sideways(page)

    long_question = ("Rank fusion of lexical and dense retrieval: " * 230)[:9_999] + "?"
    assert len(long_question) == 10_000
    await page.fill("#question", long_question)
    await page.click("#run")
    await page.locator("#history-list li").nth(1).wait_for(timeout=30_000)  # the second run has ended
    await page.wait_for_selector("#downloads button[data-kind=pdf]")
    await _report_in_view(page)
    tall = await page.evaluate(height)
    assert tall <= short + 400, (short, tall)  # the question, three times on the page, in 3 lines each
    await _fits_sideways(page)
    await _shot(page, tmp_path, f"long-question-{width}")

    toggle = page.locator("#report h1 + button.clamp-toggle")
    assert await toggle.inner_text() == "Show the whole question"
    await toggle.click()
    assert await page.inner_text("#report h1") == long_question
    assert await page.evaluate(height) > tall + 1000  # whole, it is long
    await page.locator("#report h1 + button.clamp-toggle", has_text="Show less").click()
    assert await page.evaluate(height) <= tall + 2
    await _fits_sideways(page)
    assert page.errors == []
