"""Per-document work units: leases on queued documents (migration 016).

A worker leases the next queued document with FOR UPDATE SKIP LOCKED, so concurrent workers (threads,
processes, machines) never take the same one, renews its leases while it works, and releases each when done.
A lease is void as soon as the database session that keeps it is gone (its process died, the server restarted),
and lapses `lease_seconds` after its last renewal (its process hangs). The write that finishes a document still
re-checks the state it was planned for (documents.claim).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg import sql

from rag_pipeline.status import DOCUMENT_QUEUED, DocumentStatus
from rag_pipeline.store.documents import PENDING_COLUMN_NAMES, PendingDocument, pending_from_rows


@dataclass(frozen=True)
class Lease:
    owner: str  # host:pid:nonce, for people reading the table
    backend_pid: int  # the session that keeps the lease alive
    backend_start: datetime


def open_lease(conn: psycopg.Connection, owner: str) -> Lease:
    """A lease kept alive by `conn`'s session: keep the connection open while the leases are in use."""
    pid, started = conn.execute(
        "SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()").fetchone()
    conn.commit()
    return Lease(owner, pid, started)


# A lease is free when nobody holds it, it lapsed, or the session that kept it is gone.
_FREE = sql.SQL(
    """(lease_owner IS NULL OR lease_expires_at < now()
        OR NOT EXISTS (SELECT 1 FROM pg_stat_activity a
                       WHERE a.pid = lease_backend_pid AND a.backend_start = lease_backend_start))""")


def lease_next(
    conn: psycopg.Connection, statuses: Sequence[DocumentStatus], lease: Lease, lease_seconds: float,
) -> tuple[DocumentStatus, PendingDocument] | None:
    """Lease the first free document in one of `statuses`, in doc_id order, with its status; commits at once so
    other workers see the lease."""
    with conn.transaction():
        row = conn.execute(
            sql.SQL(
                """UPDATE documents d SET lease_owner = %s, lease_backend_pid = %s, lease_backend_start = %s,
                          lease_expires_at = now() + make_interval(secs => %s)
                   FROM (SELECT doc_id FROM documents WHERE status = ANY(%s) AND {free}
                         ORDER BY doc_id LIMIT 1 FOR UPDATE SKIP LOCKED) next
                   WHERE d.doc_id = next.doc_id
                   RETURNING d.status, {columns}"""
            ).format(free=_FREE,
                     columns=sql.SQL(", ").join(sql.Identifier("d", name) for name in PENDING_COLUMN_NAMES)),
            (lease.owner, lease.backend_pid, lease.backend_start, lease_seconds, [str(s) for s in statuses]),
        ).fetchone()
    return (DocumentStatus(row[0]), pending_from_rows([row[1:]])[0]) if row else None


def renew_leases(conn: psycopg.Connection, lease: Lease, lease_seconds: float) -> int:
    with conn.transaction():
        return conn.execute(
            "UPDATE documents SET lease_expires_at = now() + make_interval(secs => %s) WHERE lease_owner = %s",
            (lease_seconds, lease.owner),
        ).rowcount


_RELEASE = sql.SQL("lease_owner = NULL, lease_expires_at = NULL, lease_backend_pid = NULL, lease_backend_start = NULL")


def release_moved_on(conn: psycopg.Connection, doc_id: str, lease: Lease, statuses: Sequence[DocumentStatus]) -> None:
    """Release a document whose work moved it out of `statuses` (to the next stage's queue, or done)."""
    with conn.transaction():
        conn.execute(
            sql.SQL("UPDATE documents SET {} WHERE doc_id = %s AND lease_owner = %s AND NOT status = ANY(%s)").format(
                _RELEASE),
            (doc_id, lease.owner, [str(s) for s in statuses]),
        )


def release_all(conn: psycopg.Connection, lease: Lease) -> int:
    with conn.transaction():
        return conn.execute(sql.SQL("UPDATE documents SET {} WHERE lease_owner = %s").format(_RELEASE),
                            (lease.owner,)).rowcount


def queued(conn: psycopg.Connection, statuses: Sequence[DocumentStatus] = DOCUMENT_QUEUED) -> dict[str, int]:
    """Documents waiting in each of `statuses`, leased or not (the progress reports' "left")."""
    rows = conn.execute(
        "SELECT status, count(*) FROM documents WHERE status = ANY(%s) GROUP BY status", ([str(s) for s in statuses],)
    ).fetchall()
    conn.commit()
    return {str(s): 0 for s in statuses} | dict(rows)
