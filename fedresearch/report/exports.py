"""The formats a saved report is offered in (`EXPORT_FORMATS`, the one list every other part reads:
the `path` frame, the /reports/ route and its media types, the saved files, the page's buttons),
and the renderers of its self-contained HTML, PDF and DOCX, made from its Markdown on first request,
and of its references as BibTeX and RIS, made from its saved record (report/bibfiles.py).

Markdown is parsed once by markdown-it-py (CommonMark, the parser GPT-Researcher's clients' viewers
agree with). HTML comes from a jinja2 template with its CSS inline; PDF is that HTML through
WeasyPrint (links, headings, lists, tables and, with a CJK font installed, Chinese); DOCX is built
with python-docx from the same tokens, links kept as Word hyperlinks. Rendering is CPU work, done
only when someone asks for the file: in a thread, and for PDF and DOCX in a process of its own,
bounded in time and memory (report/render.py).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docx
from docx.opc.constants import RELATIONSHIP_TYPE
from docx.oxml import OxmlElement
from docx.oxml.ns import qn
from docx.shared import Mm
from docx.text.paragraph import Paragraph
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore
from markdown_it.token import Token

from fedresearch.core.text import has_cjk
from fedresearch.report.fonts import cjk_font_installed
from fedresearch.report.markup import LIBRARY_LINK

_MARKDOWN = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table")


def _unlink_library(state: StateCore) -> None:
    """A reference's link to the page's view of a library passage (`#library/…`) opens nothing in a
    file: its text stays, the link goes."""
    for token in state.tokens:
        if token.type != "inline" or not token.children:
            continue
        kept: list[Token] = []
        closing = 0
        for child in token.children:
            if child.type == "link_open" and str(child.attrs.get("href") or "").startswith(LIBRARY_LINK):
                closing += 1
                continue
            if child.type == "link_close" and closing:
                closing -= 1
                continue
            kept.append(child)
        token.children = kept


_MARKDOWN.core.ruler.push("unlink_library", _unlink_library)
_TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=select_autoescape(["html", "j2"]),
    auto_reload=False,
)


log = logging.getLogger("fedresearch")

# a page's width and height in millimetres, by the names REPORT_PAGE_SIZE takes (CSS's `size` names)
PAGE_SIZES = {"A4": (210.0, 297.0), "Letter": (215.9, 279.4)}
_MARGIN_MM = 20.0


def to_html(markdown: str, title: str, page: str = "A4") -> str:
    """A self-contained, printable page: no script, no external asset; raw HTML in the Markdown is escaped."""
    body = _MARKDOWN.render(markdown)
    return _TEMPLATES.get_template("report.html.j2").render(title=title, body=body, page=page)


def to_pdf(markdown: str, title: str, page: str = "A4") -> bytes:
    """The report as a PDF, from its HTML. Nothing is fetched while rendering: a report's page is
    self-contained, and an image or a style sheet a question, a source or a model put in its
    Markdown would otherwise be fetched by the server (any address, redirects followed), with the
    time and memory an answer of any size takes."""
    from weasyprint import HTML  # imported on first use: it loads pango and fontconfig

    return bytes(HTML(string=to_html(markdown, title, page), url_fetcher=_fetcher()).write_pdf())


def _fetcher() -> Any:
    from weasyprint import URLFetcher

    class FetchNothing(URLFetcher):  # type: ignore[misc]  # WeasyPrint is untyped
        def fetch(self, url: str, headers: object = None) -> Any:
            raise ValueError(f"a report's export fetches nothing ({url[:80]} left out)")

    return FetchNothing()


def to_docx(markdown: str, title: str, page: str = "A4") -> bytes:
    document = docx.Document()
    document.core_properties.title = title
    width, height = PAGE_SIZES[page]
    for section in document.sections:  # python-docx's template is Letter; the PDF's size, margins
        section.page_width, section.page_height = Mm(width), Mm(height)
        section.left_margin = section.right_margin = section.top_margin = section.bottom_margin = Mm(_MARGIN_MM)
    tokens = _MARKDOWN.parse(markdown)
    style = "Normal"
    for index, token in enumerate(tokens):
        if token.type == "heading_open":
            style = f"Heading {min(int(token.tag[1]), 4)}" if token.tag != "h1" else "Title"
        elif token.type == "bullet_list_open":
            style = "List Bullet"
        elif token.type == "ordered_list_open":
            style = "List Number"
        elif token.type in ("bullet_list_close", "ordered_list_close", "heading_close"):
            style = "Normal"
        elif token.type == "inline":
            _inline(document.add_paragraph(style=style), token.children or [])
            if tokens[index - 1].type == "heading_open":
                style = "Normal"
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def _inline(paragraph: Paragraph, children: list[Token]) -> None:
    link: str | None = None
    bold = italic = False
    for child in children:
        if child.type == "link_open":
            link = str(child.attrs.get("href") or "")
        elif child.type == "link_close":
            link = None
        elif child.type in ("strong_open", "strong_close"):
            bold = child.type == "strong_open"
        elif child.type in ("em_open", "em_close"):
            italic = child.type == "em_open"
        elif child.type in ("text", "code_inline"):
            if link:
                _hyperlink(paragraph, child.content, link)
            else:
                run = paragraph.add_run(child.content)
                run.bold, run.italic = bold, italic
        elif child.type in ("softbreak", "hardbreak"):
            paragraph.add_run(" ")


def _hyperlink(paragraph: Paragraph, text: str, url: str) -> None:
    """python-docx has no hyperlink API; this is the element Word itself writes."""
    relation = paragraph.part.relate_to(url, RELATIONSHIP_TYPE.HYPERLINK, is_external=True)
    hyperlink: Any = OxmlElement("w:hyperlink")
    hyperlink.set(qn("r:id"), relation)
    run: Any = OxmlElement("w:r")
    properties: Any = OxmlElement("w:rPr")
    style: Any = OxmlElement("w:rStyle")
    style.set(qn("w:val"), "Hyperlink")
    color: Any = OxmlElement("w:color")
    color.set(qn("w:val"), "1A4D8F")
    underline: Any = OxmlElement("w:u")
    underline.set(qn("w:val"), "single")
    properties.extend([style, color, underline])
    run.append(properties)
    content: Any = OxmlElement("w:t")
    content.text = text
    content.set(qn("xml:space"), "preserve")
    run.append(content)
    hyperlink.append(run)
    paragraph._p.append(hyperlink)


Renderer = Callable[[str, str, str], bytes]  # (the report's Markdown, its title, its page size) -> the file
RecordRenderer = Callable[[dict[str, Any]], bytes]  # the saved JSON record -> the file (its references)
Lacks = Callable[[str], str | None]  # what this host lacks to render this Markdown well, said for a reader


NO_CJK_FONT = (
    "no font with Chinese characters is installed on the server (on Debian or Ubuntu: apt-get install "
    "fonts-noto-cjk), so they show as empty boxes in this PDF"
)


def _pdf_lacks(markdown: str) -> str | None:
    return NO_CJK_FONT if has_cjk(markdown) and not cjk_font_installed() else None


@dataclass(frozen=True)
class ExportFormat:
    """One file a saved report is offered as: its suffix (also its key in `path` frames), the media
    type it is served with, how it is made from the report's Markdown (None: it is the saved JSON
    record itself, or it is made from that record by `from_record`), and whether a browser should
    save it rather than show it."""

    suffix: str
    media_type: str
    render: Renderer | None
    attachment: bool = False
    from_record: RecordRenderer | None = None  # made from the saved record (the references' metadata)
    lacks: Lacks | None = None  # what a host may lack to render it well: a file made so is not kept
    # made in a process of its own, bounded in time and memory (report/render.py): its renderer's
    # time and memory grow with what the Markdown holds
    apart: bool = False


def _markdown(markdown: str, title: str, page: str) -> bytes:
    return markdown.encode()


def _html(markdown: str, title: str, page: str) -> bytes:
    return to_html(markdown, title, page).encode()


# imported when first asked for: the PDF and DOCX processes (report/render.py) import this module
# under a memory limit, which bibtexparser and rispy would take a share of
def _bibtex(record: dict[str, Any]) -> bytes:
    from fedresearch.report.bibfiles import bibtex, record_citations

    return bibtex(record_citations(record)).encode()


def _ris(record: dict[str, Any]) -> bytes:
    from fedresearch.report.bibfiles import record_citations, ris

    return ris(record_citations(record)).encode()


# in the order pages and clients list them; adding a format is one line here and its renderer
EXPORT_FORMATS: dict[str, ExportFormat] = {
    export.suffix: export
    for export in (
        ExportFormat("md", "text/markdown; charset=utf-8", _markdown),
        ExportFormat("html", "text/html; charset=utf-8", _html),
        ExportFormat("pdf", "application/pdf", to_pdf, attachment=True, lacks=_pdf_lacks, apart=True),
        ExportFormat(
            "docx",
            "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
            to_docx,
            attachment=True,
            apart=True,
        ),
        ExportFormat("json", "application/json; charset=utf-8", None),
        # the references alone, for a reference manager (Zotero, Mendeley, EndNote, JabRef)
        ExportFormat("bib", "application/x-bibtex; charset=utf-8", None, attachment=True, from_record=_bibtex),
        ExportFormat(
            "ris", "application/x-research-info-systems; charset=utf-8", None, attachment=True, from_record=_ris
        ),
    )
}
