"""PDF text, read in a child process with bounded memory, time and output.

A PDF's streams may inflate a thousandfold: a 0.3 MB flate bomb (100 MB of text operators) took the
reading process to 1.5 GB RSS, and a PDF fetched from the web was read inside the server. Here
pdfium runs in a child whose heap is capped (RLIMIT_DATA): whatever a file decompresses to, the
child is refused memory past PDF_MEMORY_MB and fails alone, as it does on a crash in the parser.
It dies with the process that reads through it (core/lineage.py): a worker killed mid-upload leaves
no reader running on.

`python -m fedresearch.library.pdf PATH PARENT_PID` (PATH `-`: the PDF on stdin) is that child; it
prints {"pages": [[number, text], ...], "metadata": {...}} or {"error": "..."}.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

from fedresearch.core.lineage import die_with

MAX_PDF_PAGES = 5000  # a page tree claiming millions of pages is an attack, not a book
PDF_MEMORY_MB = 512  # the reader's heap on top of what it holds before opening the file
PDF_TIMEOUT_S = 120.0
PDF_MAX_TEXT_CHARS = 10_000_000  # about 4,000 dense pages


class UnreadablePdf(ValueError):
    """The PDF cannot or must not be read; the message says why (formats.py makes it UnsupportedFile)."""


def read_pdf_text(source: Path | bytes) -> tuple[list[tuple[int, str]], dict[str, str]]:
    """(page number, text) of each page with text, and the document's metadata."""
    path = str(source) if isinstance(source, Path) else "-"
    command = [sys.executable, "-m", "fedresearch.library.pdf", path, str(os.getpid())]
    try:
        done = subprocess.run(
            command, input=source if isinstance(source, bytes) else None, capture_output=True, timeout=PDF_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise UnreadablePdf(f"PDF not read within {PDF_TIMEOUT_S:g} s (a decompression bomb?)") from None
    if done.returncode < 0:  # pdfium aborts when refused memory; a parser crash ends the child too
        raise UnreadablePdf(
            f"PDF needs more than {PDF_MEMORY_MB} MB of memory to read (a decompression bomb?) "
            f"or crashed the PDF reader (signal {-done.returncode})"
        )
    if done.returncode != 0:
        last = (done.stderr.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
        raise UnreadablePdf(f"the PDF reader failed: {last[:200]}")
    answer: dict[str, Any] = json.loads(done.stdout)
    if "error" in answer:
        raise UnreadablePdf(answer["error"])
    return [(number, text) for number, text in answer["pages"]], answer["metadata"]


def _cap_heap(megabytes: int) -> None:
    """No more than `megabytes` of heap beyond what this process holds now."""
    with open("/proc/self/statm") as statm:  # pages: size resident shared text lib data dt
        data_bytes = int(statm.read().split()[5]) * resource.getpagesize()
    limit = data_bytes + megabytes * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def _pages(source: str | bytes) -> dict[str, Any]:
    import pypdfium2 as pdfium

    try:
        pdf = pdfium.PdfDocument(source)
    except pdfium.PdfiumError as error:
        reason = "encrypted (password protected)" if "password" in str(error).lower() else f"unreadable ({error})"
        return {"error": f"PDF {reason}"}
    try:
        if len(pdf) > MAX_PDF_PAGES:
            return {"error": f"PDF of {len(pdf)} pages, over the {MAX_PDF_PAGES} read"}
        pages, total = [], 0
        for number in range(len(pdf)):
            page = pdf[number]
            textpage = page.get_textpage()
            text = textpage.get_text_range().replace("\r\n", "\n").replace("\r", "\n").strip()
            textpage.close()
            page.close()
            total += len(text)
            if total > PDF_MAX_TEXT_CHARS:
                return {"error": f"PDF holds over {PDF_MAX_TEXT_CHARS:,} characters of text (PDF_MAX_TEXT_CHARS)"}
            if text:
                pages.append((number + 1, text))
        return {"pages": pages, "metadata": pdf.get_metadata_dict()}
    finally:
        pdf.close()


def main(argument: str, parent: int) -> None:
    die_with(parent, cpu_s=PDF_TIMEOUT_S)
    source: str | bytes = sys.stdin.buffer.read() if argument == "-" else argument
    _cap_heap(PDF_MEMORY_MB)
    try:
        answer = _pages(source)
    except MemoryError:
        answer = {"error": f"PDF needs more than {PDF_MEMORY_MB} MB of memory to read (a decompression bomb?)"}
    except Exception as error:  # pdfium refusing a page (a page-tree cycle...): this file's fault
        answer = {"error": f"PDF unreadable ({type(error).__name__}: {error})"[:300]}
    sys.stdout.write(json.dumps(answer))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
