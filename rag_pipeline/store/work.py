"""Per-document work units: leases on queued documents (work_leases, documents.lease_owner).

A worker leases the next queued document with FOR UPDATE SKIP LOCKED, so concurrent workers (threads,
processes, machines) never take the same one, and releases it when its work moved it on. A holder is alive while
the database session that keeps its leases exists (its process died, or the server restarted: its leases are void
at once) and it renews them (a process that hangs stops renewing: they lapse after `lease_seconds`). The write
that finishes a document still re-checks the state it was planned for (queue.claim).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from rag_pipeline.domain.status import DOCUMENT_QUEUED, DocumentStatus
from rag_pipeline.store.queue import PENDING_COLUMN_NAMES, PendingDocument, pending_from_rows

FORGET_DEAD_HOLDERS_AFTER = "1 day"


@dataclass(frozen=True)
class Lease:
    owner: str  # host:pid:nonce, for people reading the tables


def open_lease(conn: psycopg.Connection, owner: str, lease_seconds: float) -> Lease:
    """Register a holder kept alive by `conn`'s session: keep that connection open while its leases are used."""
    with conn.transaction():
        conn.execute(
            """INSERT INTO work_leases (owner, backend_pid, backend_start, expires_at)
               SELECT %s, pid, backend_start, now() + make_interval(secs => %s)
               FROM pg_stat_activity WHERE pid = pg_backend_pid()""",
            (owner, lease_seconds),
        )
        conn.execute("DELETE FROM work_leases WHERE expires_at < now() - %s::interval", (FORGET_DEAD_HOLDERS_AFTER,))
    return Lease(owner)


# A document is free when nobody holds it or its holder is not alive. Another role's session may show a NULL
# backend_start (without pg_read_all_stats): then the pid alone tells.
_FREE = sql.SQL(
    """(d.lease_owner IS NULL OR NOT EXISTS (
          SELECT 1 FROM work_leases l JOIN pg_stat_activity a ON a.pid = l.backend_pid
          WHERE l.owner = d.lease_owner AND l.expires_at >= now()
            AND (a.backend_start IS NULL OR a.backend_start = l.backend_start)))""")


# The first free document of each status asked for, from the (status, doc_id) index, then the first of those (the
# others' row locks end with the transaction). One query over `status = ANY(...)` ordered by doc_id walked the
# primary key instead, past every document already worked: 104 ms a lease with 46,000 of 100,000 documents parsed,
# so a build slowed as it went (quadratic in the corpus).
LEASE_NEXT = sql.SQL(
    """UPDATE documents SET lease_owner = %s
       FROM (SELECT first.doc_id FROM unnest(%s::text[]) AS asked (status)
             CROSS JOIN LATERAL (
                 SELECT d.doc_id FROM documents d WHERE d.status = asked.status AND {free}
                 ORDER BY d.doc_id LIMIT 1 FOR UPDATE OF d SKIP LOCKED) first
             ORDER BY first.doc_id LIMIT 1) next
       WHERE documents.doc_id = next.doc_id
       RETURNING documents.status, {columns}"""
).format(free=_FREE, columns=sql.SQL(", ").join(sql.Identifier("documents", name) for name in PENDING_COLUMN_NAMES))


def lease_next(
    conn: psycopg.Connection, statuses: Sequence[DocumentStatus], lease: Lease,
) -> tuple[DocumentStatus, PendingDocument] | None:
    """Lease the first free document in one of `statuses`, in doc_id order, with its status; commits at once so
    other workers see the lease."""
    with conn.transaction():
        row = conn.execute(LEASE_NEXT, (lease.owner, [str(s) for s in statuses])).fetchone()
    return (DocumentStatus(row[0]), pending_from_rows([row[1:]])[0]) if row else None


def renew(conn: psycopg.Connection, lease: Lease, lease_seconds: float) -> None:
    with conn.transaction():
        conn.execute("UPDATE work_leases SET expires_at = now() + make_interval(secs => %s) WHERE owner = %s",
                     (lease_seconds, lease.owner))


def release_moved_on(conn: psycopg.Connection, doc_id: str, lease: Lease, statuses: Sequence[DocumentStatus]) -> None:
    """Release a document whose work moved it out of `statuses` (to the next stage's queue, or done)."""
    with conn.transaction():
        conn.execute(
            "UPDATE documents SET lease_owner = NULL WHERE doc_id = %s AND lease_owner = %s AND NOT status = ANY(%s)",
            (doc_id, lease.owner, [str(s) for s in statuses]),
        )


def release_all(conn: psycopg.Connection, lease: Lease) -> int:
    with conn.transaction():
        released = conn.execute("UPDATE documents SET lease_owner = NULL WHERE lease_owner = %s",
                                (lease.owner,)).rowcount
        conn.execute("DELETE FROM work_leases WHERE owner = %s", (lease.owner,))
    return released


def queued(conn: psycopg.Connection, statuses: Sequence[DocumentStatus] = DOCUMENT_QUEUED) -> dict[str, int]:
    """Documents waiting in each of `statuses`, leased or not (the progress reports' "left")."""
    rows = conn.execute(
        "SELECT status, count(*) FROM documents WHERE status = ANY(%s) GROUP BY status", ([str(s) for s in statuses],),
        prepare=False,  # a plan for the statuses asked, through the status index (a generic one may not be)
    ).fetchall()
    conn.commit()
    return {str(s): 0 for s in statuses} | dict(rows)
