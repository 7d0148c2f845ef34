"""Reading the pages behind results: fetched under SSRF rules, their main text extracted.

A URL is fetched only if every address its host resolves to is public (not loopback, private,
link-local, CGNAT, multicast, reserved, unspecified, or a cloud metadata address), unless the host
is in FETCH_ALLOWED_HOSTS. The check runs in the connector's resolver, so it holds for the address
actually connected to (no DNS rebinding between check and use) and for every redirect hop; IP
literals, which aiohttp never resolves, are checked before the request. Redirects are followed by
hand, at most five, each re-checked. Bodies and time are capped, hosts get a concurrency cap, and
answers are cached. HTML goes through trafilatura (bench/extract.py: it and readability-lxml keep
every article sentence and leak no boilerplate on the test pages; resiliparse is 100x faster but
leaks a third of it), PDFs through the library's PDF parser.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import time
import weakref
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit

import aiohttp
import charset_normalizer
import trafilatura
from aiohttp.abc import AbstractResolver, ResolveResult
from w3lib.encoding import html_to_unicode, read_bom, resolve_encoding

from fedresearch.core.identifiers import split_url
from fedresearch.core.settings import Settings
from fedresearch.core.timed_cache import TimedCache
from fedresearch.core.work import WorkPool, run_on
from fedresearch.federation.http import BodyTooLarge, read_capped
from fedresearch.library.formats import Section, UnsupportedFile, pdf_sections

_MAX_REDIRECTS = 5
_CACHE_ENTRIES = 512
_CACHE_CHARS = 16_000_000  # of text, 16-64 MB (core/timed_cache.py)
_METADATA_HOSTS = {"metadata.google.internal", "metadata", "instance-data"}
_Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_LEGACY_IPV4 = re.compile(r"(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){0,3}")


class PageSkipped(Exception):
    """The page was not read; the message says why (safe to show)."""


class UnsafeAddress(OSError):
    """Raised by the resolver; aiohttp wraps OSErrors from resolvers into its connection errors."""


def public(address: _Address) -> bool:
    """Whether connecting to `address` can only reach the public internet."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour or (address.teredo[1] if address.teredo else None)
        if embedded is not None:
            return public(embedded)
    return address.is_global and not address.is_multicast


def literal_address(host: str) -> _Address | None:
    """The address a host names by itself: standard literals, and the decimal, octal, hex and short
    IPv4 forms (2130706433, 0177.0.0.1, 0x7f.1, 127.1) that C resolvers also accept."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    if _LEGACY_IPV4.fullmatch(host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


class GuardedResolver(AbstractResolver):
    """Resolves with `inner` and refuses a host any of whose addresses is not public."""

    def __init__(self, inner: AbstractResolver, allowed: frozenset[str]) -> None:
        self.inner = inner
        self.allowed = allowed

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self.inner.resolve(host, port, family)
        if host.lower().rstrip(".") in self.allowed:
            return found
        for entry in found:
            address = ipaddress.ip_address(entry["host"])
            if not public(address):
                raise UnsafeAddress(f"{host} resolves to {address}, which is not a public address")
        return found

    async def close(self) -> None:
        await self.inner.close()


@dataclass(frozen=True)
class Page:
    url: str
    final_url: str
    title: str
    sections: list[Section]
    kind: str  # html, pdf or text
    elapsed_ms: float = 0.0
    titled: bool = True  # its title was looked for (an HTML page read without one has "")

    @property
    def chars(self) -> int:
        return sum(len(section.text) for section in self.sections)


@dataclass
class PageReader:
    """One per app: the guarded session, per-host caps and the page cache shared by every task."""

    settings: Settings
    resolver: AbstractResolver | None = None
    # the threads a page's text is read on: the app's work pool, not asyncio's (a thread a core plus
    # four), whose extra threads only fought for the GIL: on 2 cores one process read 15% more tasks
    # with pages a second on the pool's 2 (bench.scaling --pages)
    work: WorkPool | None = None
    cache_chars: int = _CACHE_CHARS  # the page cache's bound in characters of text
    _session: aiohttp.ClientSession | None = field(default=None, init=False)
    # a host's cap lives while one of its reads runs: kept for every host ever read, they grew with
    # every site a search result or a client's URL named
    _hosts: weakref.WeakValueDictionary[str, asyncio.Semaphore] = field(
        default_factory=weakref.WeakValueDictionary, init=False
    )
    _cache: TimedCache[str, Page] = field(init=False)

    def __post_init__(self) -> None:
        ttl_s = self.settings.upstream_cache_ttl_s
        self._cache = TimedCache(ttl_s, _CACHE_ENTRIES, self.cache_chars, lambda page: page.chars)

    @property
    def allowed(self) -> frozenset[str]:
        return frozenset(host.lower() for host in self.settings.fetch_allowed_hosts)

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            resolver = GuardedResolver(self.resolver or aiohttp.DefaultResolver(), self.allowed)
            connector = aiohttp.TCPConnector(resolver=resolver, limit=64, limit_per_host=self.settings.fetch_per_host)
            headers = {"User-Agent": "fedresearch (research report; +https://github.com/fedresearch)"}
            timeout = aiohttp.ClientTimeout(total=None, connect=5.0)
            # no cookie jar: it serves every user, so a cookie one user's read received would go
            # with the next user's request to that site, and the jar would grow with every site read
            self._session = aiohttp.ClientSession(
                connector=connector,
                headers=headers,
                timeout=timeout,
                trust_env=False,
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def read(self, url: str, titled: bool = True) -> Page:
        """The page's main text, and with `titled` its title; or PageSkipped saying why it was not read.

        A page's title is for a source that has none (a URL the user gave): finding it runs
        trafilatura's metadata pass (authors, sitename, categories, tags, license and a date too),
        a third of an HTML page's reading."""
        self.check(url)
        cached = self._cache.get(url)
        if cached is not None and (cached.titled or not titled):
            return cached
        host = (urlsplit(url).hostname or "").lower()
        started = time.perf_counter()
        cap = self._hosts.get(host)
        if cap is None:
            cap = self._hosts[host] = asyncio.Semaphore(self.settings.fetch_per_host)
        async with cap:
            try:
                async with asyncio.timeout(self.settings.fetch_timeout_s):
                    final_url, content_type, charset, body = await self._fetch(url)
            except TimeoutError:
                raise PageSkipped(f"no answer within {self.settings.fetch_timeout_s:g} s (FETCH_TIMEOUT_S)") from None
        # a PDF is read by a child process: a wait of up to minutes, kept off the few work threads
        pool = None if is_pdf(content_type, body) else self.work
        page = await run_on(pool, extract, url, final_url, content_type, body, titled, charset)
        elapsed_ms = round((time.perf_counter() - started) * 1000, 1)
        page = Page(url, final_url, page.title, page.sections, page.kind, elapsed_ms, page.titled)
        self._cache.put(url, page)
        return page

    def check(self, url: str) -> None:
        """The checks a URL must pass before any connection: scheme, host, and an IP literal's address."""
        parts = split_url(url)
        if parts is None:
            raise PageSkipped("not a URL that can be read")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PageSkipped("not an http(s) URL")
        host = parts.hostname.lower().rstrip(".")
        if host in self.allowed:
            return
        address = literal_address(host)
        if address is not None and not public(address):
            raise PageSkipped(f"{address} is not a public address (FETCH_ALLOWED_HOSTS)")
        if host in _METADATA_HOSTS:
            raise PageSkipped(f"{host} is a cloud metadata host")

    async def _fetch(self, url: str) -> tuple[str, str, str | None, bytes]:
        for _ in range(_MAX_REDIRECTS + 1):
            try:
                async with self.session().get(url, allow_redirects=False) as response:
                    if response.status in (301, 302, 303, 307, 308):
                        url = self._redirect(url, response.headers.get("Location"))
                        continue
                    if response.status >= 400:
                        raise PageSkipped(f"HTTP {response.status}")
                    body = await _capped(response, self.settings.fetch_max_bytes)
                    return url, response.content_type, response.charset, body
            except aiohttp.ClientConnectorError as error:
                if isinstance(error.os_error, UnsafeAddress):
                    raise PageSkipped(f"{error.os_error} (FETCH_ALLOWED_HOSTS)") from None
                raise PageSkipped(f"unreachable ({type(error).__name__})") from None
            except aiohttp.ClientError as error:
                raise PageSkipped(f"failed ({type(error).__name__})") from None
        raise PageSkipped(f"more than {_MAX_REDIRECTS} redirects")

    def _redirect(self, url: str, location: str | None) -> str:
        if not location:
            raise PageSkipped("a redirect without Location")
        following = urljoin(url, location)
        try:
            self.check(following)
        except PageSkipped as refused:
            raise PageSkipped(f"redirected to {following}, refused: {refused}") from None
        return following

    @property
    def cached_chars(self) -> int:
        """The characters of text the page cache holds."""
        return self._cache.held


async def _capped(response: aiohttp.ClientResponse, limit: int) -> bytes:
    try:
        return await read_capped(response, limit)
    except BodyTooLarge as large:
        if large.declared is not None:
            raise PageSkipped(f"{large.declared} bytes, over FETCH_MAX_BYTES ({limit})") from None
        raise PageSkipped(f"more than FETCH_MAX_BYTES ({limit} bytes)") from None


def is_pdf(content_type: str, body: bytes) -> bool:
    return content_type == "application/pdf" or body.startswith(b"%PDF-")


def extract(
    url: str, final_url: str, content_type: str, body: bytes, titled: bool = True, charset: str | None = None
) -> Page:
    """The main text of an answer, and with `titled` an HTML page's title (CPU work: run it in a thread).
    `charset` is the one the answer's Content-Type names, if any."""
    if is_pdf(content_type, body):
        try:
            sections = pdf_sections(body)
        except UnsupportedFile as error:
            raise PageSkipped(str(error)) from None
        return Page(url, final_url, "", sections, "pdf")
    if content_type in ("text/html", "application/xhtml+xml"):
        return _html(url, final_url, decoded(body, charset, html=True), titled)
    if content_type.startswith("text/"):
        text = decoded(body, charset, html=False).strip()
        if not text:
            raise PageSkipped("an empty text page")
        return Page(url, final_url, "", [Section(text=text)], "text")
    raise PageSkipped(f"neither HTML, PDF nor text ({content_type or 'no content type'})")


# Of the metadata only the title is used. trafilatura's default date search reads the whole page for
# dates ("extensive"): on 60 real 38 kB pages it was 40% of the reading's CPU (22.1 against 13.0 ms
# a page, the same text and title on all of them).
_DATE_SEARCH = {"original_date": True, "extensive_search": False}


def decoded(body: bytes, charset: str | None, html: bool) -> str:
    """A page's text in the encoding it declares (a byte-order mark, its Content-Type's charset or,
    for HTML, its `<meta charset>`: w3lib, with the names browsers read, gb2312 as GB18030 and
    latin-1 as windows-1252), else UTF-8 when it decodes as UTF-8, else charset_normalizer's guess.
    Read as UTF-8 whatever they were, pages in GBK, Shift_JIS or windows-1252 were mojibake."""
    header = f"text/html; charset={charset}" if charset else None
    if html:
        return html_to_unicode(header, body, auto_detect_fun=_undeclared)[1]
    encoding = read_bom(body)[0] or (resolve_encoding(charset) if charset else None) or _undeclared(body) or "utf-8"
    return body.decode(encoding, errors="replace").removeprefix("\ufeff")


def _undeclared(body: bytes) -> str | None:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        best = charset_normalizer.from_bytes(body).best()
        return best.encoding if best is not None else None
    return "utf-8"


# trafilatura's fallback (readability's and jusText's answers compared with its own) is over a third
# of a read's CPU and changes what is read mostly where its own pass found little: on trafilatura's
# evaluation corpus (990 real pages, `bench.extract --eval-corpus`) the fallback only under this
# length gave the F1 of always (0.922, the same titles) for 23% less CPU; never, recall fell from
# 0.920 to 0.892.
_FALLBACK_BELOW_CHARS = 1_000


def _html(url: str, final_url: str, markup: str, titled: bool) -> Page:
    text, title = _main_text(markup, final_url, titled, fast=True)
    if len(text) < _FALLBACK_BELOW_CHARS:
        # a first pass that found too little to keep returned no title either
        text, found_title = _main_text(markup, final_url, titled and not title, fast=False)
        title = title or found_title
    if not text:
        raise PageSkipped("no main text found in the HTML")
    return Page(url, final_url, title, [Section(text=text)], "html", titled=titled)


def _main_text(markup: str, final_url: str, titled: bool, fast: bool) -> tuple[str, str]:
    extracted: Any = trafilatura.bare_extraction(
        markup,
        url=final_url,
        fast=fast,
        include_comments=False,
        favor_precision=True,
        with_metadata=titled,
        date_extraction_params=_DATE_SEARCH,
    )
    if extracted is None:
        return "", ""
    return str(getattr(extracted, "text", "") or "").strip(), str(getattr(extracted, "title", "") or "").strip()
