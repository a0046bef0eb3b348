"""All SQL that reads and writes the index, composed with psycopg.sql and parameters.

Transactions are the caller's: every function here runs on the connection it is given and commits
nothing, so a caller can make "replace this document's rows" one atomic unit.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from pgvector import HalfVector
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from rag_pipeline import dedup
from rag_pipeline.chunking import Chunk
from rag_pipeline.config import SourceConfig
from rag_pipeline.parsing import ParsedPage
from rag_pipeline.safety import injection_flags
from rag_pipeline.sources import DiscoveredFile

ACTIVE_ALIAS = "active"
ACTIVE_VIEW = "active_chunks"


# --- sources and discovery ------------------------------------------------------------------------


def upsert_source(conn: psycopg.Connection, source: SourceConfig) -> None:
    conn.execute(
        """INSERT INTO sources (name, root, include_patterns, default_acl_labels, freshness_sla_seconds)
           VALUES (%s, %s, %s, %s, %s)
           ON CONFLICT (name) DO UPDATE SET root = EXCLUDED.root,
               include_patterns = EXCLUDED.include_patterns,
               default_acl_labels = EXCLUDED.default_acl_labels,
               freshness_sla_seconds = EXCLUDED.freshness_sla_seconds""",
        (source.name, str(source.root), list(source.include), list(source.acl_labels), source.freshness_sla_seconds),
    )


def registered_sources(conn: psycopg.Connection) -> list[SourceConfig]:
    rows = conn.execute(
        "SELECT name, root, include_patterns, default_acl_labels, freshness_sla_seconds FROM sources ORDER BY name"
    ).fetchall()
    return [SourceConfig(name, Path(root), tuple(inc), tuple(acl), sla) for name, root, inc, acl, sla in rows]


@dataclass
class ReconcileCounts:
    seen: int = 0
    new: int = 0
    changed: int = 0
    released: int = 0  # held for missing labels before, labelled now
    retitled: int = 0
    relabelled: int = 0  # ACL-only change: labels updated in place, nothing re-embedded
    held: int = 0  # newly held back because they have no ACL labels
    deleted: int = 0
    deleted_doc_ids: list[str] = field(default_factory=list)

    @property
    def unchanged(self) -> int:
        return self.seen - self.new - self.changed - self.released - self.retitled


def reconcile_source(
    conn: psycopg.Connection, source: str, files: Iterable[DiscoveredFile]
) -> ReconcileCounts:
    """Compare one scan of a source with the documents table, in SQL so it scales with the corpus.

    The scan is streamed into a temporary table with COPY; set operations then find new, changed,
    relabelled and deleted documents. Deleted documents lose their row (cascading to pages, chunks and
    every index version) and are written to the deletion log.
    """
    counts = ReconcileCounts()
    conn.execute(
        """CREATE TEMP TABLE scan_files (
               doc_id text PRIMARY KEY, rel_path text NOT NULL, fingerprint text NOT NULL,
               size_bytes bigint NOT NULL, modified_at timestamptz NOT NULL, acl_labels text[] NOT NULL,
               title text, metadata jsonb NOT NULL) ON COMMIT DROP"""
    )
    with conn.cursor().copy(
        "COPY scan_files (doc_id, rel_path, fingerprint, size_bytes, modified_at, acl_labels, title, metadata)"
        " FROM STDIN"
    ) as copy:
        for f in files:
            counts.seen += 1
            copy.write_row(
                (
                    f.doc_id, f.rel_path, f.fingerprint, f.size_bytes,
                    datetime.fromtimestamp(f.mtime_ns / 1e9, tz=UTC),
                    list(f.acl_labels), f.title, Jsonb(f.metadata),
                )
            )
    conn.execute("ANALYZE scan_files")

    # Groups that lose occurrences with the deleted documents must be repaired after the deletion.
    touched_groups = [r[0] for r in conn.execute(
        """SELECT DISTINCT c.group_id FROM chunks c JOIN documents d USING (doc_id)
           WHERE d.source = %s AND c.group_id IS NOT NULL
             AND NOT EXISTS (SELECT 1 FROM scan_files s WHERE s.doc_id = d.doc_id)""",
        (source,),
    ).fetchall()]
    deleted = conn.execute(
        """WITH gone AS (
               DELETE FROM documents d WHERE d.source = %s
                 AND NOT EXISTS (SELECT 1 FROM scan_files s WHERE s.doc_id = d.doc_id)
               RETURNING d.doc_id, d.source, d.rel_path)
           INSERT INTO deletion_log (doc_id, source, rel_path) SELECT doc_id, source, rel_path FROM gone
           RETURNING doc_id""",
        (source,),
    ).fetchall()
    counts.deleted = len(deleted)
    counts.deleted_doc_ids = [row[0] for row in deleted]
    repair_groups(conn, touched_groups)

    inserted = conn.execute(
        """INSERT INTO documents (doc_id, source, rel_path, fingerprint, size_bytes, modified_at,
                                  acl_labels, title, metadata, status)
           SELECT s.doc_id, %s, s.rel_path, s.fingerprint, s.size_bytes, s.modified_at, s.acl_labels,
                  s.title, s.metadata,
                  CASE WHEN cardinality(s.acl_labels) = 0 THEN 'held_no_labels' ELSE 'pending_parse' END
           FROM scan_files s
           WHERE NOT EXISTS (SELECT 1 FROM documents d WHERE d.doc_id = s.doc_id)
           RETURNING status""",
        (source,),
    ).fetchall()
    counts.new = len(inserted)
    counts.held = sum(1 for (status,) in inserted if status == "held_no_labels")

    # Classify every existing document whose file or metadata differs from what is stored.
    conn.execute(
        """CREATE TEMP TABLE scan_changes ON COMMIT DROP AS
           SELECT s.*, d.status AS old_status, d.acl_labels AS old_labels,
                  CASE WHEN cardinality(s.acl_labels) = 0 THEN 'hold'
                       WHEN d.fingerprint <> s.fingerprint THEN 'changed'
                       WHEN d.status = 'held_no_labels' THEN 'released'
                       WHEN d.title IS DISTINCT FROM s.title THEN 'retitled'
                       WHEN d.acl_labels <> s.acl_labels THEN 'relabelled'
                       ELSE 'metadata' END AS change
           FROM scan_files s JOIN documents d USING (doc_id)
           WHERE d.fingerprint <> s.fingerprint OR d.acl_labels <> s.acl_labels
              OR d.title IS DISTINCT FROM s.title OR d.metadata <> s.metadata
              OR (d.status = 'held_no_labels' AND cardinality(s.acl_labels) > 0)"""
    )
    # A document that loses its last label is held back, and everything derived from it goes.
    holds = [r[0] for r in conn.execute(
        "SELECT doc_id FROM scan_changes WHERE change = 'hold' AND old_status <> 'held_no_labels'"
    ).fetchall()]
    counts.held += len(holds)
    if holds:
        delete_derived_rows(conn, holds)
    conn.execute(
        """UPDATE documents d SET
               fingerprint = c.fingerprint, size_bytes = c.size_bytes, modified_at = c.modified_at,
               acl_labels = c.acl_labels, title = c.title, metadata = c.metadata, last_seen = now(),
               status = CASE c.change
                   WHEN 'hold' THEN 'held_no_labels'
                   WHEN 'changed' THEN 'pending_parse'
                   WHEN 'released' THEN 'pending_parse'
                   WHEN 'retitled' THEN CASE WHEN d.status IN ('indexed', 'pending_index')
                                             THEN 'pending_chunk' ELSE d.status END
                   ELSE d.status END,
               changed_at = CASE WHEN c.change IN ('changed', 'released', 'retitled')
                                 THEN now() ELSE d.changed_at END
           FROM scan_changes c WHERE d.doc_id = c.doc_id"""
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


def drop_empty_groups(conn: psycopg.Connection, group_ids: Sequence[str]) -> None:
    conn.execute(
        """DELETE FROM chunk_groups g WHERE g.group_id = ANY(%s)
             AND NOT EXISTS (SELECT 1 FROM chunks c WHERE c.group_id = g.group_id)""",
        (list(group_ids),),
    )


def repair_groups(conn: psycopg.Connection, group_ids: Sequence[str]) -> None:
    """After occurrences of these groups disappeared: drop groups left empty, and send the documents that
    still hold an occurrence back to indexing, so a group whose row went with its owner gets a new one
    (from the embedding cache: nothing is re-embedded)."""
    if not group_ids:
        return
    drop_empty_groups(conn, group_ids)
    conn.execute(
        """UPDATE documents SET status = 'pending_index'
           WHERE status = 'indexed' AND doc_id IN (SELECT doc_id FROM chunks WHERE group_id = ANY(%s))""",
        (list(group_ids),),
    )


def delete_derived_rows(conn: psycopg.Connection, doc_ids: Sequence[str]) -> None:
    """Remove every row derived from these documents (pages, chunks, all index versions) but the documents."""
    touched_groups = [r[0] for r in conn.execute(
        "SELECT DISTINCT group_id FROM chunks WHERE doc_id = ANY(%s) AND group_id IS NOT NULL", (list(doc_ids),)
    ).fetchall()]
    for version in index_versions(conn):
        conn.execute(
            sql.SQL("DELETE FROM {} WHERE doc_id = ANY(%s)").format(sql.Identifier(version.table_name)),
            (list(doc_ids),),
        )
    conn.execute("DELETE FROM chunks WHERE doc_id = ANY(%s)", (list(doc_ids),))
    conn.execute("DELETE FROM document_pages WHERE doc_id = ANY(%s)", (list(doc_ids),))
    conn.execute("DELETE FROM prefix_cache WHERE doc_id = ANY(%s)", (list(doc_ids),))
    conn.execute(
        "UPDATE documents SET content_hash = NULL, indexed_content_hash = NULL WHERE doc_id = ANY(%s)",
        (list(doc_ids),),
    )
    repair_groups(conn, touched_groups)


def relabel_index_rows(conn: psycopg.Connection, doc_ids: Sequence[str]) -> None:
    """ACL-only change: copy the documents' labels onto their rows in every version at once (a narrowed
    ACL must not wait for anything), then regroup them: near-duplicate groups never span label sets.
    Regrouping takes vectors from the embedding cache, so nothing is re-embedded."""
    for version in index_versions(conn):
        conn.execute(
            sql.SQL(
                "UPDATE {} t SET acl_labels = d.acl_labels FROM documents d"
                " WHERE t.doc_id = d.doc_id AND d.doc_id = ANY(%s)"
            ).format(sql.Identifier(version.table_name)),
            (list(doc_ids),),
        )
    conn.execute(
        "UPDATE documents SET status = 'pending_index' WHERE status = 'indexed' AND doc_id = ANY(%s)",
        (list(doc_ids),),
    )


def record_scan(conn: psycopg.Connection, source: str, started_at: datetime, counts: ReconcileCounts) -> None:
    conn.execute(
        """INSERT INTO source_scans (source, started_at, finished_at, files_seen, new_docs, changed, deleted)
           VALUES (%s, %s, now(), %s, %s, %s, %s)""",
        (source, started_at, counts.seen, counts.new, counts.changed, counts.deleted),
    )
    conn.execute(
        "UPDATE sources SET last_scan_started_at = %s, last_scan_completed_at = now() WHERE name = %s",
        (started_at, source),
    )


# --- work queue ------------------------------------------------------------------------------------


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


def pending_documents(
    conn: psycopg.Connection, status: str, limit: int, after: str = ""
) -> list[PendingDocument]:
    """A batch of documents awaiting a stage, in doc_id order (keyset pagination, never OFFSET)."""
    rows = conn.execute(
        """SELECT doc_id, source, rel_path, fingerprint, content_hash, indexed_content_hash, title, acl_labels,
                  chunker_version
           FROM documents WHERE status = %s AND doc_id > %s ORDER BY doc_id LIMIT %s""",
        (status, after, limit),
    ).fetchall()
    return [PendingDocument(*r[:7], tuple(r[7]), r[8]) for r in rows]


def shard_documents(
    conn: psycopg.Connection, shard: int, shards: int, limit: int, after: str = ""
) -> list[PendingDocument]:
    """Indexed documents of one hash shard (for backfills that N workers share), in doc_id order."""
    rows = conn.execute(
        """SELECT doc_id, source, rel_path, fingerprint, content_hash, indexed_content_hash, title, acl_labels,
                  chunker_version
           FROM documents WHERE status = 'indexed' AND abs(hashtext(doc_id)) %% %s = %s AND doc_id > %s
           ORDER BY doc_id LIMIT %s""",
        (shards, shard, after, limit),
    ).fetchall()
    return [PendingDocument(*r[:7], tuple(r[7]), r[8]) for r in rows]


def requeue_for_chunker(conn: psycopg.Connection, chunker_version: str) -> int:
    """Indexed documents chunked by another chunker version go back to chunking (their text is kept)."""
    return conn.execute(
        """UPDATE documents SET status = 'pending_chunk', changed_at = now()
           WHERE status IN ('indexed', 'pending_index') AND chunker_version IS DISTINCT FROM %s""",
        (chunker_version,),
    ).rowcount


# --- parse results ---------------------------------------------------------------------------------


def replace_pages(conn: psycopg.Connection, doc_id: str, pages: Iterable[ParsedPage], parser_version: str) -> None:
    conn.execute("DELETE FROM document_pages WHERE doc_id = %s", (doc_id,))
    with conn.cursor().copy(
        "COPY document_pages (doc_id, page, tier, signals, parser_version, seconds, markdown) FROM STDIN"
    ) as copy:
        for page in pages:
            copy.write_row(
                (doc_id, page.page, page.tier, Jsonb(page.signals), parser_version, page.seconds, page.markdown)
            )


def finish_parse(
    conn: psycopg.Connection,
    doc_id: str,
    content_hash: str,
    page_count: int,
    parser_version: str,
    status: str,
    cleaning: dict[str, int],
) -> None:
    conn.execute(
        """UPDATE documents SET content_hash = %s, page_count = %s, parser_version = %s, status = %s,
                  cleaning = %s, parsed_at = now()
           WHERE doc_id = %s""",
        (content_hash, page_count, parser_version, status, Jsonb(cleaning), doc_id),
    )
    conn.execute("DELETE FROM dead_letters WHERE doc_id = %s", (doc_id,))


def dead_letter(conn: psycopg.Connection, doc_id: str, reason: str, detail: str, fingerprint: str) -> None:
    """Park a document with its reason; it is retried when its fingerprint changes. Its old rows stay out."""
    delete_derived_rows(conn, [doc_id])
    conn.execute(
        """INSERT INTO dead_letters (doc_id, reason, detail, fingerprint) VALUES (%s, %s, %s, %s)
           ON CONFLICT (doc_id) DO UPDATE SET reason = EXCLUDED.reason, detail = EXCLUDED.detail,
               fingerprint = EXCLUDED.fingerprint, attempts = dead_letters.attempts + 1, last_failed_at = now()""",
        (doc_id, reason, detail[:2000], fingerprint),
    )
    conn.execute(
        "UPDATE documents SET status = 'dead_letter', parsed_at = now() WHERE doc_id = %s", (doc_id,)
    )


def document_pages(conn: psycopg.Connection, doc_id: str) -> list[tuple[int, str]]:
    return [
        (page, markdown)
        for page, markdown in conn.execute(
            "SELECT page, markdown FROM document_pages WHERE doc_id = %s ORDER BY page", (doc_id,)
        ).fetchall()
    ]


def table_continuations(conn: psycopg.Connection, doc_id: str) -> dict[int, int]:
    """Pages whose last table runs on over page breaks -> the last page it reaches."""
    rows = conn.execute(
        """SELECT page, (signals->>'table_continues_to')::int FROM document_pages
           WHERE doc_id = %s AND signals ? 'table_continues_to'""",
        (doc_id,),
    ).fetchall()
    return dict(rows)


# --- chunks ----------------------------------------------------------------------------------------


def replace_chunks(
    conn: psycopg.Connection, doc_id: str, chunks: Sequence[Chunk], prefixes: Sequence[str], chunker_version: str
) -> None:
    conn.execute("DELETE FROM chunks WHERE doc_id = %s", (doc_id,))
    parser_version = conn.execute("SELECT parser_version FROM documents WHERE doc_id = %s", (doc_id,)).fetchone()[0]
    with conn.cursor().copy(
        """COPY chunks (chunk_id, doc_id, ordinal, text, prefix, section_path, page_start, page_end,
                        content_type, token_count, content_hash, chunker_version, parser_version, flags)
           FROM STDIN"""
    ) as copy:
        for chunk, prefix in zip(chunks, prefixes, strict=True):
            copy.write_row(
                (
                    chunk.chunk_id, doc_id, chunk.ordinal, chunk.text, prefix, chunk.section_path,
                    chunk.page_start, chunk.page_end, chunk.content_type, chunk.token_count,
                    chunk.content_hash, chunker_version, parser_version, injection_flags(chunk.text),
                )
            )
    conn.execute(
        "UPDATE documents SET status = 'pending_index', chunker_version = %s WHERE doc_id = %s",
        (chunker_version, doc_id),
    )


def cached_prefixes(conn: psycopg.Connection, doc_id: str, doc_hash: str, prompt_version: str) -> dict[str, str]:
    """LLM prefixes already paid for this document content, by chunk hash; stale ones are dropped."""
    conn.execute(
        "DELETE FROM prefix_cache WHERE doc_id = %s AND (doc_content_hash <> %s OR prompt_version <> %s)",
        (doc_id, doc_hash, prompt_version),
    )
    return dict(
        conn.execute(
            "SELECT chunk_hash, prefix FROM prefix_cache WHERE doc_id = %s AND doc_content_hash = %s"
            " AND prompt_version = %s",
            (doc_id, doc_hash, prompt_version),
        ).fetchall()
    )


def store_prefixes(
    conn: psycopg.Connection, doc_id: str, doc_hash: str, prompt_version: str, prefixes: dict[str, str]
) -> None:
    with conn.cursor() as cur:
        cur.executemany(
            """INSERT INTO prefix_cache (doc_id, doc_content_hash, chunk_hash, prompt_version, prefix)
               VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING""",
            [(doc_id, doc_hash, chunk_hash, prompt_version, text) for chunk_hash, text in prefixes.items()],
        )


@dataclass(frozen=True)
class StoredChunk:
    chunk_id: str
    doc_id: str
    ordinal: int
    text: str
    prefix: str
    section_path: str
    page_start: int
    page_end: int
    content_type: str
    group_id: str | None = None

    @property
    def embedding_input(self) -> str:
        # The prefix situates the chunk for the embedding and for BM25; the stored text stays pristine.
        return f"{self.prefix}\n{self.text}" if self.prefix else self.text


def chunks_of(conn: psycopg.Connection, doc_ids: Sequence[str]) -> dict[str, list[StoredChunk]]:
    result: dict[str, list[StoredChunk]] = {doc_id: [] for doc_id in doc_ids}
    rows = conn.execute(
        """SELECT chunk_id, doc_id, ordinal, text, prefix, section_path, page_start, page_end, content_type,
                  group_id
           FROM chunks WHERE doc_id = ANY(%s) ORDER BY doc_id, ordinal""",
        (list(doc_ids),),
    ).fetchall()
    for row in rows:
        result[row[1]].append(StoredChunk(*row))
    return result


# --- embedding cache -------------------------------------------------------------------------------


def cached_embeddings(conn: psycopg.Connection, model: str, shas: Sequence[str]) -> dict[str, np.ndarray]:
    rows = conn.execute(
        "SELECT input_sha, embedding FROM embedding_cache WHERE model = %s AND input_sha = ANY(%s)",
        (model, list(shas)),
    ).fetchall()
    return {sha: np.asarray(vec.to_numpy(), dtype=np.float32) for sha, vec in rows}


def store_embeddings(conn: psycopg.Connection, model: str, vectors: dict[str, np.ndarray]) -> None:
    with conn.cursor() as cur:
        cur.executemany(
            """INSERT INTO embedding_cache (model, input_sha, embedding) VALUES (%s, %s, %s)
               ON CONFLICT (model, input_sha) DO NOTHING""",
            [(model, sha, HalfVector(vec)) for sha, vec in vectors.items()],
        )


# --- index versions --------------------------------------------------------------------------------


@dataclass(frozen=True)
class IndexVersion:
    version_id: int
    table_name: str
    embedding_model: str
    model_revision: str | None
    dimensions: int
    chunker_version: str
    parser_version: str
    status: str
    row_count: int = 0


_VERSION_COLUMNS = sql.SQL(
    "v.version_id, v.table_name, v.embedding_model, v.model_revision, v.dimensions, v.chunker_version,"
    " v.parser_version, v.status, v.row_count"
)


def index_versions(conn: psycopg.Connection, statuses: Sequence[str] | None = None) -> list[IndexVersion]:
    query = sql.SQL(
        "SELECT {} FROM index_versions v WHERE v.dropped_at IS NULL AND (%(all)s OR v.status = ANY(%(statuses)s))"
        " ORDER BY v.version_id"
    ).format(_VERSION_COLUMNS)
    rows = conn.execute(query, {"all": statuses is None, "statuses": list(statuses or ())}).fetchall()
    return [IndexVersion(*row) for row in rows]


def active_version(conn: psycopg.Connection) -> IndexVersion | None:
    query = sql.SQL(
        "SELECT {} FROM index_alias a JOIN index_versions v USING (version_id) WHERE a.alias = %s"
    ).format(_VERSION_COLUMNS)
    row = conn.execute(query, (ACTIVE_ALIAS,)).fetchone()
    return IndexVersion(*row) if row else None


def writable_versions(conn: psycopg.Connection) -> list[IndexVersion]:
    """Versions that receive every write: the active one, any being built (or built and ready) beside it, and a previous active
    one kept (table not dropped) for rollback, so that rolling back never serves a stale index."""
    return index_versions(conn, ("active", "building", "ready", "retired"))


def create_index_version(
    conn: psycopg.Connection,
    embedding_model: str,
    model_revision: str | None,
    dimensions: int,
    chunker_version: str,
    parser_version: str,
) -> IndexVersion:
    """Register a version in status 'building' and create its chunk table with all its indexes."""
    version_id = conn.execute(
        """INSERT INTO index_versions (table_name, embedding_model, model_revision, dimensions,
                                       chunker_version, parser_version, status)
           VALUES ('pending', %s, %s, %s, %s, %s, 'building') RETURNING version_id""",
        (embedding_model, model_revision, dimensions, chunker_version, parser_version),
    ).fetchone()[0]
    table_name = f"index_v{version_id}"
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
                   embedding           halfvec({dims}) NOT NULL,
                   tsv                 tsvector GENERATED ALWAYS AS
                                         (to_tsvector('english', prefix || ' ' || text)) STORED
               )"""
        ).format(table=table, dims=sql.Literal(dimensions))
    )
    for suffix, index_sql in (
        ("hnsw", "CREATE INDEX {name} ON {table} USING hnsw (embedding halfvec_cosine_ops)"),
        ("tsv", "CREATE INDEX {name} ON {table} USING gin (tsv)"),
        ("acl", "CREATE INDEX {name} ON {table} USING gin (acl_labels)"),
        ("doc", "CREATE INDEX {name} ON {table} (doc_id, ordinal)"),
        ("ctype", "CREATE INDEX {name} ON {table} (content_type)"),
    ):
        conn.execute(sql.SQL(index_sql).format(name=sql.Identifier(f"{table_name}_{suffix}"), table=table))
    return IndexVersion(version_id, table_name, embedding_model, model_revision, dimensions, chunker_version,
                        parser_version, "building")


def activate_version(conn: psycopg.Connection, version_id: int) -> None:
    """Point the alias and the `active_chunks` view at a version, retiring the previous active one."""
    table_name = conn.execute(
        "SELECT table_name FROM index_versions WHERE version_id = %s", (version_id,)
    ).fetchone()[0]
    conn.execute(
        "UPDATE index_versions SET status = 'retired', retired_at = now() WHERE status = 'active' AND version_id <> %s",
        (version_id,),
    )
    conn.execute(
        "UPDATE index_versions SET status = 'active', promoted_at = now(), ready_at = coalesce(ready_at, now())"
        " WHERE version_id = %s",
        (version_id,),
    )
    conn.execute(
        """INSERT INTO index_alias (alias, version_id) VALUES (%s, %s)
           ON CONFLICT (alias) DO UPDATE SET version_id = EXCLUDED.version_id, updated_at = now()""",
        (ACTIVE_ALIAS, version_id),
    )
    # The view's vector type changes with the model, so it is replaced, not altered (same transaction).
    conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(sql.Identifier(ACTIVE_VIEW)))
    conn.execute(
        sql.SQL("CREATE VIEW {} AS SELECT * FROM {}").format(sql.Identifier(ACTIVE_VIEW), sql.Identifier(table_name))
    )


def ensure_active_version(
    conn: psycopg.Connection,
    embedding_model: str,
    model_revision: str | None,
    dimensions: int,
    chunker_version: str,
    parser_version: str,
) -> IndexVersion:
    """The active version, creating the first one (for the configured model) on a new database."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('rag_pipeline:index_versions'))")
    current = active_version(conn)
    if current is not None:
        return current
    version = create_index_version(
        conn, embedding_model, model_revision, dimensions, chunker_version, parser_version
    )
    activate_version(conn, version.version_id)
    return active_version(conn)  # type: ignore[return-value]


@dataclass(frozen=True)
class IndexRow:
    chunk: StoredChunk
    input_sha: str
    embedding: np.ndarray


_INSERT_ROW = """INSERT INTO {} (chunk_id, owner_chunk_id, doc_id, ordinal, text, prefix, section_path, page_start,
                                 page_end, content_type, acl_labels, embedding_input_sha, embedding)
                 VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
                 ON CONFLICT (chunk_id) DO NOTHING"""


def insert_group_rows(
    conn: psycopg.Connection, version: IndexVersion, acl_labels: Sequence[str], rows: Sequence[IndexRow]
) -> int:
    """One row per near-duplicate group: the first occurrence to arrive owns it. Returns rows inserted."""
    inserted = 0
    with conn.cursor() as cur:
        for row in rows:
            c = row.chunk
            cur.execute(
                sql.SQL(_INSERT_ROW).format(sql.Identifier(version.table_name)),
                (
                    c.group_id or c.chunk_id, c.chunk_id, c.doc_id, c.ordinal, c.text, c.prefix, c.section_path,
                    c.page_start, c.page_end, c.content_type, list(acl_labels), row.input_sha,
                    HalfVector(row.embedding),
                ),
            )
            inserted += cur.rowcount
    return inserted


def delete_document_rows(conn: psycopg.Connection, version: IndexVersion, doc_id: str) -> list[str]:
    """Delete the rows a document owns in a version; returns their group ids."""
    rows = conn.execute(
        sql.SQL("DELETE FROM {} WHERE doc_id = %s RETURNING chunk_id").format(sql.Identifier(version.table_name)),
        (doc_id,),
    ).fetchall()
    return [r[0] for r in rows]


def rowless_group_occurrences(
    conn: psycopg.Connection, version: IndexVersion, group_ids: Sequence[str]
) -> list[tuple[StoredChunk, list[str]]]:
    """For groups without a row in this version: their first live occurrence (and its document's labels)."""
    rows = conn.execute(
        sql.SQL(
            """SELECT DISTINCT ON (c.group_id) c.chunk_id, c.doc_id, c.ordinal, c.text, c.prefix, c.section_path,
                      c.page_start, c.page_end, c.content_type, c.group_id, d.acl_labels
               FROM chunks c JOIN documents d USING (doc_id)
               WHERE c.group_id = ANY(%s) AND cardinality(d.acl_labels) > 0
                 AND d.status IN ('indexed', 'pending_index')
                 AND NOT EXISTS (SELECT 1 FROM {} t WHERE t.chunk_id = c.group_id)
               ORDER BY c.group_id, c.doc_id, c.ordinal"""
        ).format(sql.Identifier(version.table_name)),
        (list(group_ids),),
    ).fetchall()
    return [(StoredChunk(*r[:10]), list(r[10])) for r in rows]


def assign_groups(
    conn: psycopg.Connection, chunks: Sequence[StoredChunk], labels: Sequence[str], params: dedup.LshParams
) -> list[StoredChunk]:
    """Put each chunk in its near-duplicate group (same ACL labels only), opening groups as needed."""
    labels_key = dedup.acl_key(labels)
    assigned: list[StoredChunk] = []
    for chunk in chunks:
        if chunk.group_id:
            row = conn.execute(
                "SELECT acl_key, lsh_params FROM chunk_groups WHERE group_id = %s", (chunk.group_id,)
            ).fetchone()
            if row == (labels_key, params.key):
                assigned.append(chunk)
                continue
        sig = dedup.signature(chunk.text)
        buckets = dedup.band_buckets(sig, params, labels_key)
        candidates = conn.execute(
            """SELECT DISTINCT g.group_id, g.signature FROM chunk_group_bands b JOIN chunk_groups g USING (group_id)
               WHERE (b.bucket, b.band) IN (SELECT * FROM unnest(%s::bigint[], %s::int[]))
                 AND g.acl_key = %s AND g.lsh_params = %s""",
            (buckets, list(range(params.bands)), labels_key, params.key),
        ).fetchall()
        scored = sorted(
            ((dedup.similarity(sig, candidate_sig), group_id) for group_id, candidate_sig in candidates),
            key=lambda item: (-item[0], item[1]),
        )
        if scored and scored[0][0] >= params.threshold:
            group_id = scored[0][1]
        else:
            # Derived from the label set too: a relabelled chunk opens a new group, never re-labels an old one
            # that other documents' chunks still belong to.
            group_id = hashlib.sha256(f"{chunk.chunk_id}|{labels_key}|{params.key}".encode()).hexdigest()[:32]
            conn.execute(
                """INSERT INTO chunk_groups (group_id, acl_key, lsh_params, signature) VALUES (%s, %s, %s, %s)
                   ON CONFLICT (group_id) DO NOTHING""",
                (group_id, labels_key, params.key, sig.tolist()),
            )
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO chunk_group_bands (bucket, band, group_id) VALUES (%s, %s, %s)"
                    " ON CONFLICT DO NOTHING",
                    [(bucket, band, group_id) for band, bucket in enumerate(buckets)],
                )
        conn.execute("UPDATE chunks SET group_id = %s WHERE chunk_id = %s", (group_id, chunk.chunk_id))
        assigned.append(replace(chunk, group_id=group_id))
    return assigned


def mark_indexed(conn: psycopg.Connection, doc_id: str) -> None:
    conn.execute(
        """UPDATE documents SET status = 'indexed', indexed_at = now(), indexed_content_hash = content_hash
           WHERE doc_id = %s""",
        (doc_id,),
    )


def claim(conn: psycopg.Connection, doc_id: str, expected_status: str, fingerprint: str | None = None) -> bool:
    """Lock a document row for this transaction if it is still in the state the work was planned for.

    A concurrent scan may have re-queued or deleted it meanwhile; then the caller drops its work and the
    document is picked up again in its new state, so no stale result is ever written over a newer one.
    """
    row = conn.execute(
        "SELECT status, fingerprint FROM documents WHERE doc_id = %s FOR UPDATE", (doc_id,)
    ).fetchone()
    return row is not None and row[0] == expected_status and (fingerprint is None or row[1] == fingerprint)


def groups_without_row(conn: psycopg.Connection, version: IndexVersion) -> int:
    """Chunk groups of indexed documents that have no row in this version (a backfill not done, a lost row)."""
    return conn.execute(
        sql.SQL(
            """SELECT count(DISTINCT c.group_id) FROM chunks c JOIN documents d USING (doc_id)
               WHERE d.status = 'indexed' AND c.group_id IS NOT NULL
                 AND NOT EXISTS (SELECT 1 FROM {} t WHERE t.chunk_id = c.group_id)"""
        ).format(sql.Identifier(version.table_name))
    ).fetchone()[0]


def refresh_version_stats(conn: psycopg.Connection, version: IndexVersion) -> int:
    count = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(version.table_name))).fetchone()[0]
    conn.execute("UPDATE index_versions SET row_count = %s WHERE version_id = %s", (count, version.version_id))
    return int(count)


# --- reporting -------------------------------------------------------------------------------------


def status_counts(conn: psycopg.Connection) -> dict[str, int]:
    return dict(conn.execute("SELECT status, count(*) FROM documents GROUP BY status").fetchall())


def dead_letter_summary(conn: psycopg.Connection) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT d.source, d.rel_path, l.reason, l.detail, l.attempts
               FROM dead_letters l JOIN documents d USING (doc_id) ORDER BY d.source, d.rel_path"""
        ).fetchall()


def held_documents(conn: psycopg.Connection) -> list[tuple[str, str]]:
    return conn.execute(
        "SELECT source, rel_path FROM documents WHERE status = 'held_no_labels' ORDER BY source, rel_path"
    ).fetchall()
