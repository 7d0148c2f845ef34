"""A user's documents over HTTP: `POST /api/documents` (multipart upload of one or more files, any
format `fedresearch ingest` reads), `GET /api/documents` (paged), `GET` and `DELETE
/api/documents/{id}`. Every route acts as one user: a key bound to a user acts only as that user;
an admin key (or a server without keys) names the user with `?user_id=`, else FEDRESEARCH_DEFAULT_USER.

Uploads stream to a temporary folder on disk, never whole into memory, each file cut off at
INGEST_MAX_FILE_MB; reading and embedding run in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote

from aiohttp import BodyPartReader, web

from fedresearch.core.auth import Principal
from fedresearch.core.lineage import UPLOAD_FOLDERS, folder_prefix
from fedresearch.library.facade import Library
from fedresearch.library.formats import READERS
from fedresearch.library.ingest import FileOutcome, ingest_uploads
from fedresearch.library.locking import IndexBusy
from fedresearch.library.records import DocumentInfo
from fedresearch.web.auth import json_error, principal_of
from fedresearch.web.keys import RUNTIME, SETTINGS, UPLOADING

MAX_FILES = 100
MAX_PAGE = 200
_CHUNK = 1 << 16
_UNSAFE = re.compile(r"[^\w.\- ]+")


def acting_user(request: web.Request, principal: Principal) -> str:
    """The user a documents request acts as (a bound key's user; an admin names one)."""
    asked = request.query.get("user_id", "").strip() or None
    if principal.user_id is not None and not principal.admin:
        if asked is not None and asked != principal.user_id:
            raise json_error(web.HTTPForbidden, f"this API key acts as user {principal.user_id!r} only")
        return principal.user_id
    user = asked or request.app[SETTINGS].default_user
    if not user:
        raise json_error(web.HTTPBadRequest, "name the user with ?user_id= (or set FEDRESEARCH_DEFAULT_USER)")
    return user


def library_of(request: web.Request) -> Library:
    library = request.app[RUNTIME].library
    if library is None:
        raise json_error(web.HTTPServiceUnavailable, "the embedded library is not open on this server")
    return library


def document_json(info: DocumentInfo) -> dict[str, Any]:
    return {
        "id": str(info.id),
        "kind": info.kind,
        "title": info.title,
        "source": info.source,
        "chunks": info.chunks,
        "added_at": info.added_at,
    }


def _document_id(request: web.Request) -> int:
    raw = request.match_info["id"]
    if not raw.isdigit() or len(raw) > 18:
        raise json_error(web.HTTPNotFound, f"no document {raw!r}")
    return int(raw)


def safe_name(filename: str) -> str:
    """The file's own name, without folders or odd characters (it names the document's source)."""
    name = _UNSAFE.sub("_", Path(unquote(filename).replace("\\", "/")).name).strip(" .")
    return name[:200] or "upload"


async def _save(part: BodyPartReader, target: Path, limit: int, left: int) -> tuple[str | None, int]:
    """Stream one part to `target`, within a file's `limit` and the `left` bytes of its upload; the
    reason it was refused (or None), and the bytes it took."""
    written = 0
    handle: BinaryIO = await asyncio.to_thread(target.open, "wb")
    try:
        while chunk := await part.read_chunk(_CHUNK):
            written += len(chunk)
            if written > limit:
                return f"over INGEST_MAX_FILE_MB ({limit / 1e6:g} MB)", written
            if written > left:
                return "over INGEST_MAX_UPLOAD_MB, what one upload may hold in all: send the rest in another", written
            await asyncio.to_thread(handle.write, chunk)
    finally:
        await asyncio.to_thread(handle.close)
    return None, written


async def _receive(
    request: web.Request, folder: Path, limit: int, total: int
) -> tuple[list[tuple[str, Path]], list[dict[str, Any]]]:
    """Saved files (name, path) and the parts refused before reading, with why; `limit` bounds a
    file, `total` the whole upload (the disk it may take until it is read)."""
    if not request.content_type.startswith("multipart/"):
        raise json_error(web.HTTPBadRequest, "send the files as multipart/form-data (one part per file)")
    saved: list[tuple[str, Path]] = []
    refused: list[dict[str, Any]] = []
    reader = await request.multipart()
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader) or not part.filename:
            continue  # a plain form field or a nested multipart: nothing to ingest
        name = safe_name(part.filename)
        if len(saved) + len(refused) >= MAX_FILES:
            raise json_error(web.HTTPRequestEntityTooLarge, f"at most {MAX_FILES} files in one upload")
        if Path(name).suffix.lower() not in READERS:
            refused.append(_skipped(name, f"unsupported file type; readable: {', '.join(sorted(READERS))}"))
            await part.release()
            continue
        target = folder / f"{len(saved)}-{name}"
        reason, written = await _save(part, target, limit, total)
        if reason is None:
            saved.append((name, target))
            total -= written
        else:
            refused.append(_skipped(name, reason))
            await part.release()
            await asyncio.to_thread(target.unlink, missing_ok=True)  # the part written of it
    return saved, refused


def _skipped(name: str, reason: str) -> dict[str, Any]:
    return {"file": name, "status": "skipped", "reason": reason}


def _outcome_json(outcome: FileOutcome) -> dict[str, Any]:
    if outcome.status == "skipped":
        return _skipped(outcome.file, outcome.reason or "")
    counts = {"added": outcome.added, "replaced": outcome.replaced, "unchanged": outcome.unchanged}
    return {"file": outcome.file, "status": outcome.status, "documents": outcome.documents, **counts}


async def take_uploads(request: web.Request, key_id: str, user: str, kind: str) -> list[dict[str, Any]]:
    """The files of a multipart request into `user`'s library, each with what became of it: one of
    the key's MAX_UPLOADS_PER_KEY at a time. The parts stream to a folder on disk and are read on
    the library's ingest threads (never those its searches use); the folder goes after."""
    with _upload_slot(request, key_id):
        return await _take_uploads(request, user, kind)


@contextlib.contextmanager
def _upload_slot(request: web.Request, key_id: str) -> Iterator[None]:
    limit, uploading = request.app[SETTINGS].max_uploads_per_key, request.app[UPLOADING]
    if uploading[key_id] >= limit:
        message = f"{uploading[key_id]} uploads are already running for this API key (MAX_UPLOADS_PER_KEY={limit})"
        raise json_error(web.HTTPTooManyRequests, f"{message}; send this one when one ends", **{"Retry-After": "5"})
    uploading[key_id] += 1
    try:
        yield
    finally:
        uploading[key_id] -= 1
        if uploading[key_id] <= 0:
            del uploading[key_id]


async def _take_uploads(request: web.Request, user: str, kind: str) -> list[dict[str, Any]]:
    library = library_of(request)
    settings = request.app[SETTINGS]
    limit, total = int(settings.ingest_max_file_mb * 1_000_000), int(settings.ingest_max_upload_mb * 1_000_000)
    folder = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix=folder_prefix(UPLOAD_FOLDERS)))
    try:
        saved, refused = await _receive(request, folder, limit, total)
        if not saved and not refused:
            raise json_error(web.HTTPBadRequest, "no file in the upload: send each file as a part with a filename")
        try:
            outcomes = await library.ingest_threads.run(ingest_uploads, library, user, saved, kind)
        except IndexBusy as busy:
            raise json_error(web.HTTPServiceUnavailable, str(busy), **{"Retry-After": "30"}) from None
    finally:
        # deleting a gigabyte of uploaded files takes a quarter second on ext4: never on the event loop
        await asyncio.shield(asyncio.to_thread(shutil.rmtree, folder, ignore_errors=True))
    return [_outcome_json(outcome) for outcome in outcomes] + refused


async def upload(request: web.Request) -> web.Response:
    principal = principal_of(request)
    user = acting_user(request, principal)
    kind = request.query.get("kind", "highlight")
    if kind not in ("highlight", "file", "biblio"):
        raise json_error(web.HTTPBadRequest, "kind must be highlight, file or biblio")
    files = await take_uploads(request, principal.key_id, user, kind)
    totals = {status: sum(1 for f in files if f["status"] == status) for status in ("added", "replaced", "unchanged")}
    answer = {"user_id": user, "files": files, **totals, "skipped": len(files) - sum(totals.values())}
    return web.json_response(answer, status=201 if totals["added"] or totals["replaced"] else 200)


async def list_documents(request: web.Request) -> web.Response:
    user = acting_user(request, principal_of(request))
    try:
        offset = max(0, int(request.query.get("offset", "0")))
        limit = min(MAX_PAGE, max(1, int(request.query.get("limit", "50"))))
    except ValueError:
        raise json_error(web.HTTPBadRequest, "offset and limit are whole numbers") from None
    library = library_of(request)
    documents = await library.threads.run(library.list_documents, user)
    page = [document_json(info) for info in documents[offset : offset + limit]]
    following = offset + limit if offset + limit < len(documents) else None
    return web.json_response({"documents": page, "total": len(documents), "offset": offset, "next_offset": following})


async def get_document(request: web.Request) -> web.Response:
    user = acting_user(request, principal_of(request))
    document_id = _document_id(request)
    library = library_of(request)
    documents = await library.threads.run(library.list_documents, user)
    for info in documents:
        if info.id == document_id:
            return web.json_response(document_json(info))
    raise json_error(web.HTTPNotFound, f"no document {document_id} for this user")


async def document_passages(request: web.Request) -> web.Response:
    """A document of the user's library as its passages, in order: what a report's reference to a
    note or a PDF page opens on the page (`#library/<id>/<passage>`)."""
    user = acting_user(request, principal_of(request))
    document_id = _document_id(request)
    library = library_of(request)
    documents = await library.threads.run(library.list_documents, user)
    info = next((d for d in documents if d.id == document_id), None)
    if info is None:
        raise json_error(web.HTTPNotFound, f"no document {document_id} for this user")
    rows = await library.threads.run(library.document_passages, user, document_id)
    passages = [
        {"id": str(row["id"]), "heading": row["heading"], "page": row["page"], "text": row["text"]} for row in rows
    ]
    return web.json_response({"document": document_json(info), "passages": passages})


async def delete_document(request: web.Request) -> web.Response:
    user = acting_user(request, principal_of(request))
    document_id = _document_id(request)
    library = library_of(request)
    if not await library.threads.run(library.delete_document, user, document_id):
        raise json_error(web.HTTPNotFound, f"no document {document_id} for this user")
    return web.json_response({"id": str(document_id), "deleted": True})


def register(app: web.Application) -> None:
    app.router.add_post("/api/documents", upload)
    app.router.add_get("/api/documents", list_documents)
    app.router.add_get("/api/documents/{id}", get_document)
    app.router.add_get("/api/documents/{id}/passages", document_passages)
    app.router.add_delete("/api/documents/{id}", delete_document)
