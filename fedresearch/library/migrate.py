"""`fedresearch library migrate --to postgresql://…`: the embedded library, every user, into PostgreSQL.

Documents are copied with their passages and vectors as stored (nothing is embedded again), all in
one transaction (PostgresStore.bulk: binary COPY; into an empty library the vector index is built
once at the end): interrupted, killed or failed, it leaves nothing of itself. A document already
there with the same content is skipped, one with other content replaced, so a re-run (after more
ingests) copies only what is missing.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from sqlite3 import Row

import psycopg

from fedresearch.core.settings import Settings
from fedresearch.library.postgres import DIMS, PostgresStore, StoredDocument, StoredPassage
from fedresearch.library.records import Records
from fedresearch.library.store import LibraryDatabaseError

BATCH = 2_000  # passages a write holds (whole documents; at most BATCH_DOCUMENTS of them)
BATCH_DOCUMENTS = 500


@dataclass
class MigrationSummary:
    users: int = 0
    copied: int = 0
    replaced: int = 0
    unchanged: int = 0
    passages: int = 0
    vectors: int = 0

    def __str__(self) -> str:
        return (
            f"{self.users} users: {self.copied} documents copied ({self.replaced} of them replacing other content), "
            f"{self.unchanged} already there; {self.passages} passages copied, {self.vectors} with vectors"
        )


def migrate(
    records: Records,
    target: PostgresStore,
    on_document: Callable[[int], None] | None = None,
    on_index: Callable[[int, int], None] | None = None,
) -> MigrationSummary:
    """Copy every user's documents from the embedded store of record into PostgreSQL, in one
    transaction; `on_index` is told the passages of the users past `target.hnsw_from` before their
    HNSW indexes are built."""
    summary = MigrationSummary()
    held: dict[str, int] = {}
    with target.bulk() as load:
        for user_id in records.user_ids():
            summary.users += 1
            documents = records.document_rows(user_id)
            known = target.hashes(user_id, [row["source"] for row in documents])
            missing = [row for row in documents if known.get(row["source"]) != row["content_hash"]]
            summary.unchanged += len(documents) - len(missing)
            if on_document is not None:
                on_document(len(documents) - len(missing))
            counted = records.db().execute("SELECT COUNT(*) FROM chunks WHERE user_id = ?", (user_id,)).fetchone()
            held[user_id] = int(counted[0])
            for batch in _batches(records, user_id, missing):
                added, replaced = load.write(user_id, batch)
                summary.copied += added + replaced
                summary.replaced += replaced
                summary.passages += sum(len(document.passages) for document in batch)
                summary.vectors += sum(p.vector is not None for document in batch for p in document.passages)
                if on_document is not None:
                    on_document(len(batch))
        large = [n for n in held.values() if n > target.hnsw_from]
        if large and on_index is not None:
            on_index(len(large), sum(large))
    return summary


def _batches(records: Records, user_id: str, rows: list[Row]) -> Iterator[list[StoredDocument]]:
    """The documents of `rows`, read from SQLite, in writes of about BATCH passages."""
    batch: list[StoredDocument] = []
    passages = 0
    for row in rows:
        batch.append(_stored(records, user_id, row))
        passages += len(batch[-1].passages)
        if passages >= BATCH or len(batch) >= BATCH_DOCUMENTS:
            yield batch
            batch, passages = [], 0
    if batch:
        yield batch


def _stored(records: Records, user_id: str, row: Row) -> StoredDocument:
    passages = []
    for chunk in records.stored_chunks(user_id, row["id"]):
        vector = chunk["vector"]
        if vector is not None and len(vector) != DIMS * 4:
            raise ValueError(
                f"document {row['id']} of {user_id!r} has {len(vector) // 4}-dimensional vectors; "
                f"the PostgreSQL library holds {DIMS}"
            )
        passages.append(StoredPassage(chunk["heading"], chunk["page"], chunk["position"], chunk["text"], vector))
    return StoredDocument(
        kind=row["kind"],
        source=row["source"],
        content_hash=row["content_hash"],
        title=row["title"],
        authors=json.loads(row["authors"]),
        year=row["year"],
        doi=row["doi"],
        url=row["url"],
        tags=json.loads(row["tags"]),
        extra=json.loads(row["extra"]),
        passages=passages,
        added_at=row["added_at"],
    )


def migrate_command(settings: Settings, url: str) -> int:
    """The CLI's `library migrate`: a progress bar, then a summary with counts (exit 1 on failure)."""
    from tqdm import tqdm

    database = settings.library_dir / "library.sqlite3"
    if not url.startswith(("postgresql://", "postgres://")):
        print("--to must be a postgresql:// URL", file=sys.stderr)
        return 2
    if not database.is_file():
        print(f"no embedded library at {database} (FEDRESEARCH_DATA_DIR): nothing to migrate", file=sys.stderr)
        return 1
    records = Records(database)
    total = int(records.db().execute("SELECT COUNT(*) FROM documents").fetchone()[0])
    try:
        target = PostgresStore(url, dims=None, transaction_pooling=settings.library_transaction_pooling)
    except (LibraryDatabaseError, psycopg.Error) as error:
        print(f"cannot open the PostgreSQL library: {error}", file=sys.stderr)
        return 1
    try:
        with tqdm(total=total, unit="doc", desc="migrating", file=sys.stderr) as bar:

            def indexing(users: int, passages: int) -> None:
                bar.close()
                print(
                    f"building the vector indexes of {users} users ({passages} passages)", file=sys.stderr, flush=True
                )

            summary = migrate(records, target, bar.update, indexing)
    except (ValueError, psycopg.Error) as error:
        print(f"migration stopped, nothing of it copied (one transaction; re-run): {error}", file=sys.stderr)
        return 1
    finally:
        target.close()
    print(f"migrated {summary}")
    return 0
