"""Reading the pages behind results: main text as evidence, and the SSRF rules (every resolved address
public unless allow-listed, redirects re-checked, bodies and time capped), against local fake pages."""

from __future__ import annotations

import asyncio
import gc
import re
import socket
from collections.abc import Awaitable, Callable

import pytest
import websockets
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

from fedresearch.report.pages import PageReader, PageSkipped, public
from tests.conftest import logs, make_settings, report_of, run_task
from tests.pdfs import write_pdf

CHINESE = "".join(
    f"第{i}项发现：倒数排序融合在我们的试点研究中无需调参即可合并词法与稠密检索的排名。" for i in range(12)
)
ARTICLE = " ".join(
    f"Finding {i}: reciprocal rank fusion merged the lexical and dense rankings of our pilot study without tuning."
    for i in range(12)
)


class StaticResolver(AbstractResolver):
    """Names to addresses, as a DNS answer would give them; never asks a real resolver."""

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if host not in self.names:
            raise OSError(f"no such host {host}")
        address = self.names[host]
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        return [{"hostname": host, "host": address, "port": port, "family": family, "proto": 0, "flags": 0}]

    async def close(self) -> None:
        return None


@pytest.fixture
async def pages(tmp_path):
    pdf = write_pdf(
        tmp_path / "paper.pdf", ["Page one: fusion of rankings.", "Page two: dense retrieval wins on recall."]
    )

    async def article(request: web.Request) -> web.Response:
        ARTICLE_READS[f"http://pages.test:{request.url.port}"] = (
            ARTICLE_READS.get(f"http://pages.test:{request.url.port}", 0) + 1
        )
        html = f"""<html><head><title>Pilot study of fusion</title></head><body>
        <nav><a href="/">Home</a> Subscribe to our newsletter</nav>
        <article><h1>Pilot study of fusion</h1><p>{ARTICLE}</p></article>
        <footer>Copyright Example Media. Advertise with us.</footer></body></html>"""
        return web.Response(text=html, content_type="text/html")

    async def pause(request: web.Request) -> web.Response:
        PAUSED["now"] += 1
        PAUSED["most"] = max(PAUSED["most"], PAUSED["now"])
        await asyncio.sleep(0.2)
        PAUSED["now"] -= 1
        return web.Response(
            text=f"<html><body><article><p>{ARTICLE}</p></article></body></html>", content_type="text/html"
        )

    async def words(request: web.Request) -> web.Response:
        WORDS_READS[request.path] = WORDS_READS.get(request.path, 0) + 1
        return web.Response(text="fusion " * int(request.match_info["count"]), content_type="text/plain")

    async def slow(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/html"})
        await response.prepare(request)
        for _ in range(50):
            await response.write(b"<p>slow</p>")
            await asyncio.sleep(0.1)
        return response

    async def cookie(request: web.Request) -> web.Response:
        cookies_seen.append(request.headers.get("Cookie"))
        response = web.Response(text=f"<html><body><p>{ARTICLE}</p></body></html>", content_type="text/html")
        response.set_cookie("visitor", "alice-session", path="/")
        return response

    def fixed(make: Callable[[], web.StreamResponse]) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """A handler answering what `make` makes (aiohttp deprecates plain functions as handlers)."""

        async def answer(request: web.Request) -> web.StreamResponse:
            return make()

        return answer

    def encoded(body: str, encoding: str, content_type: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        return fixed(lambda: web.Response(body=body.encode(encoding), headers={"Content-Type": content_type}))

    def redirect(location: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def answer(request: web.Request) -> web.StreamResponse:
            raise web.HTTPFound(location)

        return answer

    chinese = (
        f"<html><head>{{meta}}<title>融合检索</title></head><body><article><p>{CHINESE}</p></article></body></html>"
    )
    quoted = f"<html><body><article><p>{ARTICLE} \u201cFused\u201d \u2014 caf\u00e9.</p></article></body></html>"
    cookies_seen: list[str | None] = []
    app = web.Application()
    app.router.add_get("/gbk-header", encoded(chinese.format(meta=""), "gbk", "text/html; charset=gb2312"))
    app.router.add_get("/gbk-meta", encoded(chinese.format(meta='<meta charset="gbk">'), "gbk", "text/html"))
    app.router.add_get("/gbk-undeclared", encoded(chinese.format(meta=""), "gb18030", "text/html"))
    app.router.add_get("/cp1252", encoded(quoted, "cp1252", "text/html; charset=iso-8859-1"))
    app.router.add_get("/sjis.txt", encoded("検索拡張生成の報告。" * 5, "shift_jis", "text/plain; charset=shift_jis"))
    app.router.add_get("/article", article)
    app.router.add_get("/words/{count}", words)
    app.router.add_get("/pause/{number}", pause)
    app.router.add_get("/cookie", cookie)
    app.router.add_get("/paper.pdf", fixed(lambda: web.FileResponse(pdf, headers={"Content-Type": "application/pdf"})))
    app.router.add_get("/image", fixed(lambda: web.Response(body=b"\x89PNG....", content_type="image/png")))
    huge = "<p>" + "x" * 300_000 + "</p>"
    app.router.add_get("/huge", fixed(lambda: web.Response(text=huge, content_type="text/html")))
    app.router.add_get("/slow", slow)
    app.router.add_get("/to-private", redirect("http://127.0.0.2/admin"))
    app.router.add_get("/to-internal-name", redirect("http://internal.test/"))
    app.router.add_get("/loop", redirect("/loop"))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    COOKIES_SEEN[f"http://pages.test:{port}"] = cookies_seen
    yield f"http://pages.test:{port}"
    await runner.cleanup()


COOKIES_SEEN: dict[str, list[str | None]] = {}  # per fake site: the Cookie header of each request to /cookie
ARTICLE_READS: dict[str, int] = {}  # per fake site: requests to /article
WORDS_READS: dict[str, int] = {}  # requests to each /words/{count}
PAUSED = {"now": 0, "most": 0}  # requests to /pause/{number} being answered, and the most at once


RESOLVER = StaticResolver(
    {"pages.test": "127.0.0.1", "evil.test": "127.0.0.1", "internal.test": "10.1.2.3", "v6.test": "::1"}
)


def reader(tmp_path, cache_chars: int | None = None, **settings) -> PageReader:
    values = {"fetch_allowed_hosts": ["pages.test"], "fetch_timeout_s": 2.0, "fetch_max_bytes": 100_000, **settings}
    if cache_chars is None:
        return PageReader(make_settings(tmp_path, **values), resolver=RESOLVER)
    return PageReader(make_settings(tmp_path, **values), resolver=RESOLVER, cache_chars=cache_chars)


async def test_main_text_of_html_and_pdf(tmp_path, pages):
    pages_reader = reader(tmp_path)
    try:
        page = await pages_reader.read(f"{pages}/article")
        text = page.sections[0].text
        assert "Finding 11" in text and "newsletter" not in text and "Advertise" not in text
        assert page.kind == "html" and page.title == "Pilot study of fusion"
        pdf = await pages_reader.read(f"{pages}/paper.pdf")
        assert pdf.kind == "pdf" and [s.page for s in pdf.sections] == [1, 2]
    finally:
        await pages_reader.close()


def test_reading_html_skips_the_extensive_date_search_it_has_no_use_for(monkeypatch):
    """Only a page's title and text are used; trafilatura's default date search reads the whole page
    (about 9 ms of a real 38 kB page's 22). The text and title stay what they were."""
    import trafilatura

    from fedresearch.report import pages as pages_module

    searches: list[bool] = []
    real = trafilatura.metadata.find_date

    def find_date(*args: object, **options: object) -> object:
        searches.append(bool(options.get("extensive_search", True)))
        return real(*args, **options)

    monkeypatch.setattr(trafilatura.metadata, "find_date", find_date)
    body = (
        "<html><head><title>Pilot study of fusion | Example</title></head><body><nav>Home News</nav>"
        f"<article><h1>Pilot study of fusion</h1><p>{ARTICLE}</p><p>Published on 3 March 2024.</p></article>"
        "</body></html>"
    ).encode()
    page = pages_module.extract("https://pages.test/a", "https://pages.test/a", "text/html", body)
    assert searches == [False]
    assert page.title == "Pilot study of fusion" and "Finding 11" in page.sections[0].text
    full = trafilatura.bare_extraction(
        body.decode(), url="https://pages.test/a", include_comments=False, favor_precision=True, with_metadata=True
    )
    assert (page.title, page.sections[0].text) == (full.title, full.text)  # what the default search gave


def test_trafilaturas_fallback_runs_only_where_its_own_pass_found_little(monkeypatch):
    """Its fallback (readability and jusText compared with its own answer) costs a third of a read
    and matters where its own pass found little: an article is read in one pass; a page whose text
    sits in bare nested divs, where the own pass finds nothing, is read whole by the fallback."""
    import trafilatura

    from fedresearch.report import pages as pages_module

    passes: list[bool] = []
    real = trafilatura.bare_extraction

    def bare_extraction(*args: object, **options: object) -> object:
        passes.append(bool(options.get("fast")))
        return real(*args, **options)

    monkeypatch.setattr(trafilatura, "bare_extraction", bare_extraction)
    article = (
        "<html><head><title>Pilot study of fusion</title></head><body><nav>Home News</nav>"
        f"<article><h1>Pilot study of fusion</h1><p>{ARTICLE}</p></article></body></html>"
    ).encode()
    page = pages_module.extract("https://pages.test/a", "https://pages.test/a", "text/html", article)
    assert passes == [True]
    assert page.title == "Pilot study of fusion" and "Finding 11" in page.sections[0].text
    passes.clear()
    bare = "<html><head><title>Notes</title></head><body><div class='x'>" + "".join(
        f"<div>{sentence}.</div>" for sentence in ARTICLE.split(". ")
    )
    page = pages_module.extract("https://pages.test/b", "https://pages.test/b", "text/html", (bare + "</div>").encode())
    assert passes == [True, False]
    assert "Finding 0" in page.sections[0].text and "Finding 11" in page.sections[0].text
    assert page.title == "Notes"


async def test_a_result_with_a_title_has_its_page_read_without_looking_for_one(tmp_path, pages):
    """A search result has its title: its page is read without trafilatura's metadata pass (a third
    of an HTML page's reading), the same text. A URL without a title (`source_urls`) gets the page's;
    a page read for a title serves both from the cache, one read without serves only the titled."""
    pages_reader = reader(tmp_path)
    url = f"{pages}/article"
    try:
        untitled = await pages_reader.read(url, titled=False)
        assert untitled.title == "" and not untitled.titled and ARTICLE_READS[pages] == 1
        titled = await pages_reader.read(url)  # wants the title the cached page has not looked for
        assert titled.title == "Pilot study of fusion" and ARTICLE_READS[pages] == 2
        assert titled.sections[0].text == untitled.sections[0].text
        assert (await pages_reader.read(url, titled=False)) is titled and ARTICLE_READS[pages] == 2
        assert (await pages_reader.read(url)) is titled and ARTICLE_READS[pages] == 2
    finally:
        await pages_reader.close()


async def test_a_hosts_cap_holds_while_its_reads_run_and_goes_with_them(tmp_path, pages):
    """FETCH_PER_HOST reads of a host at once; the cap was kept for every host ever read, so it
    grew with every site a search result or a client's URL named."""
    pages_reader = reader(tmp_path, fetch_per_host=2)
    PAUSED.update(now=0, most=0)
    try:
        read = await asyncio.gather(*(pages_reader.read(f"{pages}/pause/{number}") for number in range(6)))
        assert len(read) == 6 and PAUSED["most"] == 2
        gc.collect()
        assert len(pages_reader._hosts) == 0
    finally:
        await pages_reader.close()


async def test_the_page_cache_is_bounded_in_characters_least_recently_read_first(tmp_path, pages):
    """Counted in pages alone (512), the cache held 512 PDFs or text files of FETCH_MAX_BYTES each:
    gigabytes in every process. Now its text is bounded too (16M characters; 1,000 here)."""
    pages_reader = reader(tmp_path, cache_chars=1_000)
    WORDS_READS.clear()

    async def read(count: int) -> int:
        """Reads /words/{count} (7 characters a word, less the last space); how often the site was asked."""
        page = await pages_reader.read(f"{pages}/words/{count}")
        assert page.chars == 7 * count - 1
        return WORDS_READS[f"/words/{count}"]

    try:
        assert [await read(40), await read(41), await read(40)] == [1, 1, 1]  # 40 read again: from the cache
        assert await read(42) == 1 and pages_reader.cached_chars == sum(7 * count - 1 for count in (40, 41, 42))
        assert await read(43) == 1  # over 1,000: the least recently read, 41, goes
        assert pages_reader.cached_chars <= 1_000
        assert [await read(40), await read(42), await read(43)] == [1, 1, 1]
        assert await read(41) == 2
        held = pages_reader.cached_chars
        assert await read(200) == 1 and await read(200) == 2  # larger than the whole bound: never kept
        assert pages_reader.cached_chars == held  # and nothing pushed out for it
        assert [await read(42), await read(43), await read(41)] == [1, 1, 2]  # still served from the cache
    finally:
        await pages_reader.close()


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/gbk-header", "倒数排序融合"),  # charset=gb2312 in the header, read as browsers do (GB18030)
        ("/gbk-meta", "倒数排序融合"),  # <meta charset="gbk"> only
        ("/gbk-undeclared", "倒数排序融合"),  # nothing declared: not UTF-8, so guessed
        ("/cp1252", "\u201cFused\u201d \u2014 caf\u00e9"),  # iso-8859-1 declared, windows-1252 sent
        ("/sjis.txt", "検索拡張生成の報告"),  # a text page in Shift_JIS
    ],
)
async def test_pages_are_read_in_the_encoding_they_declare_or_their_bytes_show(tmp_path, pages, path, expected):
    """Read as UTF-8 whatever they were, pages in GBK, Shift_JIS or windows-1252 became mojibake."""
    pages_reader = reader(tmp_path)
    try:
        page = await pages_reader.read(f"{pages}{path}")
    finally:
        await pages_reader.close()
    text = page.sections[0].text
    assert expected in text and "\ufffd" not in text, text[:200]


async def test_a_cookie_a_page_sets_is_never_sent_again(tmp_path, pages):
    """The reader serves every user: a cookie kept from one user's read would go with the next
    user's request to that site (and the jar would grow with every site read)."""
    pages_reader = reader(tmp_path)
    try:
        for n in range(2):
            await pages_reader.read(f"{pages}/cookie?n={n}")  # two pages: one would be read once
    finally:
        await pages_reader.close()
    assert COOKIES_SEEN[pages] == [None, None]


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1/", "not a public address"),
        ("http://[::1]/", "not a public address"),
        ("http://169.254.169.254/latest/meta-data/", "not a public address"),
        ("http://10.0.0.1/", "not a public address"),
        ("http://100.64.0.1/", "not a public address"),  # CGNAT
        ("http://[::ffff:127.0.0.1]/", "not a public address"),
        ("http://224.0.0.1/", "not a public address"),
        ("http://0.0.0.0/", "not a public address"),
        ("http://metadata.google.internal/", "metadata"),
        ("http://evil.test/", "resolves to 127.0.0.1"),  # a name pointing at loopback
        ("http://v6.test/", "resolves to ::1"),
        ("http://internal.test/", "resolves to 10.1.2.3"),
        ("file:///etc/passwd", "not an http(s) URL"),
        ("http://[::1/", "not a URL that can be read"),  # urllib raises on the unclosed bracket
    ],
)
async def test_ssrf_refuses_every_non_public_address(tmp_path, url, reason):
    pages_reader = reader(tmp_path)
    try:
        with pytest.raises(PageSkipped, match=re.escape(reason)):
            await pages_reader.read(url)
    finally:
        await pages_reader.close()


@pytest.mark.parametrize("url", ["http://2130706433/", "http://0177.0.0.1/", "http://0x7f.0.0.1/", "http://127.1/"])
async def test_decimal_octal_and_short_forms_of_loopback_are_refused(tmp_path, url):
    """aiohttp does not treat these as IP literals; the system resolver turns them into 127.0.0.1
    (no DNS query), and the guarded resolver refuses that."""
    pages_reader = PageReader(make_settings(tmp_path, fetch_timeout_s=2.0))
    try:
        with pytest.raises(PageSkipped, match=r"127\.0\.0\.1 is not a public address"):
            await pages_reader.read(url)
    finally:
        await pages_reader.close()


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/to-private", "redirected to http://127.0.0.2/admin, refused"),
        ("/to-internal-name", "resolves to 10.1.2.3"),
        ("/loop", "more than 5 redirects"),
        ("/huge", "FETCH_MAX_BYTES"),
        ("/slow", "FETCH_TIMEOUT_S"),
        ("/image", "neither HTML, PDF nor text (image/png)"),
    ],
)
async def test_redirects_sizes_time_and_types(tmp_path, pages, path, reason):
    pages_reader = reader(tmp_path, fetch_timeout_s=0.5)
    try:
        with pytest.raises(PageSkipped, match=re.escape(reason)):
            await pages_reader.read(f"{pages}{path}")
    finally:
        await pages_reader.close()


def test_public_addresses():
    import ipaddress

    assert public(ipaddress.ip_address("93.184.216.34")) and public(ipaddress.ip_address("2606:2800:220:1::1"))
    for private in ("192.168.1.1", "172.16.0.1", "fd00:ec2::254", "fe80::1", "2002:7f00:1::1", "240.0.0.1"):
        assert not public(ipaddress.ip_address(private)), private


async def test_web_results_are_read_and_become_the_evidence(tmp_path, fakes, pages, start_server, monkeypatch):
    import threading

    from fedresearch.report import pages as pages_module

    read_on: list[str] = []
    real_extract = pages_module.extract

    def extract(*args: object) -> object:
        read_on.append((str(args[0]).rsplit("/", 1)[-1], threading.current_thread().name))
        return real_extract(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(pages_module, "extract", extract)
    fakes["tavily"].behaviour.items = [
        {"url": f"{pages}/article", "title": "Pilot", "content": "A short snippet about fusion.", "score": 0.9},
        {"url": "http://evil.test/", "title": "Evil", "content": "Another snippet about fusion here.", "score": 0.8},
    ]
    settings = make_settings(tmp_path, fakes, fetch_pages=True, fetch_allowed_hosts=["pages.test"])
    server = await start_server(settings, resolver=RESOLVER)
    async with websockets.connect(server.ws_url) as ws:
        task = {"task": "reciprocal rank fusion pilot study", "headers": {"retrievers": "tavily"}}
        task["source_urls"], task["complement_source_urls"] = [f"{pages}/paper.pdf"], True
        frames = await run_task(ws, task)
    fetching = {f["metadata"].get("url"): f["metadata"] for f in logs(frames, "fetching") if f["metadata"].get("url")}
    assert fetching[f"{pages}/article"]["status"] == "fetched" and fetching[f"{pages}/paper.pdf"]["status"] == "fetched"
    assert (
        fetching["http://evil.test/"]["status"] == "skipped" and "127.0.0.1" in fetching["http://evil.test/"]["reason"]
    )
    report = report_of(frames)
    assert "Finding" in report and "merged the lexical and dense rankings" in report  # the page, not the snippet
    # the result's own title, its page read without looking for one
    assert re.search(r"^\[1\] .*\*Pilot\*\.", report, re.MULTILINE), report
    # HTML on the app's work threads (WORK_THREADS), not asyncio's pool of a thread a core plus four;
    # a PDF, read by a child process, on asyncio's pool: waiting for it never holds a work thread
    threads = dict(read_on)
    assert len(read_on) == 2 and threads["article"].startswith("fedresearch-work"), read_on
    assert not threads["paper.pdf"].startswith("fedresearch-work"), read_on


async def test_a_source_url_without_a_title_takes_its_pages(tmp_path, fakes, pages, start_server):
    settings = make_settings(tmp_path, fakes, fetch_pages=True, fetch_allowed_hosts=["pages.test"])
    server = await start_server(settings, resolver=RESOLVER)
    async with websockets.connect(server.ws_url) as ws:
        task = {"task": "reciprocal rank fusion pilot study", "report_source": "static"}
        frames = await run_task(ws, {**task, "source_urls": [f"{pages}/article"]})
    entry = rf"^\[1\] .*\*Pilot study of fusion\*.*\]\({re.escape(pages)}/article\)$"
    assert re.search(entry, report_of(frames), re.MULTILINE), report_of(frames)
