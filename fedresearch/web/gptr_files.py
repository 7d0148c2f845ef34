"""GPT-Researcher's document routes, as its NextJS app's "My Documents" calls them: `POST /upload/`
(multipart, a part named `file` per file), `GET /files/` (`{"files": [name, ...]}`) and
`DELETE /files/{filename}` (`{"message": ...}`, 404 when there is no such file).

Its backend keeps the files in a folder; here they go into the caller's library, as
`/api/documents` puts them there: the same user (a key's, or `?user_id=` for an admin, else
FEDRESEARCH_DEFAULT_USER), the same limits and the same per-file results. A file is named by the
name it was uploaded or ingested under; deleting a name deletes every document read from it.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from aiohttp import web

from fedresearch.library.records import DocumentInfo
from fedresearch.web.auth import principal_of
from fedresearch.web.documents import acting_user, library_of, take_uploads

# what the NextJS app's uploads are: documents to research from, read as files (PDF passages, text)
_KIND = "file"


def file_name(document: DocumentInfo) -> str:
    """The name of the file a document was read from: an upload's own name, a path's last part
    (a record of a BibTeX, RIS or JSON Lines file names that file)."""
    source = document.source.removeprefix("upload:").partition("#")[0]
    return PurePosixPath(source.replace("\\", "/")).name or source


async def upload(request: web.Request) -> web.Response:
    """Files into the caller's library. GPT-Researcher answers `{"filename", "path"}` for the file
    it kept; each file's result is added, as `/api/documents` gives it."""
    principal = principal_of(request)
    user = acting_user(request, principal)
    files = await take_uploads(request, principal.key_id, user, _KIND)
    first = files[0]["file"]
    return web.json_response({"filename": first, "path": f"upload:{first}", "user_id": user, "files": files})


async def list_files(request: web.Request) -> web.Response:
    """The names of the files in the caller's library, each once."""
    user = acting_user(request, principal_of(request))
    library = library_of(request)
    documents = await library.threads.run(library.list_documents, user)
    names = dict.fromkeys(file_name(document) for document in documents)  # each once, in the library's order
    return web.json_response({"files": list(names)})


async def delete_file(request: web.Request) -> web.Response:
    """Every document of the caller's read from the file of that name."""
    user = acting_user(request, principal_of(request))
    name = request.match_info["filename"]
    library = library_of(request)

    def delete() -> int:
        doomed = [document.id for document in library.list_documents(user) if file_name(document) == name]
        return sum(library.delete_document(user, document_id) for document_id in doomed)

    if not await library.threads.run(delete):
        return web.json_response({"message": "File not found"}, status=404)
    return web.json_response({"message": "File deleted successfully"})


def register(app: web.Application) -> None:
    app.router.add_post("/upload/", upload)
    app.router.add_get("/files/", list_files)
    app.router.add_delete("/files/{filename}", delete_file)
