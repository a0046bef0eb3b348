"""Per-document work units: leases on queued documents (migration 016).

A worker leases the next queued document with FOR UPDATE SKIP LOCKED, so concurrent workers (threads,
processes, machines) never take the same one, renews its leases while it works, and releases each when done.
A lease a dead worker stopped renewing lapses after `lease_seconds` and the document is leased again. The write
that finishes a document still re-checks the state it was planned for (documents.claim).
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg import sql

from rag_pipeline.status import DOCUMENT_QUEUED, DocumentStatus
from rag_pipeline.store.documents import PENDING_COLUMN_NAMES, PendingDocument, pending_from_rows


def lease_next(
    conn: psycopg.Connection, statuses: Sequence[DocumentStatus], owner: str, lease_seconds: float,
) -> tuple[DocumentStatus, PendingDocument] | None:
    """Lease the first unleased (or lapsed) document in one of `statuses`, in doc_id order, with its status;
    commits at once so other workers see the lease."""
    with conn.transaction():
        row = conn.execute(
            sql.SQL(
                """UPDATE documents d SET lease_owner = %s, lease_expires_at = now() + make_interval(secs => %s)
                   FROM (SELECT doc_id FROM documents
                         WHERE status = ANY(%s) AND (lease_expires_at IS NULL OR lease_expires_at < now())
                         ORDER BY doc_id LIMIT 1 FOR UPDATE SKIP LOCKED) next
                   WHERE d.doc_id = next.doc_id
                   RETURNING d.status, {}"""
            ).format(sql.SQL(", ").join(sql.Identifier("d", name) for name in PENDING_COLUMN_NAMES)),
            (owner, lease_seconds, [str(s) for s in statuses]),
        ).fetchone()
    return (DocumentStatus(row[0]), pending_from_rows([row[1:]])[0]) if row else None


def renew_leases(conn: psycopg.Connection, owner: str, lease_seconds: float) -> int:
    with conn.transaction():
        return conn.execute(
            "UPDATE documents SET lease_expires_at = now() + make_interval(secs => %s) WHERE lease_owner = %s",
            (lease_seconds, owner),
        ).rowcount


def release_moved_on(conn: psycopg.Connection, doc_id: str, owner: str, statuses: Sequence[DocumentStatus]) -> None:
    """Release a document whose work moved it out of `statuses` (to the next stage's queue, or done)."""
    with conn.transaction():
        conn.execute(
            """UPDATE documents SET lease_owner = NULL, lease_expires_at = NULL
               WHERE doc_id = %s AND lease_owner = %s AND NOT status = ANY(%s)""",
            (doc_id, owner, [str(s) for s in statuses]),
        )


def release_all(conn: psycopg.Connection, owner: str) -> int:
    with conn.transaction():
        return conn.execute(
            "UPDATE documents SET lease_owner = NULL, lease_expires_at = NULL WHERE lease_owner = %s", (owner,)
        ).rowcount


def queued(conn: psycopg.Connection, statuses: Sequence[DocumentStatus] = DOCUMENT_QUEUED) -> dict[str, int]:
    """Documents waiting in each of `statuses`, leased or not (the progress reports' "left")."""
    rows = conn.execute(
        "SELECT status, count(*) FROM documents WHERE status = ANY(%s) GROUP BY status", ([str(s) for s in statuses],)
    ).fetchall()
    conn.commit()
    return {str(s): 0 for s in statuses} | dict(rows)


def live_leases(conn: psycopg.Connection, statuses: Sequence[DocumentStatus]) -> int:
    """Documents in `statuses` that a live worker holds (work that may still move on to the next stage)."""
    row = conn.execute(
        "SELECT count(*) FROM documents WHERE status = ANY(%s) AND lease_expires_at >= now()",
        ([str(s) for s in statuses],),
    ).fetchone()
    conn.commit()
    return row[0]
