"""The sources registry: sources as configured (or given on the command line), their scans' locks and records.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from rag_pipeline.config import SourceConfig
from rag_pipeline.domain.status import DocumentStatus
from rag_pipeline.store.scans import ReconcileCounts, delete_derived_rows

D = DocumentStatus


def lock_source_scan(conn: psycopg.Connection, source: str) -> None:
    """Serialise scans of one source until the transaction ends (other sources' scans run beside it)."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"rag_pipeline.scan:{source}",))


def try_lock_source_scan(conn: psycopg.Connection, source: str) -> bool:
    """lock_source_scan without waiting: False while another scan of the source runs."""
    return conn.execute("SELECT pg_try_advisory_xact_lock(hashtext(%s))",
                        (f"rag_pipeline.scan:{source}",)).fetchone()[0]


def labelling(source: SourceConfig) -> str:
    """What decides the source's labels besides its sidecars, as stored in `sources.labelling`."""
    return json.dumps({"defaults": list(source.acl_labels), "root": str(source.root),
                       "from": source.labels_from, "key": source.labels_metadata_key}, sort_keys=True)


def same_labelling(conn: psycopg.Connection, source: SourceConfig) -> bool:
    """Whether the source's labelling is what the last scan stored (False for a new source, or when defaults,
    labels_from or the metadata key changed: every object's labels are read again)."""
    before = conn.execute("SELECT labelling FROM sources WHERE name = %s", (source.name,)).fetchone()
    return before is not None and before[0] == labelling(source)


def upsert_source(conn: psycopg.Connection, source: SourceConfig, origin: str = "config") -> bool:
    """Register the source as scanned now; returns same_labelling as it was before."""
    same = same_labelling(conn, source)
    conn.execute(
        """INSERT INTO sources (name, root, include_patterns, default_acl_labels, freshness_sla_seconds, origin,
                                labelling)
           VALUES (%s, %s, %s, %s, %s, %s, %s)
           ON CONFLICT (name) DO UPDATE SET root = EXCLUDED.root,
               include_patterns = EXCLUDED.include_patterns,
               default_acl_labels = EXCLUDED.default_acl_labels,
               freshness_sla_seconds = EXCLUDED.freshness_sla_seconds,
               origin = EXCLUDED.origin, labelling = EXCLUDED.labelling""",
        (source.name, str(source.root), list(source.include), list(source.acl_labels), source.freshness_sla_seconds,
         origin, labelling(source)),
    )
    return same


def configured_sources_removed(conn: psycopg.Connection, configured: Sequence[str]) -> list[str]:
    """Sources registered from the configuration file that are no longer in it."""
    return [r[0] for r in conn.execute(
        "SELECT name FROM sources WHERE origin = 'config' AND NOT name = ANY(%s) ORDER BY name", (list(configured),)
    ).fetchall()]


def hold_source(conn: psycopg.Connection, source: str) -> int:
    """Hold every document of a source that left the configuration: nothing of it is served any more, and it
    comes back (from the embedding cache) if the source does. Returns how many were newly held."""
    held = [r[0] for r in conn.execute(
        """UPDATE documents SET status = %s, held_reason = 'its source was removed from the configuration'
           WHERE source = %s AND status <> %s RETURNING doc_id""",
        (D.HELD_SOURCE_REMOVED, source, D.HELD_SOURCE_REMOVED),
    ).fetchall()]
    if held:
        delete_derived_rows(conn, held, keep_pages=True)
    return len(held)


def registered_sources(conn: psycopg.Connection, origin: str | None = None) -> list[SourceConfig]:
    """Sources the database knows, of one origin ('config', 'command_line') or all."""
    rows = conn.execute(
        """SELECT name, root, include_patterns, default_acl_labels, freshness_sla_seconds FROM sources
           WHERE %(origin)s::text IS NULL OR origin = %(origin)s ORDER BY name""", {"origin": origin}
    ).fetchall()
    return [
        SourceConfig(name=name, root=root if "://" in root else Path(root), include=tuple(inc), acl_labels=tuple(acl), freshness_sla=sla)
        for name, root, inc, acl, sla in rows
    ]


def record_scan(conn: psycopg.Connection, source: str, started_at: datetime, counts: ReconcileCounts) -> None:
    # Completed now by the clock that stamped `started_at` (not the transaction's now(), which is its start): the
    # pair bounds when the scan listed what it stored (see last_scan_window).
    completed_at = datetime.now(UTC)
    conn.execute(
        """INSERT INTO source_scans (source, started_at, finished_at, files_seen, new_docs, changed, deleted,
                                     deletions_held, held_reason)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)""",
        (source, started_at, completed_at, counts.seen, counts.new, counts.changed, counts.deleted,
         counts.deletions_held, counts.deletions_held_reason),
    )
    conn.execute(
        """UPDATE sources SET last_scan_started_at = %s, last_scan_completed_at = %s, last_scan_failed_at = NULL,
                              last_scan_failure = NULL WHERE name = %s""",
        (started_at, completed_at, source),
    )


def last_scan_window(conn: psycopg.Connection, source: str) -> tuple[datetime, datetime] | None:
    """When the latest completed scan of the source started and completed: it listed what it stored in between."""
    row = conn.execute("SELECT last_scan_started_at, last_scan_completed_at FROM sources WHERE name = %s",
                       (source,)).fetchone()
    return (row[0], row[1]) if row and row[0] and row[1] else None


def record_scan_failure(conn: psycopg.Connection, source: SourceConfig, reason: str, origin: str = "config") -> None:
    """Keep why a scan of the source failed (its own transaction was rolled back), until a scan completes. A
    configured source never registered is registered here, never scanned (and its labelling unknown: its first scan
    reads every label), so that the staleness check fails it at once with ERROR rather than warning of a source
    never scanned; it is forgotten if it leaves the configuration unscanned (forget_never_scanned). Not one given on
    a command line: every later run would scan it again, and a mistyped one fail them all (its command exits 1)."""
    if origin != "config":
        conn.execute("UPDATE sources SET last_scan_failed_at = now(), last_scan_failure = %s WHERE name = %s",
                      (reason, source.name))
        return
    conn.execute(
        """INSERT INTO sources (name, root, include_patterns, default_acl_labels, freshness_sla_seconds, origin,
                                last_scan_failed_at, last_scan_failure)
           VALUES (%s, %s, %s, %s, %s, %s, now(), %s)
           ON CONFLICT (name) DO UPDATE SET last_scan_failed_at = EXCLUDED.last_scan_failed_at,
               last_scan_failure = EXCLUDED.last_scan_failure""",
        (source.name, str(source.root), list(source.include), list(source.acl_labels), source.freshness_sla_seconds,
         origin, reason),
    )


def forget_never_scanned(conn: psycopg.Connection, source: str) -> bool:
    """Remove a source that left the configuration without a scan ever completing and with no document (registered
    by its failed scans only: a misspelt name, a root never mounted), and its failure with it, which staleness
    would report for ever. Returns whether it was removed."""
    return conn.execute(
        """DELETE FROM sources s WHERE name = %s AND last_scan_completed_at IS NULL
               AND NOT EXISTS (SELECT 1 FROM documents d WHERE d.source = s.name) RETURNING name""",
        (source,),
    ).fetchone() is not None


def documents_to_hold(conn: psycopg.Connection, source: str) -> int:
    """How many documents of a source that left the configuration are still served (not held yet)."""
    return conn.execute("SELECT count(*) FROM documents WHERE source = %s AND status <> %s",
                        (source, D.HELD_SOURCE_REMOVED)).fetchone()[0]


def chunks_of_source(conn: psycopg.Connection, source: str) -> int:
    return conn.execute("SELECT count(*) FROM chunks c JOIN documents d USING (doc_id) WHERE d.source = %s",
                        (source,)).fetchone()[0]


def record_hold_refused(conn: psycopg.Connection, source: str, documents: int, reason: str) -> None:
    """A source that left the configuration whose documents were not held (unconfirmed): recorded as a scan that
    held deletions back, which the staleness check reports until it is confirmed or the source comes back."""
    conn.execute(
        """INSERT INTO source_scans (source, started_at, finished_at, files_seen, deletions_held, held_reason)
           VALUES (%s, now(), now(), 0, %s, %s)""",
        (source, documents, reason),
    )


def record_hold_confirmed(conn: psycopg.Connection, source: str) -> None:
    """The documents of a source that left the configuration were held as confirmed: no deletions wait any more,
    and a scan that failed before it left is no longer a failure of the index (it is not served)."""
    conn.execute("INSERT INTO source_scans (source, started_at, finished_at, files_seen) VALUES (%s, now(), now(), 0)",
                 (source,))
    conn.execute("UPDATE sources SET last_scan_failed_at = NULL, last_scan_failure = NULL WHERE name = %s", (source,))


