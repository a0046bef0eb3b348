"""The work queue: documents pending a stage, claimed one at a time, and their status changes as work finishes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from rag_pipeline.domain.status import DOCUMENT_LIVE_IN_INDEX, DocumentStatus

D = DocumentStatus


@dataclass(frozen=True)
class PendingDocument:
    doc_id: str
    source: str
    rel_path: str
    fingerprint: str
    content_hash: str | None
    indexed_content_hash: str | None
    title: str | None
    acl_labels: tuple[str, ...]
    chunker_version: str | None
    # The file the scan judged (see sources.FileIdentity): parsing reads exactly that one.
    file_id: str | None = None
    file_links: int | None = None
    read_path: str | None = None
    ref: int | None = None  # how logs name it (rag_pipeline.domain.refs): never by path


PENDING_COLUMN_NAMES = ("doc_id", "source", "rel_path", "fingerprint", "content_hash", "indexed_content_hash",
                        "title", "acl_labels", "chunker_version", "file_id", "file_links", "read_path", "ref")


_PENDING_COLUMNS = sql.SQL(", ").join(map(sql.Identifier, PENDING_COLUMN_NAMES))


def pending_from_rows(rows: list[tuple[Any, ...]]) -> list[PendingDocument]:
    return [PendingDocument(*r[:7], tuple(r[7]), *r[8:13]) for r in rows]


def count_shard_documents(conn: psycopg.Connection, shard: int, shards: int) -> int:
    return conn.execute(
        "SELECT count(*) FROM documents WHERE status = %s AND abs(hashtext(doc_id)) %% %s = %s",
        (D.INDEXED, shards, shard),
    ).fetchone()[0]


def shard_documents(
    conn: psycopg.Connection, shard: int, shards: int, limit: int, after: str = ""
) -> list[PendingDocument]:
    """Indexed documents of one hash shard (for backfills that N workers share), in doc_id order."""
    rows = conn.execute(
        sql.SQL(
            """SELECT {} FROM documents
               WHERE status = %s AND abs(hashtext(doc_id)) %% %s = %s AND doc_id > %s
               ORDER BY doc_id LIMIT %s"""
        ).format(_PENDING_COLUMNS),
        (D.INDEXED, shards, shard, after, limit),
    ).fetchall()
    return pending_from_rows(rows)


def claim(
    conn: psycopg.Connection, doc_id: str, expected: DocumentStatus, fingerprint: str | None = None,
    file_id: str | None = None,
) -> bool:
    """Lock a document row for this transaction if it is still in the state the work was planned for.

    A concurrent scan may have re-queued or deleted it meanwhile; then the caller drops its work and the
    document is picked up again in its new state, so no stale result is ever written over a newer one.
    """
    row = conn.execute(
        "SELECT status, fingerprint, file_id FROM documents WHERE doc_id = %s FOR UPDATE", (doc_id,)
    ).fetchone()
    return (row is not None and row[0] == expected and (fingerprint is None or row[1] == fingerprint)
            and (file_id is None or row[2] == file_id))


def lock_queued(conn: psycopg.Connection, doc_id: str, fingerprint: str,
                file_id: str | None = None) -> DocumentStatus | None:
    """Lock a document for this transaction and say its status, if its file is still the one the work read."""
    row = conn.execute(
        "SELECT status, fingerprint, file_id FROM documents WHERE doc_id = %s FOR UPDATE", (doc_id,)
    ).fetchone()
    if row is None or row[1] != fingerprint or (file_id is not None and row[2] != file_id):
        return None
    return DocumentStatus(row[0])


def current_labels(conn: psycopg.Connection, doc_id: str) -> tuple[str, ...]:
    row = conn.execute("SELECT acl_labels FROM documents WHERE doc_id = %s", (doc_id,)).fetchone()
    return tuple(row[0]) if row and row[0] else ()


def pending_document(conn: psycopg.Connection, doc_id: str, status: DocumentStatus) -> PendingDocument | None:
    rows = conn.execute(
        sql.SQL("SELECT {} FROM documents WHERE doc_id = %s AND status = %s").format(_PENDING_COLUMNS),
        (doc_id, status),
    ).fetchall()
    conn.commit()
    return pending_from_rows(rows)[0] if rows else None


def requeue_for_chunker(conn: psycopg.Connection, chunker_version: str) -> int:
    """Indexed documents chunked by another chunker version go back to chunking (their text is kept)."""
    return conn.execute(
        """UPDATE documents SET status = %s, changed_at = now()
           WHERE status = ANY(%s) AND chunker_version IS DISTINCT FROM %s""",
        (D.PENDING_CHUNK, list(DOCUMENT_LIVE_IN_INDEX), chunker_version),
    ).rowcount


# PDFs and slide decks (PPTX: their speaker notes, rp14) parsed by an older parser
_OLDER_PARSER = sql.SQL("""status = ANY(%s) AND (lower(rel_path) LIKE '%%.pdf' OR lower(rel_path) LIKE '%%.pptx')
    AND coalesce(substring(parser_version from '^rp([0-9]+);')::integer, 0) < %s""")


def count_for_parser(conn: psycopg.Connection, below: int) -> int:
    """How many documents requeue_for_parser would send back."""
    return conn.execute(sql.SQL("SELECT count(*) FROM documents WHERE {}").format(_OLDER_PARSER),
                        (list(DOCUMENT_LIVE_IN_INDEX), below)).fetchone()[0]


def requeue_for_parser(conn: psycopg.Connection, below: int) -> int:
    """PDFs and slide decks in the index parsed by a parser older than rp`below` go back to parsing (once: the parse
    records the new version). Their text is kept until the new parse replaces it; unchanged text is not embedded again."""
    return conn.execute(
        sql.SQL("UPDATE documents SET status = %s, changed_at = now() WHERE {}").format(_OLDER_PARSER),
        (D.PENDING_PARSE, list(DOCUMENT_LIVE_IN_INDEX), below),
    ).rowcount


def finish_parse(
    conn: psycopg.Connection,
    doc_id: str,
    content_hash: str,
    page_count: int,
    parser_version: str,
    next_status: DocumentStatus,
    cleaning: dict[str, int],
) -> None:
    conn.execute(
        """UPDATE documents SET content_hash = %s, page_count = %s, parser_version = %s, status = %s,
                  cleaning = %s, parsed_at = now()
           WHERE doc_id = %s""",
        (content_hash, page_count, parser_version, next_status, Jsonb(cleaning), doc_id),
    )


def document_identity(conn: psycopg.Connection, doc_id: str, derived: dict[str, Any]) -> dict[str, Any]:
    """What the document is: `derived` (read from it) with its sidecar's word over it (rag.document_identity)."""
    row = conn.execute("SELECT rag.document_identity(title, metadata, %s) FROM documents WHERE doc_id = %s",
                       (Jsonb(derived), doc_id)).fetchone()
    return row[0] if row else {}


def set_identity(conn: psycopg.Connection, doc_id: str, derived: dict[str, Any]) -> None:
    """Store what the document says it is (documents.identity; its name terms follow, by trigger)."""
    conn.execute("UPDATE documents SET identity = %s WHERE doc_id = %s AND identity IS DISTINCT FROM %s",
                 (Jsonb(derived), doc_id, Jsonb(derived)))


def mark_dead_letter(conn: psycopg.Connection, doc_id: str) -> None:
    conn.execute("UPDATE documents SET status = %s, parsed_at = now() WHERE doc_id = %s", (D.DEAD_LETTER, doc_id))


def mark_chunked(conn: psycopg.Connection, doc_id: str, chunker_version: str) -> None:
    conn.execute(
        "UPDATE documents SET status = %s, chunker_version = %s WHERE doc_id = %s",
        (D.PENDING_INDEX, chunker_version, doc_id),
    )


def parser_version_of(conn: psycopg.Connection, doc_id: str) -> str | None:
    row = conn.execute("SELECT parser_version FROM documents WHERE doc_id = %s", (doc_id,)).fetchone()
    return row[0] if row else None


def mark_indexed(conn: psycopg.Connection, doc_id: str) -> None:
    conn.execute(
        """UPDATE documents SET status = %s, indexed_at = now(), indexed_content_hash = content_hash
           WHERE doc_id = %s""",
        (D.INDEXED, doc_id),
    )


# --- reporting -------------------------------------------------------------------------------------
