"""Readers for the files a researcher keeps: each turns one file into library documents."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bibtexparser
import rispy
from bibtexparser import middlewares

from fedresearch.core.identifiers import doi_of
from fedresearch.core.models import LIBRARY_TYPES
from fedresearch.core.text import author_names
from fedresearch.library.pdf import UnreadablePdf, read_pdf_text

KINDS = LIBRARY_TYPES


class UnsupportedFile(ValueError):
    """The file cannot be read as any known format; the message says why."""


@dataclass
class Section:
    text: str
    heading: str = ""
    page: int | None = None


@dataclass
class Document:
    kind: str
    source: str
    title: str
    sections: list[Section]
    authors: list[str] = field(default_factory=list)
    year: int | None = None
    doi: str | None = None
    url: str | None = None
    tags: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def content_hash(self) -> str:
        payload = json.dumps(
            [
                self.kind,
                self.title,
                self.authors,
                self.year,
                self.doi,
                self.url,
                self.tags,
                self.extra,
                [(s.heading, s.page, s.text) for s in self.sections],
            ],
            ensure_ascii=False,
            sort_keys=True,
        )
        return hashlib.sha256(payload.encode()).hexdigest()


def _year(value: object) -> int | None:
    match = re.search(r"\b(1[5-9]\d\d|20\d\d|21\d\d)\b", str(value or ""))
    return int(match.group(1)) if match else None


def _tags(value: object) -> list[str]:
    if isinstance(value, str):
        return [tag.strip() for tag in re.split(r"[,;]", value) if tag.strip()]
    if isinstance(value, list):
        return [str(tag).strip() for tag in value if str(tag).strip()]
    return []


def _doi(value: object) -> str | None:
    return doi_of(str(value)) if value else None


def biblio_record(record: dict[str, Any], source: str) -> Document:
    """A bibliographic record (JSON Lines or BibTeX fields) as one `biblio` document."""
    title = " ".join(str(record.get("title") or "").split())
    abstract = " ".join(str(record.get("abstract") or record.get("summary") or "").split())
    if not title:
        raise UnsupportedFile(f"{source}: a record without a title")
    notes = " ".join(str(record.get("note") or "").split())
    body = "\n\n".join(part for part in (abstract, notes) if part) or title
    return Document(
        kind="biblio",
        source=source,
        title=title,
        sections=[Section(text=body)],
        authors=author_names(record.get("authors") or record.get("author")),
        year=_year(record.get("year") or record.get("date")),
        doi=_doi(record.get("doi")),
        url=str(record["url"]).strip() if record.get("url") else None,
        tags=_tags(record.get("tags") or record.get("keywords")),
        extra={
            key: record[key]
            for key in ("venue", "journal", "booktitle", "publisher")
            if isinstance(record.get(key), str) and record[key].strip()
        },
    )


def read_jsonl(path: Path) -> list[Document]:
    documents = []
    # "\n" alone ends a line: str.splitlines also splits at U+2028 and U+0085, which JSON strings may hold
    for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise UnsupportedFile(f"{path}:{number}: not JSON ({error.msg})") from error
        except RecursionError:
            raise UnsupportedFile(f"{path}:{number}: JSON nested too deeply") from None
        if not isinstance(record, dict):
            raise UnsupportedFile(f"{path}:{number}: a JSON {type(record).__name__}, not an object")
        key = _doi(record.get("doi")) or record.get("id") or f"line{number}"
        documents.append(biblio_record(record, f"{path}#{key}"))
    return documents


def read_bibtex(path: Path) -> list[Document]:
    library = bibtexparser.parse_string(  # type: ignore[attr-defined]
        path.read_text(encoding="utf-8"),
        append_middleware=[middlewares.LatexDecodingMiddleware(), middlewares.SeparateCoAuthors()],
    )
    if library.failed_blocks and not library.entries:
        raise UnsupportedFile(f"{path}: no readable BibTeX entry")
    documents = []
    for entry in library.entries:
        record: dict[str, Any] = {name.lower(): field.value for name, field in entry.fields_dict.items()}
        record["title"] = re.sub(r"[{}]", "", str(record.get("title") or ""))
        documents.append(biblio_record(record, f"{path}#{entry.key}"))
    return documents


_FRONT_MATTER = re.compile(r"\A---\s*\n(.*?)\n---\s*\n", re.DOTALL)
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


def _front_matter(text: str) -> tuple[dict[str, str], str]:
    match = _FRONT_MATTER.match(text)
    if not match:
        return {}, text
    fields = {}
    for line in match.group(1).splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip():
            fields[name.strip().lower()] = value.strip().strip("\"'")
    return fields, text[match.end() :]


def _markdown_sections(text: str) -> tuple[str, list[Section]]:
    title, heading = "", ""
    lines: list[str] = []
    sections: list[Section] = []

    def flush() -> None:
        body = "\n".join(lines).strip()
        if body:
            sections.append(Section(text=body, heading=heading))
        lines.clear()

    for line in text.splitlines():
        match = _HEADING.match(line)
        if match:
            flush()
            heading = match.group(2)
            if len(match.group(1)) == 1 and not title:
                title = heading
            continue
        lines.append(line)
    flush()
    return title, sections


def read_markdown(path: Path, kind: str) -> list[Document]:
    fields, body = _front_matter(path.read_text(encoding="utf-8"))
    first_heading, sections = _markdown_sections(body)
    if not sections:
        raise UnsupportedFile(f"{path}: no text")
    kind = fields.get("type", kind).lower()
    if kind not in KINDS:
        raise UnsupportedFile(f"{path}: type {kind!r} is not one of {', '.join(KINDS)}")
    extra = {}
    if paper := _doi(fields.get("paper")):
        extra["paper_doi"] = paper
    if fields.get("page", "").isdecimal():  # not isdigit: "²" is a digit int() refuses
        for section in sections:
            section.page = int(fields["page"])
    return [
        Document(
            kind=kind,
            source=str(path),
            title=fields.get("title") or first_heading or path.stem.replace("_", " "),
            sections=sections,
            authors=author_names(fields.get("authors")),
            year=_year(fields.get("year")),
            doi=_doi(fields.get("doi")),
            url=fields.get("url") or None,
            tags=_tags(fields.get("tags")),
            extra=extra,
        )
    ]


def read_text(path: Path, kind: str) -> list[Document]:
    text = path.read_text(encoding="utf-8").strip()
    if not text:
        raise UnsupportedFile(f"{path}: no text")
    sections = [Section(text=part.strip()) for part in re.split(r"\n\s*\n", text) if part.strip()]
    return [Document(kind=kind, source=str(path), title=path.stem.replace("_", " "), sections=sections)]


def read_ris(path: Path) -> list[Document]:
    try:
        entries = rispy.loads(path.read_text(encoding="utf-8"))
    except Exception as error:  # rispy raises bare IOError/ValueError subclasses for bad files
        raise UnsupportedFile(f"{path}: not a RIS file ({error})") from error
    if not entries:
        raise UnsupportedFile(f"{path}: no RIS record")
    documents = []
    for number, entry in enumerate(entries, start=1):
        record = {
            "title": entry.get("title") or entry.get("primary_title") or entry.get("secondary_title"),
            "authors": entry.get("authors") or entry.get("first_authors") or [],
            "year": entry.get("year") or entry.get("publication_year") or entry.get("date"),
            "doi": entry.get("doi"),
            "url": (entry.get("urls") or [None])[0] or entry.get("url"),
            "abstract": entry.get("abstract") or entry.get("notes_abstract"),
            "tags": entry.get("keywords") or [],
            "journal": entry.get("journal_name") or entry.get("secondary_title"),
        }
        key = _doi(record["doi"]) or entry.get("id") or f"record{number}"
        documents.append(biblio_record(record, f"{path}#{key}"))
    return documents


def _csl_record(item: dict[str, Any]) -> dict[str, Any]:
    issued = item.get("issued") or {}
    parts = issued.get("date-parts") if isinstance(issued, dict) else None
    # CSL says [[2021, 3]]; files in the wild also hold [2021], [[]] or a bare string
    first = parts[0] if isinstance(parts, list) and parts else None
    year = first[0] if isinstance(first, list) and first else first
    if year is None and isinstance(issued, dict):
        year = issued.get("raw")
    keywords = item.get("keyword")
    return {
        "title": item.get("title"),
        "authors": item.get("author") or [],
        "year": year,
        "doi": item.get("DOI") or item.get("doi"),
        "url": item.get("URL") or item.get("url"),
        "abstract": item.get("abstract"),
        "tags": keywords if isinstance(keywords, list) else re.split(r"[,;]", keywords or ""),
        "venue": item.get("container-title"),
    }


def _highlight_documents(path: Path, payload: Any) -> list[Document]:
    """Highlights and notes, each linked to its paper (DOI or title) and page."""
    paper = payload.get("paper", {}) if isinstance(payload, dict) else {}
    entries = payload.get("highlights", []) if isinstance(payload, dict) else payload
    documents = []
    for number, entry in enumerate(entries, start=1):
        if not isinstance(entry, dict):
            raise UnsupportedFile(f"{path}: highlight {number} is not an object")
        quote = " ".join(str(entry.get("text") or entry.get("highlight") or "").split())
        note = " ".join(str(entry.get("note") or entry.get("comment") or "").split())
        if not quote and not note:
            raise UnsupportedFile(f"{path}: highlight {number} has neither text nor note")
        paper_title = entry.get("paper_title") or paper.get("title") or path.stem
        paper_doi = _doi(entry.get("paper_doi") or entry.get("doi") or paper.get("doi"))
        page = entry.get("page")
        body = quote + (f"\n\nNote: {note}" if quote and note else note)
        documents.append(
            Document(
                kind="highlight",
                source=f"{path}#{entry.get('id') or number}",
                title=f"Highlight in {paper_title}" + (f", p. {page}" if page else ""),
                sections=[Section(text=body, page=int(str(page)) if str(page or "").isdecimal() else None)],
                tags=_tags(entry.get("tags")),
                extra={"paper_doi": paper_doi, "paper_title": paper_title}
                if paper_doi
                else {"paper_title": paper_title},
            )
        )
    return documents


def read_json(path: Path) -> list[Document]:
    """CSL-JSON records, or highlights (`{"paper": {...}, "highlights": [...]}` or a list of them)."""
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise UnsupportedFile(f"{path}: not JSON ({error.msg})") from error
    except RecursionError:
        raise UnsupportedFile(f"{path}: JSON nested too deeply") from None
    items = payload if isinstance(payload, list) else [payload]
    is_highlights = (isinstance(payload, dict) and "highlights" in payload) or all(
        isinstance(i, dict) and ("text" in i or "highlight" in i) and "title" not in i for i in items
    )
    if is_highlights and items:
        return _highlight_documents(path, payload)
    documents = []
    for number, item in enumerate(items, start=1):
        if not isinstance(item, dict):
            raise UnsupportedFile(f"{path}: item {number} is not an object")
        record = _csl_record(item)
        key = _doi(record["doi"]) or item.get("id") or f"item{number}"
        documents.append(biblio_record(record, f"{path}#{key}"))
    if not documents:
        raise UnsupportedFile(f"{path}: no record")
    return documents


def pdf_sections(source: Path | bytes) -> list[Section]:
    """One section per page with text, page numbers kept (pdf.py reads it in a bounded child)."""
    return _pdf(source)[0]


def _pdf(source: Path | bytes) -> tuple[list[Section], dict[str, str]]:
    try:
        pages, metadata = read_pdf_text(source)
    except UnreadablePdf as error:
        raise UnsupportedFile(str(error)) from error
    if not pages:
        raise UnsupportedFile("PDF has no extractable text (scanned or image-only; OCR it first)")
    return [Section(text=text, page=number) for number, text in pages], metadata


def read_pdf(path: Path, kind: str) -> list[Document]:
    try:
        sections, metadata = _pdf(path)
    except UnsupportedFile as error:
        raise UnsupportedFile(f"{path}: {error}") from error
    title = (metadata.get("Title") or "").strip() or path.stem.replace("_", " ")
    return [
        Document(
            kind="file" if kind == "highlight" else kind,
            source=str(path),
            title=title,
            sections=sections,
            authors=author_names(metadata.get("Author") or ""),
            year=_year(metadata.get("CreationDate")),
        )
    ]


READERS: dict[str, Callable[[Path, str], list[Document]]] = {
    ".md": read_markdown,
    ".markdown": read_markdown,
    ".txt": read_text,
    ".bib": lambda path, kind: read_bibtex(path),
    ".ris": lambda path, kind: read_ris(path),
    ".json": lambda path, kind: read_json(path),
    ".pdf": read_pdf,
    ".jsonl": lambda path, kind: read_jsonl(path),
    ".ndjson": lambda path, kind: read_jsonl(path),
}


def read_file(path: Path, kind: str = "highlight") -> list[Document]:
    """Documents in `path`; notes default to `highlight`, PDFs to `file`, records are always `biblio`."""
    reader = READERS.get(path.suffix.lower())
    if reader is None:
        raise UnsupportedFile(f"{path}: unsupported file type {path.suffix or '(none)'}")
    try:
        return reader(path, kind)
    except UnicodeDecodeError as error:
        raise UnsupportedFile(f"{path}: not UTF-8 text") from error
