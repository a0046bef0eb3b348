"""Index versions (blue/green): the registry, one chunk table per version with its indexes, its rows, the
active alias (read by rag.search and the rag.indexed_chunks view), and the lifecycle's events."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import psycopg
from pgvector import HalfVector
from psycopg import sql
from psycopg.types.json import Jsonb

from rag_pipeline.domain import ids
from rag_pipeline.domain.status import DOCUMENT_LIVE_IN_INDEX, VERSION_WRITABLE, DocumentStatus, VersionStatus
from rag_pipeline.store.chunks import StoredChunk

V = VersionStatus
ACTIVE_ALIAS = "active"
# Arbitrary text: serialises creating and activating versions across processes.
_REGISTRY_LOCK = "rag_pipeline:index_versions"


@dataclass(frozen=True)
class IndexVersion:
    version_id: int
    table_name: str
    embedding_model: str  # the model as its backend runs it (ids.ModelIdentity.backend_model)
    model_revision: str | None  # its weights (ids.ModelIdentity.weights)
    dimensions: int
    chunker_version: str
    parser_version: str
    status: VersionStatus
    row_count: int = 0
    # ids.ModelIdentity.key: the embedding cache key of its vectors. None: a version from before model identities
    # whose weights were not identified yet (rag_pipeline.embedding.identity.adopt_model_identities).
    model_identity: str | None = None

    @property
    def label(self) -> str:
        return f"v{self.version_id}"


_VERSION_COLUMNS = sql.SQL(
    "v.version_id, v.table_name, v.embedding_model, v.model_revision, v.dimensions, v.chunker_version,"
    " v.parser_version, v.status, v.row_count, v.model_identity"
)


def _version(row: Sequence[Any]) -> IndexVersion:
    return IndexVersion(*row[:7], VersionStatus(row[7]), row[8], row[9])


def index_versions(conn: psycopg.Connection, statuses: Sequence[VersionStatus] | None = None) -> list[IndexVersion]:
    """Versions whose table exists (not dropped), optionally only those in `statuses`, oldest first."""
    query = sql.SQL(
        "SELECT {} FROM index_versions v WHERE v.dropped_at IS NULL AND (%(all)s OR v.status = ANY(%(statuses)s))"
        " ORDER BY v.version_id"
    ).format(_VERSION_COLUMNS)
    rows = conn.execute(query, {"all": statuses is None, "statuses": list(statuses or ())}).fetchall()
    return [_version(row) for row in rows]


def get_version(conn: psycopg.Connection, version_id: int) -> IndexVersion | None:
    """A version whose table exists, by id."""
    row = conn.execute(
        sql.SQL("SELECT {} FROM index_versions v WHERE v.version_id = %s AND v.dropped_at IS NULL").format(
            _VERSION_COLUMNS
        ),
        (version_id,),
    ).fetchone()
    return _version(row) if row else None


def active_version(conn: psycopg.Connection) -> IndexVersion | None:
    query = sql.SQL(
        "SELECT {} FROM index_alias a JOIN index_versions v USING (version_id) WHERE a.alias = %s"
    ).format(_VERSION_COLUMNS)
    row = conn.execute(query, (ACTIVE_ALIAS,)).fetchone()
    return _version(row) if row else None


def writable_versions(conn: psycopg.Connection) -> list[IndexVersion]:
    """Versions that receive every write (rag_pipeline.domain.status.VERSION_WRITABLE)."""
    return index_versions(conn, VERSION_WRITABLE)


def lock_registry(conn: psycopg.Connection) -> None:
    """Serialise version creation and activation until the transaction ends."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (_REGISTRY_LOCK,))


def share_registry(conn: psycopg.Connection) -> None:
    """Held by each document's index write until it commits: a version is created (lock_registry) between two
    writes, never during one, so every write either reaches the new version or is read by its backfill."""
    conn.execute("SELECT pg_advisory_xact_lock_shared(hashtext(%s))", (_REGISTRY_LOCK,))


def create_version(
    conn: psycopg.Connection,
    model: ids.ModelIdentity,
    dimensions: int,
    chunker_version: str,
    parser_version: str,
    bm25_k1: float = 1.2,
    bm25_b: float = 0.75,
) -> IndexVersion:
    """Register a version in status 'building' and create its chunk table with all its indexes."""
    version_id = conn.execute(
        """INSERT INTO index_versions (table_name, embedding_model, model_revision, model_identity, dimensions,
                                       chunker_version, parser_version, status)
           VALUES ('pending', %s, %s, %s, %s, %s, %s, %s) RETURNING version_id""",
        (model.backend_model, model.weights, model.key, dimensions, chunker_version, parser_version, V.BUILDING),
    ).fetchone()[0]
    table_name = ids.version_table(version_id)
    conn.execute("UPDATE index_versions SET table_name = %s WHERE version_id = %s", (table_name, version_id))
    table = sql.Identifier(table_name)
    conn.execute(
        sql.SQL(
            """CREATE TABLE {table} (
                   chunk_id            text PRIMARY KEY,  -- near-duplicate group id: one row per group
                   owner_chunk_id      text NOT NULL,     -- the occurrence whose text and place this row shows
                   doc_id              text NOT NULL REFERENCES documents (doc_id) ON DELETE CASCADE,
                   ordinal             integer NOT NULL,
                   text                text NOT NULL,
                   prefix              text NOT NULL,
                   section_path        text NOT NULL,
                   page_start          integer NOT NULL,
                   page_end            integer NOT NULL,
                   content_type        text NOT NULL,
                   -- default-deny in the schema itself: a row nobody may read cannot exist
                   acl_labels          text[] NOT NULL CHECK (cardinality(acl_labels) > 0),
                   embedding_input_sha text NOT NULL,
                   embedding           halfvec({dims}) NOT NULL
               )"""
        ).format(table=table, dims=sql.Literal(dimensions))
    )
    for suffix, index_sql in (
        ("hnsw", "CREATE INDEX {name} ON {table} USING hnsw (embedding halfvec_cosine_ops)"),
        ("acl", "CREATE INDEX {name} ON {table} USING gin (acl_labels)"),
        ("doc", "CREATE INDEX {name} ON {table} (doc_id, ordinal)"),
        ("ctype", "CREATE INDEX {name} ON {table} (content_type)"),
    ):
        conn.execute(sql.SQL(index_sql).format(name=sql.Identifier(f"{table_name}_{suffix}"), table=table))
    # BM25: the row key, the language column, postings, weights, counters and the triggers that keep them
    # (one definition, rag_bm25_attach in sql/functions/30_bm25_index.sql).
    conn.execute("SELECT rag_bm25_attach(%s, %s, %s)", (table_name, bm25_k1, bm25_b))
    return IndexVersion(version_id, table_name, model.backend_model, model.weights, dimensions, chunker_version,
                        parser_version, V.BUILDING, 0, model.key)


def ensure_active(
    conn: psycopg.Connection,
    model: ids.ModelIdentity,
    dimensions: int,
    chunker_version: str,
    parser_version: str,
    bm25_k1: float = 1.2,
    bm25_b: float = 0.75,
) -> IndexVersion:
    """The active version; on a database without one, a new version with these parameters, activated."""
    lock_registry(conn)
    current = active_version(conn)
    if current is not None:
        return current
    version = create_version(conn, model, dimensions, chunker_version, parser_version, bm25_k1, bm25_b)
    activate(conn, version.version_id)
    return active_version(conn)  # type: ignore[return-value]


def activate(conn: psycopg.Connection, version_id: int) -> None:
    """Point the alias (and so rag.search and the rag.indexed_chunks view) at a version; the one active before
    becomes previous (kept for rollback), its retention clock (retired_at) started."""
    conn.execute(
        "UPDATE index_versions SET status = %s, retired_at = now() WHERE status = %s AND version_id <> %s",
        (V.PREVIOUS, V.ACTIVE, version_id),
    )
    conn.execute(
        "UPDATE index_versions SET status = %s, promoted_at = now(), ready_at = coalesce(ready_at, now())"
        " WHERE version_id = %s",
        (V.ACTIVE, version_id),
    )
    conn.execute(
        """INSERT INTO index_alias (alias, version_id) VALUES (%s, %s)
           ON CONFLICT (alias) DO UPDATE SET version_id = EXCLUDED.version_id, updated_at = now()""",
        (ACTIVE_ALIAS, version_id),
    )


def mark_ready(conn: psycopg.Connection, version_id: int) -> bool:
    """A building version whose backfill is complete becomes ready. False when it was not building."""
    return conn.execute(
        "UPDATE index_versions SET status = %s, ready_at = now() WHERE version_id = %s AND status = %s",
        (V.READY, version_id, V.BUILDING),
    ).rowcount == 1


def rollback_target(conn: psycopg.Connection, current: int) -> int | None:
    """The rollback target: of the versions older than `current` that were once active and still have their table,
    the one retired last (the one active before `current`). Never a newer one: a second rollback goes further
    back, not forward again to the version the first one left."""
    row = conn.execute(
        """SELECT version_id FROM index_versions
           WHERE status = %s AND promoted_at IS NOT NULL AND dropped_at IS NULL AND version_id < %s
           ORDER BY retired_at DESC, version_id DESC LIMIT 1""",
        (V.PREVIOUS, current),
    ).fetchone()
    return row[0] if row else None


def reclaimed_target(conn: psycopg.Connection, current: int) -> tuple[int, datetime] | None:
    """The version a rollback would have returned to had it not been dropped, and when it was: the newest dropped
    version older than `current` that was once active."""
    row = conn.execute(
        """SELECT version_id, dropped_at FROM index_versions
           WHERE promoted_at IS NOT NULL AND dropped_at IS NOT NULL AND version_id < %s
           ORDER BY retired_at DESC, version_id DESC LIMIT 1""",
        (current,),
    ).fetchone()
    return (row[0], row[1]) if row else None


@dataclass(frozen=True)
class PreviousVersion:
    """A version kept for rollback, and when retention.rollback reclaims it."""

    version: IndexVersion
    retired_at: datetime  # when it stopped being active: the retention clock
    pinned_reason: str | None
    warned_at: datetime | None  # when the alert before its reclaim went out
    table_bytes: int  # its table with its indexes and TOAST


def previous_versions(conn: psycopg.Connection) -> list[PreviousVersion]:
    """Every previous version, oldest first."""
    rows = conn.execute(
        sql.SQL("""SELECT {}, coalesce(v.retired_at, v.promoted_at, v.created_at), v.pinned_reason,
                          v.reclaim_warned_at,
                          coalesce(pg_total_relation_size(to_regclass(quote_ident(v.table_name))), 0)
                   FROM index_versions v WHERE v.status = %s AND v.dropped_at IS NULL
                   ORDER BY v.version_id""").format(_VERSION_COLUMNS),
        (V.PREVIOUS,),
    ).fetchall()
    return [PreviousVersion(_version(row[:10]), *row[10:]) for row in rows]


def database_now(conn: psycopg.Connection) -> datetime:
    """The database's clock: what retention windows are measured by."""
    return conn.execute("SELECT now()").fetchone()[0]


def set_pin(conn: psycopg.Connection, version_id: int, reason: str | None) -> bool:
    """Pin a version (never reclaimed) with its reason, or unpin it (None: a reclaim warns again before it drops
    it); False when it has no table."""
    return conn.execute(
        """UPDATE index_versions SET pinned_reason = %s,
                  reclaim_warned_at = CASE WHEN %s::text IS NULL THEN NULL ELSE reclaim_warned_at END
           WHERE version_id = %s AND dropped_at IS NULL""",
        (reason, reason, version_id),
    ).rowcount == 1


def drop_unless_busy(conn: psycopg.Connection, version: IndexVersion, lock_timeout: str) -> bool:
    """drop, in a savepoint, waiting at most `lock_timeout` for readers of the table (a backup, `eval V`); False,
    nothing dropped, when they hold it longer."""
    try:
        with conn.transaction():
            # Local to the savepoint's transaction: the setting the role or database gives is back after it.
            before = conn.execute("SELECT current_setting('lock_timeout')").fetchone()[0]
            conn.execute("SELECT set_config('lock_timeout', %s, true)", (lock_timeout,))
            drop(conn, version)
            conn.execute("SELECT set_config('lock_timeout', %s, true)", (before,))
        return True
    except psycopg.errors.LockNotAvailable:
        return False


def pinned_reason(conn: psycopg.Connection, version_id: int) -> str | None:
    row = conn.execute("SELECT pinned_reason FROM index_versions WHERE version_id = %s", (version_id,)).fetchone()
    return row[0] if row else None


def mark_reclaim_warned(conn: psycopg.Connection, version_id: int, at: datetime | None) -> None:
    """When the alert before the version's reclaim went out (None: it did not reach its sinks; sent again)."""
    conn.execute("UPDATE index_versions SET reclaim_warned_at = %s WHERE version_id = %s", (at, version_id))


def drop(conn: psycopg.Connection, version: IndexVersion) -> None:
    """Drop a version's table for good and mark it retired and dropped."""
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(version.table_name)))
    conn.execute("SELECT rag_bm25_detach(%s)", (version.table_name,))
    conn.execute(
        """UPDATE index_versions SET status = %s, retired_at = coalesce(retired_at, now()),
                  dropped_at = now(), row_count = 0 WHERE version_id = %s""",
        (V.RETIRED, version.version_id),
    )


def record_event(conn: psycopg.Connection, version_id: int, event: str, forced: bool, detail: dict[str, Any]) -> None:
    conn.execute(
        "INSERT INTO index_version_events (version_id, event, forced, detail) VALUES (%s, %s, %s, %s)",
        (version_id, event, forced, Jsonb(detail)),
    )


@dataclass(frozen=True)
class VersionTimes:
    created_at: datetime
    promoted_at: datetime | None
    retired_at: datetime | None  # when it stopped being active (previous), or was dropped
    pinned_reason: str | None = None


def version_times(conn: psycopg.Connection) -> dict[int, VersionTimes]:
    rows = conn.execute("SELECT version_id, created_at, promoted_at, retired_at, pinned_reason"
                        " FROM index_versions").fetchall()
    return {row[0]: VersionTimes(*row[1:]) for row in rows}


# --- rows ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IndexRow:
    chunk: StoredChunk
    input_sha: str
    embedding: np.ndarray


_INSERT_ROWS = sql.SQL("""INSERT INTO {} (chunk_id, owner_chunk_id, doc_id, ordinal, text, prefix, section_path,
                                          page_start, page_end, content_type, acl_labels, embedding_input_sha,
                                          embedding, text_config)
                          VALUES {} ON CONFLICT (chunk_id) DO NOTHING""")
_ROW_VALUES = sql.SQL("(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::regconfig)")
INSERT_ROWS_AT_ONCE = 1000  # 14 parameters a row, under PostgreSQL's 65,535 a statement


def insert_group_rows(
    conn: psycopg.Connection, version: IndexVersion, acl_labels: Sequence[str], rows: Sequence[IndexRow]
) -> int:
    """One row per near-duplicate group: the first occurrence to arrive owns it (in `rows`' order: ON CONFLICT DO
    NOTHING skips a later row of the same group in the same statement too). Returns rows inserted."""
    inserted = 0
    with conn.cursor() as cur:
        for start in range(0, len(rows), INSERT_ROWS_AT_ONCE):
            part = rows[start:start + INSERT_ROWS_AT_ONCE]
            values = [
                value for row in part for c in (row.chunk,) for value in (
                    c.group_id or c.chunk_id, c.chunk_id, c.doc_id, c.ordinal, c.text, c.prefix, c.section_path,
                    c.page_start, c.page_end, c.content_type, list(acl_labels), row.input_sha,
                    HalfVector(row.embedding), c.text_config,
                )
            ]
            cur.execute(_INSERT_ROWS.format(sql.Identifier(version.table_name),
                                            sql.SQL(", ").join([_ROW_VALUES] * len(part))), values)
            inserted += cur.rowcount
    return inserted


def delete_document_rows(conn: psycopg.Connection, version: IndexVersion, doc_id: str) -> list[str]:
    """Delete the rows a document owns in a version; returns their group ids."""
    rows = conn.execute(
        sql.SQL("DELETE FROM {} WHERE doc_id = %s RETURNING chunk_id").format(sql.Identifier(version.table_name)),
        (doc_id,),
    ).fetchall()
    return [r[0] for r in rows]


def delete_rows_of(conn: psycopg.Connection, version: IndexVersion, doc_ids: Sequence[str]) -> None:
    conn.execute(
        sql.SQL("DELETE FROM {} WHERE doc_id = ANY(%s)").format(sql.Identifier(version.table_name)),
        (list(doc_ids),),
    )


def embedding_inputs_of(conn: psycopg.Connection, version: IndexVersion, doc_ids: Sequence[str]) -> list[tuple[str, str]]:
    """(doc_id, embedding_input_sha) of the documents' rows in this version."""
    return conn.execute(
        sql.SQL("SELECT doc_id, embedding_input_sha FROM {} WHERE doc_id = ANY(%s)").format(
            sql.Identifier(version.table_name)),
        (list(doc_ids),),
    ).fetchall()


def copy_document_labels(conn: psycopg.Connection, version: IndexVersion, doc_ids: Sequence[str]) -> None:
    conn.execute(
        sql.SQL(
            "UPDATE {} t SET acl_labels = d.acl_labels FROM documents d"
            " WHERE t.doc_id = d.doc_id AND d.doc_id = ANY(%s)"
        ).format(sql.Identifier(version.table_name)),
        (list(doc_ids),),
    )


def rowless_group_occurrences(
    conn: psycopg.Connection, version: IndexVersion, group_ids: Sequence[str]
) -> list[tuple[StoredChunk, list[str]]]:
    """For groups without a row in this version: their first live occurrence (and its document's labels)."""
    rows = conn.execute(
        sql.SQL(
            """SELECT DISTINCT ON (c.group_id) c.chunk_id, c.doc_id, c.ordinal, c.text, c.prefix, c.section_path,
                      c.page_start, c.page_end, c.content_type, c.group_id, c.text_config::text, d.acl_labels
               FROM chunks c JOIN documents d USING (doc_id)
               WHERE c.group_id = ANY(%s) AND cardinality(d.acl_labels) > 0
                 AND d.status = ANY(%s)
                 AND NOT EXISTS (SELECT 1 FROM {} t WHERE t.chunk_id = c.group_id)
               ORDER BY c.group_id, c.doc_id, c.ordinal"""
        ).format(sql.Identifier(version.table_name)),
        (list(group_ids), list(DOCUMENT_LIVE_IN_INDEX)),
    ).fetchall()
    return [(StoredChunk(*r[:11]), list(r[11])) for r in rows]


def groups_without_row(conn: psycopg.Connection, version: IndexVersion) -> int:
    """Chunk groups of indexed documents that have no row in this version (a backfill not done, a lost row)."""
    return conn.execute(
        sql.SQL(
            """SELECT count(DISTINCT c.group_id) FROM chunks c JOIN documents d USING (doc_id)
               WHERE d.status = %s AND c.group_id IS NOT NULL
                 AND NOT EXISTS (SELECT 1 FROM {} t WHERE t.chunk_id = c.group_id)"""
        ).format(sql.Identifier(version.table_name)),
        (DocumentStatus.INDEXED,),
    ).fetchone()[0]


def rows_deleted_since_build(conn: psycopg.Connection, version: IndexVersion) -> int:
    """Rows of documents deleted at their source since the version's build began (deletion replay)."""
    return conn.execute(
        sql.SQL(
            """SELECT count(*) FROM {} t JOIN deletion_log l ON l.doc_id = t.doc_id
               JOIN index_versions v ON v.version_id = %s
               WHERE l.deleted_at >= v.build_started_at
                 AND NOT EXISTS (SELECT 1 FROM documents d WHERE d.doc_id = t.doc_id)"""
        ).format(sql.Identifier(version.table_name)),
        (version.version_id,),
    ).fetchone()[0]


@dataclass(frozen=True)
class Bm25State:
    k1: float
    b: float
    weights_avgdl: float | None  # the average length the stored weights were computed with
    live_avgdl: float | None
    rows_counted: int  # rows the counters account for
    rows_weighted: int  # rows with a weight vector


def bm25_state(conn: psycopg.Connection, version: IndexVersion) -> Bm25State:
    k1, b, weights_avgdl = conn.execute(
        sql.SQL("SELECT k1, b, avgdl FROM {}").format(sql.Identifier(f"{version.table_name}_bm25_params"))
    ).fetchone()
    counted, total_len = conn.execute(
        sql.SQL("SELECT coalesce(sum(chunks), 0), coalesce(sum(total_len), 0) FROM {}").format(
            sql.Identifier(f"{version.table_name}_bm25_totals"))
    ).fetchone()
    weighted = conn.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(f"{version.table_name}_bm25docs"))
    ).fetchone()[0]
    return Bm25State(float(k1), float(b), None if weights_avgdl is None else float(weights_avgdl),
                     float(total_len) / float(counted) if counted else None, int(counted), int(weighted))


def lock_writes(conn: psycopg.Connection, version: IndexVersion) -> None:
    """Hold off every write to the version's rows (searches go on) until the transaction ends."""
    conn.execute(sql.SQL("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE").format(sql.Identifier(version.table_name)))


def reweight_bm25(conn: psycopg.Connection, version: IndexVersion, k1: float, b: float) -> float | None:
    """Recompute every BM25 weight of a version with the current average length (and these k1, b)."""
    return conn.execute("SELECT rag_bm25_reweight(%s, %s, %s)", (version.table_name, k1, b)).fetchone()[0]


def rebuild_bm25(conn: psycopg.Connection, version: IndexVersion) -> None:
    """Recompute a version's BM25 structures from its rows, set-based (after a bulk load without triggers; the
    maintenance step that also drops the dead space of many deletions)."""
    conn.execute("SELECT rag_bm25_rebuild(%s)", (version.table_name,))


def row_count(conn: psycopg.Connection, version: IndexVersion) -> int:
    return int(conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(version.table_name))).fetchone()[0])


def refresh_stats(conn: psycopg.Connection, version: IndexVersion) -> int:
    count = row_count(conn, version)
    conn.execute("UPDATE index_versions SET row_count = %s WHERE version_id = %s", (count, version.version_id))
    return count


BM25_TABLE_SUFFIXES = ("_postings", "_bm25docs", "_bm25_df", "_bm25_totals")


def vacuum_churned(conn: psycopg.Connection, version: IndexVersion, dead_share: float) -> list[str]:
    """VACUUM (ANALYZE) the version's tables (rows, BM25 postings, weights, counters) whose dead rows reach
    `dead_share` of their live ones (and 50); returns the tables vacuumed. Deleted rows stay in the HNSW graph and the
    postings until a vacuum, and every search walks past them: after a few refreshes of 10% churn, searches were
    several times slower than on a fresh build. `conn` must be in autocommit mode (VACUUM runs outside a
    transaction)."""
    names = [version.table_name, *(version.table_name + suffix for suffix in BM25_TABLE_SUFFIXES)]
    churned = [r[0] for r in conn.execute(
        "SELECT relname FROM pg_stat_user_tables WHERE relname = ANY(%s) AND schemaname = current_schema()"
        " AND n_dead_tup >= 50 AND n_dead_tup >= %s * n_live_tup ORDER BY relname", (names, dead_share)).fetchall()]
    for name in churned:
        conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(sql.Identifier(name)))
    return churned


# --- model identities of versions built before they were recorded (legacy migration 018) ------------------------


def versions_without_identity(conn: psycopg.Connection) -> list[IndexVersion]:
    query = sql.SQL(
        "SELECT {} FROM index_versions v WHERE v.model_identity IS NULL AND v.dropped_at IS NULL ORDER BY v.version_id"
    ).format(_VERSION_COLUMNS)
    return [_version(row) for row in conn.execute(query).fetchall()]


def record_identity(conn: psycopg.Connection, version_id: int, model: ids.ModelIdentity) -> bool:
    """Record a version's identity unless one is recorded already; True when this call recorded it."""
    return conn.execute(
        """UPDATE index_versions SET embedding_model = %s, model_revision = %s, model_identity = %s
           WHERE version_id = %s AND model_identity IS NULL""",
        (model.backend_model, model.weights, model.key, version_id),
    ).rowcount == 1
