"""A fedresearch library as an AgentScope 2.x knowledge base.

`FedresearchKnowledgeBase` is an `agentscope.rag.KnowledgeBase`: `RAGMiddleware` (static and agentic
mode), `search`, `insert_document`, `list_documents` and `delete_document` work on it as on any other.
The difference is where the work happens: fedresearch embeds, chunks and searches (hybrid full text
plus embeddings) on its side, so this handle carries no embedding model and no vector store, only the
server's URL, an API key and the user it acts for.

Tenants: AgentScope scopes a shared knowledge base with `metadata_filter={"tenant_id": ...}`; here the
tenant *is* the fedresearch user, so every call acts as that user and the server enforces it (a key
bound to a user can act as no other). Pass `user_id=` directly, or a `metadata_filter` holding
`tenant_key` (default "tenant_id").
"""

from __future__ import annotations

import asyncio
import re
import uuid
from typing import Any

import httpx
from agentscope.message import DataBlock, TextBlock
from agentscope.rag import Chunk, DocumentSummary, KnowledgeBase, VectorSearchResult

SEARCH_PATH = "/internal/biblios/vector_search/"
DOCUMENTS_PATH = "/api/documents"
_UNSAFE = re.compile(r"[^\w.\- ]+")


class FedresearchError(RuntimeError):
    """The fedresearch server refused a call; the message is the server's own."""


class FedresearchKnowledgeBase(KnowledgeBase):
    """One fedresearch user's library (one kind: `file`, `highlight` or `biblio`) as a knowledge base."""

    def __init__(
        self,
        name: str,
        description: str,
        base_url: str,
        api_key: str | None = None,
        *,
        user_id: str | None = None,
        metadata_filter: dict[str, Any] | None = None,
        tenant_key: str = "tenant_id",
        kind: str = "file",
        timeout_s: float = 30.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        # The parent binds an embedding model and a vector store; fedresearch holds both server-side,
        # so its constructor (which only stores them) is not called.
        tenant = (metadata_filter or {}).get(tenant_key)
        if user_id is None and tenant is None:
            raise ValueError(f"name the user: user_id=... or metadata_filter={{{tenant_key!r}: ...}}")
        if user_id is not None and tenant is not None and str(tenant) != user_id:
            raise ValueError(f"user_id {user_id!r} and metadata_filter {tenant_key}={tenant!r} disagree")
        if kind not in ("file", "highlight", "biblio"):
            raise ValueError("kind must be file, highlight or biblio")
        self.name = name
        self.description = description
        self.user_id = str(user_id if user_id is not None else tenant)
        self.kind = kind
        self._metadata_filter = metadata_filter
        self._collection = f"fedresearch:{self.user_id}:{kind}"
        self._collection_ready = True
        self._base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = client or httpx.AsyncClient(timeout=timeout_s)
        self._owns_client = client is None
        self._chunk_counts: dict[str, int] = {}

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> FedresearchKnowledgeBase:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def embedding_model(self) -> Any:
        raise AttributeError("fedresearch embeds on the server: this knowledge base has no embedding model")

    @property
    def vector_store(self) -> Any:
        raise AttributeError("fedresearch stores vectors on the server: this knowledge base has no vector store")

    async def ensure_collection(self) -> None:
        """A user's library exists as soon as the user does: nothing to create."""

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        params = {**kwargs.pop("params", {}), "user_id": self.user_id}
        try:
            response = await self._client.request(
                method, self._base_url + path, headers=self._headers, params=params, **kwargs
            )
        except httpx.HTTPError as error:
            raise FedresearchError(f"fedresearch at {self._base_url} did not answer: {error!r}") from error
        if response.status_code == 404 and method == "GET" and path.startswith(DOCUMENTS_PATH + "/"):
            return None
        if response.status_code >= 400:
            try:
                message = response.json().get("error") or response.text
            except ValueError:
                message = response.text
            raise FedresearchError(f"fedresearch answered {response.status_code}: {message}")
        return response.json()

    # -- search ----------------------------------------------------------------------------------

    async def search(
        self,
        queries: list[str | TextBlock | DataBlock],
        top_k: int = 5,
        score_threshold: float | None = None,
    ) -> list[VectorSearchResult]:
        """Each text query searched at once; hits merged by (document, chunk), best score kept.

        Scores are cosine similarities under the server's encoder (0..1, comparable across queries).
        Image queries are dropped: the server's encoder reads text."""
        texts = [q if isinstance(q, str) else q.text for q in queries if isinstance(q, str | TextBlock)]
        texts = [text.strip() for text in texts if text.strip()]
        if not texts:
            return []
        answers = await asyncio.gather(*(self._search_one(text, top_k) for text in texts))
        best: dict[tuple[str, int], dict[str, Any]] = {}
        for items in answers:
            for item in items:
                key = (item["metadata"]["document_id"], int(item["metadata"].get("position", 0)))
                if score_threshold is not None and item["score"] < score_threshold:
                    continue
                if key not in best or item["score"] > best[key]["score"]:
                    best[key] = item
        ranked = sorted(best.values(), key=lambda item: item["score"], reverse=True)[:top_k]
        await self._learn_chunk_counts({item["metadata"]["document_id"] for item in ranked})
        return [self._result_of(item) for item in ranked]

    async def _search_one(self, query: str, top_k: int) -> list[dict[str, Any]]:
        body = {"type": self.kind, "user_id": self.user_id, "query": query, "top_k": min(top_k, 100)}
        items: list[dict[str, Any]] = await self._call("POST", SEARCH_PATH, json=body)
        return items

    async def _learn_chunk_counts(self, document_ids: set[str]) -> None:
        unknown = sorted(document_ids - self._chunk_counts.keys())
        documents = await asyncio.gather(*(self._call("GET", f"{DOCUMENTS_PATH}/{i}") for i in unknown))
        for document_id, document in zip(unknown, documents, strict=True):
            if document is not None:
                self._chunk_counts[document_id] = int(document["chunks"])

    def _result_of(self, item: dict[str, Any]) -> VectorSearchResult:
        metadata = dict(item["metadata"])
        document_id = str(metadata["document_id"])
        position = int(metadata.get("position", 0))
        if item.get("url"):
            metadata["url"] = item["url"]
        metadata["fedresearch_id"] = item["id"]
        chunk = Chunk(
            content=TextBlock(text=item["content"]),
            source=str(metadata.get("title") or document_id),
            chunk_index=position,
            total_chunks=max(self._chunk_counts.get(document_id, 0), position + 1),
            metadata={**metadata, **(self._metadata_filter or {})},
        )
        return VectorSearchResult(score=float(item["score"]), document_id=document_id, chunk=chunk)

    # -- documents -------------------------------------------------------------------------------

    async def insert_document(
        self,
        chunks: list[Chunk],
        document_id: str | None = None,
        document_metadata: dict[str, Any] | None = None,
    ) -> str:
        """The chunks' text, in order, becomes one document of the user's library; its server id is
        returned. fedresearch chunks and embeds the text again with its own chunker and encoder.

        A `document_id` given here names the upload, so inserting the same id again replaces that
        document (which then gets a new server id), and `delete_document` accepts it as well as the
        returned id. Of the metadata,
        `title`, `authors`, `year`, `doi`, `url` and `tags` are kept."""
        texts = [chunk.content.text for chunk in chunks if isinstance(chunk.content, TextBlock)]
        texts = [text.strip() for text in texts if text.strip()]
        if not texts:
            raise ValueError("no text in these chunks: fedresearch stores text (image chunks are not kept)")
        metadata = {**(document_metadata or {}), **(self._metadata_filter or {})}
        title = str(metadata.get("title") or chunks[0].source or document_id or "Untitled")
        name = _file_name(document_id or uuid.uuid4().hex)
        markdown = _markdown(title, metadata, texts)
        files = {"file": (name, markdown.encode("utf-8"), "text/markdown")}
        answer = await self._call("POST", DOCUMENTS_PATH, params={"kind": self.kind}, files=files)
        (outcome,) = answer["files"]
        if outcome["status"] == "skipped":
            raise FedresearchError(f"fedresearch did not store the document: {outcome['reason']}")
        stored = await self._find(f"upload:{name}")
        if stored is None:
            raise FedresearchError(f"fedresearch stored {name} but does not list it")
        self._chunk_counts.pop(str(stored["id"]), None)
        return str(stored["id"])

    async def _documents(self) -> list[dict[str, Any]]:
        documents: list[dict[str, Any]] = []
        offset: int | None = 0
        while offset is not None:
            page = await self._call("GET", DOCUMENTS_PATH, params={"offset": offset, "limit": 200})
            documents.extend(page["documents"])
            offset = page["next_offset"]
        return [document for document in documents if document["kind"] == self.kind]

    async def _find(self, source: str) -> dict[str, Any] | None:
        return next((d for d in await self._documents() if d["source"] == source), None)

    async def delete_document(self, document_id: str) -> None:
        """Remove one document (by the id `insert_document` returned, or the id given to it)."""
        server_id = document_id
        if not document_id.isdigit():
            found = await self._find(f"upload:{_file_name(document_id)}")
            if found is None:
                raise FedresearchError(f"no document {document_id!r} for user {self.user_id!r}")
            server_id = str(found["id"])
        await self._call("DELETE", f"{DOCUMENTS_PATH}/{server_id}")
        self._chunk_counts.pop(server_id, None)

    async def list_documents(self) -> list[DocumentSummary]:
        return [
            DocumentSummary(
                document_id=str(document["id"]),
                source=document["title"] or document["source"],
                chunk_count=int(document["chunks"]),
                metadata={"source": document["source"], "added_at": document["added_at"], "kind": self.kind},
            )
            for document in await self._documents()
        ]

    async def list_chunks(self, document_id: str, *, offset: int = 0, limit: int = 30) -> list[Chunk]:
        raise NotImplementedError("fedresearch lists documents, not their chunks")


def _file_name(document_id: str) -> str:
    return (_UNSAFE.sub("_", document_id).strip(" .")[:180] or "document") + ".md"


def _markdown(title: str, metadata: dict[str, Any], texts: list[str]) -> str:
    """The document as Markdown with front matter: the fields fedresearch reads from it."""
    fields = {"title": " ".join(title.split())}
    for name in ("authors", "year", "doi", "url", "tags"):
        value = metadata.get(name)
        if isinstance(value, list | tuple):
            value = ", ".join(str(v) for v in value)
        if value not in (None, ""):
            fields[name] = " ".join(str(value).split())
    front = "\n".join(f"{name}: {value}" for name, value in fields.items())
    return f"---\n{front}\n---\n\n# {fields['title']}\n\n" + "\n\n".join(texts) + "\n"
