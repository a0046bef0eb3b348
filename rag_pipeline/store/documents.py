"""Sources, documents and the work queue: discovery's reconciliation, claims, status changes, reporting."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from rag_pipeline import ids
from rag_pipeline.config import SourceConfig
from rag_pipeline.sources import DiscoveredFile, ScanReport
from rag_pipeline.status import DOCUMENT_HELD, DOCUMENT_LIVE_IN_INDEX, DocumentStatus
from rag_pipeline.store import groups, versions

D = DocumentStatus
# Every status by name, for statements that name several: bound as parameters, never written as literals.
_STATUS = {status.name.lower(): status.value for status in DocumentStatus}


def lock_source_scan(conn: psycopg.Connection, source: str) -> None:
    """Serialise scans of one source until the transaction ends (other sources' scans run beside it)."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"rag_pipeline.scan:{source}",))


def upsert_source(conn: psycopg.Connection, source: SourceConfig, origin: str = "config") -> None:
    conn.execute(
        """INSERT INTO sources (name, root, include_patterns, default_acl_labels, freshness_sla_seconds, origin)
           VALUES (%s, %s, %s, %s, %s, %s)
           ON CONFLICT (name) DO UPDATE SET root = EXCLUDED.root,
               include_patterns = EXCLUDED.include_patterns,
               default_acl_labels = EXCLUDED.default_acl_labels,
               freshness_sla_seconds = EXCLUDED.freshness_sla_seconds,
               origin = EXCLUDED.origin""",
        (source.name, str(source.root), list(source.include), list(source.acl_labels), source.freshness_sla_seconds,
         origin),
    )


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
        SourceConfig(name=name, root=Path(root), include=tuple(inc), acl_labels=tuple(acl), freshness_sla=sla)
        for name, root, inc, acl, sla in rows
    ]


@dataclass
class ReconcileCounts:
    seen: int = 0
    new: int = 0
    changed: int = 0
    released: int = 0  # held before, admissible now
    retitled: int = 0
    relabelled: int = 0  # ACL-only change: labels updated in place, nothing re-embedded
    held: int = 0  # newly held back (no labels, a bad sidecar, hard links)
    deleted: int = 0
    deletions_held: int = 0  # what a guarded scan would have deleted, and did not
    deletions_held_reason: str | None = None

    @property
    def unchanged(self) -> int:
        return self.seen - self.new - self.changed - self.released - self.retitled


@dataclass(frozen=True)
class DeletionGuard:
    """When a scan may not delete on its own: a source found empty (an unmounted mount point reads as an empty
    folder), or more than `max_share` of its documents gone. `confirmed` lets one scan through."""

    max_share: float = 0.5
    confirmed: bool = False


# Documents of the source its scan did not find, except those under paths the scan could not read.
_GONE = """d.source = %(source)s AND NOT EXISTS (SELECT 1 FROM scan_files s WHERE s.doc_id = d.doc_id)
           AND NOT EXISTS (SELECT 1 FROM unnest(%(unreadable)s::text[]) u
                           WHERE u = '.' OR d.rel_path = u OR starts_with(d.rel_path, u || '/'))"""


_JUDGED = """d.source = %(source)s AND NOT EXISTS (SELECT 1 FROM unnest(%(unreadable)s::text[]) u
                           WHERE u = '.' OR d.rel_path = u OR starts_with(d.rel_path, u || '/'))"""


def _hold_of(f: DiscoveredFile) -> tuple[str | None, str | None]:
    if f.held:
        return f.held[0].value, f.held[1]
    if not f.acl_labels:
        return D.HELD_NO_LABELS.value, "no ACL labels"
    return None, None


def reconcile_source(
    conn: psycopg.Connection, source: str, files: Iterable[DiscoveredFile], report: ScanReport | None = None,
    guard: DeletionGuard = DeletionGuard(),
) -> ReconcileCounts:
    """Compare one scan of a source with the documents table, in SQL so it scales with the corpus.

    The scan is streamed into a temporary table with COPY; set operations then find new, changed,
    relabelled, held and deleted documents. Deleted documents lose their row (cascading to pages, chunks and
    every index version) and are written to the deletion log; newly held ones lose everything served from
    them (their parsed pages stay, never served). Documents under paths the scan could not read (`report.unreadable`, complete once `files` is consumed)
    are kept as they were; a scan the guard stops deletes nothing.
    """
    counts = ReconcileCounts()
    conn.execute(
        """CREATE TEMP TABLE scan_files (
               doc_id text PRIMARY KEY, rel_path text NOT NULL, fingerprint text NOT NULL,
               size_bytes bigint NOT NULL, modified_at timestamptz NOT NULL, acl_labels text[] NOT NULL,
               title text, metadata jsonb NOT NULL, hold_status text, hold_reason text,
               file_id text, file_links integer, read_path text) ON COMMIT DROP"""
    )
    with conn.cursor().copy(
        "COPY scan_files (doc_id, rel_path, fingerprint, size_bytes, modified_at, acl_labels, title, metadata,"
        " hold_status, hold_reason, file_id, file_links, read_path) FROM STDIN"
    ) as copy:
        for f in files:
            counts.seen += 1
            copy.write_row(
                (
                    f.doc_id, f.rel_path, f.fingerprint, f.size_bytes,
                    datetime.fromtimestamp(f.mtime_ns / 1e9, tz=UTC),
                    list(f.acl_labels), f.title, Jsonb(f.metadata), *_hold_of(f),
                    f.file_id, f.file_links, f.read_path,
                )
            )
    conn.execute("ANALYZE scan_files")
    unreadable = list(report.unreadable) if report else []  # read after the scan has run, not before
    params = {"source": source, "unreadable": unreadable, "held": list(DOCUMENT_HELD), **_STATUS}
    gone = sql.SQL(_GONE)
    # The share is of what the scan could judge: documents kept under unreadable paths are not in it.
    missing, total = conn.execute(
        sql.SQL("SELECT count(*) FILTER (WHERE {gone}), count(*) FILTER (WHERE {judged}) FROM documents d").format(
            gone=gone, judged=sql.SQL(_JUDGED)),
        params,
    ).fetchone()
    if missing and not guard.confirmed:
        if counts.seen == 0:
            counts.deletions_held_reason = (f"the root holds no files but {total} documents are indexed from it "
                                            "(an unmounted or emptied folder?)")
        elif missing > 1 and missing > guard.max_share * total:
            counts.deletions_held_reason = (f"would delete {missing} of {total} documents, more than "
                                            f"max_deletion_share {guard.max_share:g}")
    if counts.deletions_held_reason:
        counts.deletions_held = missing
    elif missing:
        # Groups that lose occurrences with the deleted documents must be repaired after the deletion.
        touched_groups = [r[0] for r in conn.execute(
            sql.SQL("""SELECT DISTINCT c.group_id FROM chunks c JOIN documents d USING (doc_id)
                       WHERE {gone} AND c.group_id IS NOT NULL""").format(gone=gone), params,
        ).fetchall()]
        remember_embedding_inputs(conn, [r[0] for r in conn.execute(
            sql.SQL("SELECT d.doc_id FROM documents d WHERE {gone}").format(gone=gone), params).fetchall()])
        deleted = conn.execute(
            sql.SQL("""WITH gone AS (
                           DELETE FROM documents d WHERE {gone}
                           RETURNING d.doc_id, d.source, d.rel_path)
                       INSERT INTO deletion_log (doc_id, source, rel_path)
                       SELECT doc_id, source, rel_path FROM gone
                       RETURNING doc_id""").format(gone=gone),
            params,
        ).fetchall()
        counts.deleted = len(deleted)
        repair_groups(conn, touched_groups)

    inserted = conn.execute(
        """INSERT INTO documents (doc_id, source, rel_path, fingerprint, size_bytes, modified_at,
                                  acl_labels, title, metadata, status, held_reason, file_id, file_links, read_path)
           SELECT s.doc_id, %(source)s, s.rel_path, s.fingerprint, s.size_bytes, s.modified_at, s.acl_labels,
                  s.title, s.metadata, coalesce(s.hold_status, %(pending_parse)s), s.hold_reason,
                  s.file_id, s.file_links, s.read_path
           FROM scan_files s
           WHERE NOT EXISTS (SELECT 1 FROM documents d WHERE d.doc_id = s.doc_id)
           RETURNING status""",
        params,
    ).fetchall()
    counts.new = len(inserted)
    counts.held = sum(1 for (status,) in inserted if status in DOCUMENT_HELD)

    # Classify every existing document whose file, metadata or hold differs from what is stored. Another file
    # (inode) under the same name is a change even with the same size and time; a row without an identity (from
    # the release before identities) only gains one.
    conn.execute(
        """CREATE TEMP TABLE scan_changes ON COMMIT DROP AS
           SELECT s.*, d.status AS old_status, d.acl_labels AS old_labels,
                  CASE WHEN s.hold_status IS NOT NULL THEN 'hold'
                       WHEN d.fingerprint <> s.fingerprint OR d.file_id <> s.file_id
                            OR (d.file_id IS NOT NULL AND d.read_path IS DISTINCT FROM s.read_path) THEN 'changed'
                       WHEN d.status = ANY(%(held)s) THEN 'released'
                       WHEN d.title IS DISTINCT FROM s.title THEN 'retitled'
                       WHEN d.acl_labels <> s.acl_labels THEN 'relabelled'
                       ELSE 'metadata' END AS change
           FROM scan_files s JOIN documents d USING (doc_id)
           WHERE d.fingerprint <> s.fingerprint OR d.acl_labels <> s.acl_labels
              OR d.file_id IS DISTINCT FROM s.file_id OR d.file_links IS DISTINCT FROM s.file_links
              OR d.read_path IS DISTINCT FROM s.read_path
              OR d.title IS DISTINCT FROM s.title OR d.metadata <> s.metadata
              OR s.hold_status IS DISTINCT FROM (CASE WHEN d.status = ANY(%(held)s) THEN d.status END)
              OR d.held_reason IS DISTINCT FROM s.hold_reason""",
        params,
    )
    # A document that is held back now loses everything served from it, in this transaction (its pages stay,
    # never served, so a release re-chunks instead of re-parsing).
    holds = [r[0] for r in conn.execute(
        "SELECT doc_id FROM scan_changes WHERE change = 'hold' AND NOT old_status = ANY(%s)", (list(DOCUMENT_HELD),)
    ).fetchall()]
    counts.held += len(holds)
    if holds:
        delete_derived_rows(conn, holds, keep_pages=True)
    conn.execute(
        """UPDATE documents d SET
               fingerprint = c.fingerprint, size_bytes = c.size_bytes, modified_at = c.modified_at,
               file_id = c.file_id, file_links = c.file_links, read_path = c.read_path,
               acl_labels = c.acl_labels, title = c.title, metadata = c.metadata, last_seen = now(),
               held_reason = c.hold_reason,
               status = CASE c.change
                   WHEN 'hold' THEN c.hold_status
                   WHEN 'changed' THEN %(pending_parse)s
                   WHEN 'released' THEN CASE WHEN d.content_hash IS NOT NULL THEN %(pending_chunk)s
                                             ELSE %(pending_parse)s END
                   WHEN 'retitled' THEN CASE WHEN d.status IN (%(indexed)s, %(pending_index)s)
                                             THEN %(pending_chunk)s ELSE d.status END
                   ELSE d.status END,
               changed_at = CASE WHEN c.change IN ('changed', 'released', 'retitled')
                                 THEN now() ELSE d.changed_at END
           FROM scan_changes c WHERE d.doc_id = c.doc_id""",
        params,
    )
    for change, number in conn.execute("SELECT change, count(*) FROM scan_changes GROUP BY change").fetchall():
        if change in ("changed", "released", "retitled", "relabelled"):
            setattr(counts, change, number)
    # Labels change on the rows at once, whatever else changed: a narrowed ACL must not wait for re-parsing
    # (which may fail, or run later) to take effect.
    relabelled = [r[0] for r in conn.execute(
        "SELECT doc_id FROM scan_changes WHERE change <> 'hold' AND acl_labels <> old_labels"
    ).fetchall()]
    if relabelled:
        relabel_index_rows(conn, relabelled)
    conn.execute("DROP TABLE scan_changes")
    conn.execute("DROP TABLE scan_files")
    return counts


def repair_groups(conn: psycopg.Connection, group_ids: Sequence[str]) -> None:
    """After occurrences of these groups disappeared: drop groups left empty, and send the documents that
    still hold an occurrence back to indexing, so a group whose row went with its owner gets a new one
    (from the embedding cache: nothing is re-embedded)."""
    if not group_ids:
        return
    groups.drop_empty(conn, group_ids)
    conn.execute(
        """UPDATE documents SET status = %s
           WHERE status = %s AND doc_id IN (SELECT doc_id FROM chunks WHERE group_id = ANY(%s))""",
        (D.PENDING_INDEX, D.INDEXED, list(group_ids)),
    )


def delete_derived_rows(conn: psycopg.Connection, doc_ids: Sequence[str], keep_pages: bool = False) -> None:
    """Remove every row derived from these documents (pages, chunks, all index versions) but the documents.
    With keep_pages, a held document keeps its parsed pages and LLM prefixes (never served): when it is released
    it is re-chunked from them, not parsed again (OCR, VLM and prefix calls are not paid twice)."""
    groups.lock_assignment(conn)
    touched_groups = [r[0] for r in conn.execute(
        "SELECT DISTINCT group_id FROM chunks WHERE doc_id = ANY(%s) AND group_id IS NOT NULL", (list(doc_ids),)
    ).fetchall()]
    remember_embedding_inputs(conn, doc_ids)
    for version in versions.index_versions(conn):
        versions.delete_rows_of(conn, version, doc_ids)
    conn.execute("DELETE FROM chunks WHERE doc_id = ANY(%s)", (list(doc_ids),))
    if keep_pages:
        conn.execute("UPDATE documents SET indexed_content_hash = NULL WHERE doc_id = ANY(%s)", (list(doc_ids),))
    else:
        conn.execute("DELETE FROM document_pages WHERE doc_id = ANY(%s)", (list(doc_ids),))
        conn.execute("DELETE FROM prefix_cache WHERE doc_id = ANY(%s)", (list(doc_ids),))
        conn.execute(
            "UPDATE documents SET content_hash = NULL, indexed_content_hash = NULL WHERE doc_id = ANY(%s)",
            (list(doc_ids),),
        )
    repair_groups(conn, touched_groups)


def remember_embedding_inputs(conn: psycopg.Connection, doc_ids: Sequence[str]) -> None:
    """Record what the documents' embedding-cache entries are keyed by, before their chunks and index rows go:
    the entries outlive the rows (for a return, until gc), and erasure must still find them."""
    inputs = {(doc_id, ids.embedding_input_sha(f"{prefix}\n{text}" if prefix else text))
              for doc_id, prefix, text in conn.execute(
                  "SELECT doc_id, prefix, text FROM chunks WHERE doc_id = ANY(%s)", (list(doc_ids),)).fetchall()}
    for version in versions.index_versions(conn):
        inputs.update(versions.embedding_inputs_of(conn, version, doc_ids))
    if inputs:
        with conn.cursor() as cursor:
            cursor.executemany("INSERT INTO document_embedding_inputs (doc_id, input_sha) VALUES (%s, %s) "
                               "ON CONFLICT DO NOTHING", sorted(inputs))


def relabel_index_rows(conn: psycopg.Connection, doc_ids: Sequence[str]) -> None:
    """ACL-only change: copy the documents' labels onto their rows in every version at once (a narrowed
    ACL must not wait for anything), then regroup them: near-duplicate groups never span label sets.
    Regrouping takes vectors from the embedding cache, so nothing is re-embedded."""
    for version in versions.index_versions(conn):
        versions.copy_document_labels(conn, version, doc_ids)
    conn.execute(
        "UPDATE documents SET status = %s WHERE status = %s AND doc_id = ANY(%s)",
        (D.PENDING_INDEX, D.INDEXED, list(doc_ids)),
    )


def record_scan(conn: psycopg.Connection, source: str, started_at: datetime, counts: ReconcileCounts) -> None:
    conn.execute(
        """INSERT INTO source_scans (source, started_at, finished_at, files_seen, new_docs, changed, deleted,
                                     deletions_held, held_reason)
           VALUES (%s, %s, now(), %s, %s, %s, %s, %s, %s)""",
        (source, started_at, counts.seen, counts.new, counts.changed, counts.deleted, counts.deletions_held,
         counts.deletions_held_reason),
    )
    conn.execute(
        "UPDATE sources SET last_scan_started_at = %s, last_scan_completed_at = now() WHERE name = %s",
        (started_at, source),
    )


# --- how Dagster names documents ---


def refs_of(conn: psycopg.Connection, paths: Iterable[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """The refs of the documents at these (source, rel_path); paths that are no document are left out."""
    pairs = sorted(set(paths))
    if not pairs:
        return {}
    rows = conn.execute(
        """SELECT d.source, d.rel_path, d.ref FROM documents d
           JOIN unnest(%s::text[], %s::text[]) AS p (source, rel_path) USING (source, rel_path)""",
        ([s for s, _ in pairs], [r for _, r in pairs])).fetchall()
    return {(source, rel_path): ref for source, rel_path, ref in rows}


def paths_of(conn: psycopg.Connection, refs: Iterable[int]) -> dict[int, tuple[str, str]]:
    """(source, rel_path) of the documents with these refs (the CLI resolving what Dagster shows)."""
    rows = conn.execute("SELECT ref, source, rel_path FROM documents WHERE ref = ANY(%s)",
                        (sorted(set(refs)),)).fetchall()
    return {ref: (source, rel_path) for ref, source, rel_path in rows}


# --- the work queue --------------------------------------------------------------------------------


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


PENDING_COLUMN_NAMES = ("doc_id", "source", "rel_path", "fingerprint", "content_hash", "indexed_content_hash",
                        "title", "acl_labels", "chunker_version", "file_id", "file_links", "read_path")
_PENDING_COLUMNS = sql.SQL(", ").join(map(sql.Identifier, PENDING_COLUMN_NAMES))


def pending_from_rows(rows: list[tuple[Any, ...]]) -> list[PendingDocument]:
    return [PendingDocument(*r[:7], tuple(r[7]), *r[8:12]) for r in rows]


def pending_documents(
    conn: psycopg.Connection, status: DocumentStatus, limit: int, after: str = ""
) -> list[PendingDocument]:
    """A batch of documents awaiting a stage, in doc_id order (keyset pagination, never OFFSET)."""
    rows = conn.execute(
        sql.SQL("SELECT {} FROM documents WHERE status = %s AND doc_id > %s ORDER BY doc_id LIMIT %s").format(
            _PENDING_COLUMNS
        ),
        (status, after, limit),
    ).fetchall()
    return pending_from_rows(rows)


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


def status_counts(conn: psycopg.Connection) -> dict[str, int]:
    return dict(conn.execute("SELECT status, count(*) FROM documents GROUP BY status").fetchall())


def held_documents(conn: psycopg.Connection) -> list[tuple[str, str, str, str | None]]:
    """(source, path, status, reason) of every document held back from the index."""
    return conn.execute(
        """SELECT source, rel_path, status, held_reason FROM documents WHERE status = ANY(%s)
           ORDER BY source, rel_path""",
        (list(DOCUMENT_HELD),),
    ).fetchall()
