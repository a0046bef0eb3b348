"""The queries behind the six checks (rag_pipeline.lifecycle.checks decides what passes): they read, except
`record_check`, which keeps each check's latest outcome."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from rag_pipeline.domain.status import DOCUMENT_HELD, DOCUMENT_QUEUED, DocumentStatus
from rag_pipeline.store.versions import ACTIVE_ALIAS, IndexVersion, index_versions

D = DocumentStatus
# Tables keyed by document, besides the per-version index tables. Groups emptied by a deletion are
# checked separately: their occurrences are gone, so they no longer name a document.
DOCUMENT_TABLES = ("chunks", "document_pages", "prefix_cache", "picture_descriptions", "dead_letters")
# A document that came back to its source (same source and path) is live again, not deleted.
_DELETED_DOCUMENTS = sql.SQL(
    """SELECT DISTINCT ON (l.doc_id) l.doc_id, l.source, l.rel_path, l.deleted_at
       FROM deletion_log l WHERE NOT EXISTS (SELECT 1 FROM documents d WHERE d.doc_id = l.doc_id)
       ORDER BY l.doc_id, l.deleted_at DESC"""
)


def table_exists(conn: psycopg.Connection, table_name: str) -> bool:
    return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table_name,)).fetchone()[0]


# --- staleness -------------------------------------------------------------------------------------


def source_freshness(conn: psycopg.Connection, now: datetime
                     ) -> list[tuple[str, int, Any, Any, int, int, Any, Any]]:
    """Per registered source: SLA, seconds since the last completed scan, age of the oldest queued change,
    how many changes are queued, the deletions its latest scan held back (with why), and why its latest scan
    failed (None: it did not)."""
    return conn.execute(
        """SELECT s.name, s.freshness_sla_seconds,
                  extract(epoch FROM %(now)s - s.last_scan_completed_at),
                  extract(epoch FROM %(now)s - min(d.changed_at)),
                  count(d.doc_id), coalesce(latest.deletions_held, 0), latest.held_reason, s.last_scan_failure
           FROM sources s
           LEFT JOIN documents d ON d.source = s.name AND d.status = ANY(%(queued)s)
           LEFT JOIN LATERAL (SELECT deletions_held, held_reason FROM source_scans
                              WHERE source = s.name ORDER BY id DESC LIMIT 1) latest ON true
           GROUP BY s.name, latest.deletions_held, latest.held_reason ORDER BY s.name""",
        {"now": now, "queued": list(DOCUMENT_QUEUED)},
    ).fetchall()


# --- deletion replay -------------------------------------------------------------------------------


def rows_of_deleted_documents(conn: psycopg.Connection) -> list[tuple[str, str, str, datetime, str, int]]:
    """(doc_id, source, path, deleted_at, where, rows) for every row a deleted document still has, in the
    document tables and every version table that exists."""
    places = [sql.SQL("SELECT {label} AS place, doc_id FROM {table}").format(
        label=sql.Literal(name), table=sql.Identifier(name)) for name in DOCUMENT_TABLES]
    for version in index_versions(conn):
        if table_exists(conn, version.table_name):
            places.append(sql.SQL("SELECT {label} AS place, doc_id FROM {table}").format(
                label=sql.Literal(f"{version.table_name} ({version.status})"),
                table=sql.Identifier(version.table_name)))
    return conn.execute(
        sql.SQL(
            """WITH deleted AS ({deleted})
               SELECT x.doc_id, g.source, g.rel_path, g.deleted_at, x.place, count(*)
               FROM ({places}) x JOIN deleted g USING (doc_id)
               GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 5"""
        ).format(deleted=_DELETED_DOCUMENTS, places=sql.SQL(" UNION ALL ").join(places))
    ).fetchall()


def deleted_document_count(conn: psycopg.Connection) -> int:
    return conn.execute(sql.SQL("SELECT count(*) FROM ({}) g").format(_DELETED_DOCUMENTS)).fetchone()[0]


def empty_group_count(conn: psycopg.Connection) -> int:
    return conn.execute(
        "SELECT count(*) FROM chunk_groups g WHERE NOT EXISTS (SELECT 1 FROM chunks c WHERE c.group_id = g.group_id)"
    ).fetchone()[0]


# --- ACL coverage ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LabelCounts:
    unlabelled: int  # rows without labels
    mismatched: int  # rows whose labels differ from their document's
    held: int  # rows of documents held back for missing labels
    guarded: bool  # the table refuses unlabelled rows in its schema


def label_counts(conn: psycopg.Connection, version: IndexVersion) -> LabelCounts:
    unlabelled, mismatched, held = conn.execute(
        sql.SQL(
            """SELECT count(*) FILTER (WHERE cardinality(t.acl_labels) = 0),
                      count(*) FILTER (WHERE d.acl_labels IS DISTINCT FROM t.acl_labels),
                      count(*) FILTER (WHERE d.status = ANY(%s))
               FROM {} t LEFT JOIN documents d USING (doc_id)"""
        ).format(sql.Identifier(version.table_name)),
        (list(DOCUMENT_HELD),),
    ).fetchone()
    guarded = conn.execute(
        """SELECT count(*) > 0 FROM pg_constraint
           WHERE conrelid = to_regclass(%s) AND contype = 'c'
             AND pg_get_constraintdef(oid) LIKE '%%cardinality(acl_labels) > 0%%'""",
        (version.table_name,),
    ).fetchone()[0]
    return LabelCounts(unlabelled, mismatched, held, guarded)


def unlabelled_documents_queued(conn: psycopg.Connection) -> int:
    return conn.execute(
        "SELECT count(*) FROM documents WHERE cardinality(acl_labels) = 0 AND NOT status = ANY(%s)",
        (list(DOCUMENT_HELD),)
    ).fetchone()[0]


# --- index drift -----------------------------------------------------------------------------------


def vector_column_type(conn: psycopg.Connection, version: IndexVersion) -> str | None:
    row = conn.execute(
        """SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
           WHERE a.attrelid = to_regclass(%s) AND a.attname = 'embedding' AND NOT a.attisdropped""",
        (version.table_name,),
    ).fetchone()
    return row[0] if row else None


def foreign_vectors(conn: psycopg.Connection, version: IndexVersion) -> int:
    """Rows whose vector differs from what the version's model gave for the same input (embedding cache; a version
    whose model identity is not recorded yet still has its cache rows under its name)."""
    return conn.execute(
        sql.SQL(
            """SELECT count(*) FROM {} t JOIN embedding_cache c
                   ON c.model = %s AND c.input_sha = t.embedding_input_sha
               WHERE (t.embedding <=> c.embedding) > 0.001"""
        ).format(sql.Identifier(version.table_name)),
        (version.model_identity or version.embedding_model,),
    ).fetchone()[0]


def orphan_rows(conn: psycopg.Connection, version: IndexVersion) -> int:
    """Rows whose owning chunk (in its group, of its document) no longer exists."""
    return conn.execute(
        sql.SQL(
            """SELECT count(*) FROM {} t
               WHERE NOT EXISTS (SELECT 1 FROM chunks c
                                 WHERE c.chunk_id = t.owner_chunk_id AND c.doc_id = t.doc_id
                                   AND coalesce(c.group_id, c.chunk_id) = t.chunk_id)"""
        ).format(sql.Identifier(version.table_name))
    ).fetchone()[0]


@dataclass(frozen=True)
class AliasTarget:
    version_id: int
    status: str
    dropped: bool
    table_name: str


def alias_target(conn: psycopg.Connection) -> AliasTarget | None:
    row = conn.execute(
        """SELECT a.version_id, v.status, v.dropped_at IS NOT NULL, v.table_name
           FROM index_alias a JOIN index_versions v USING (version_id) WHERE a.alias = %s""",
        (ACTIVE_ALIAS,),
    ).fetchone()
    return AliasTarget(*row) if row else None


# --- parse health ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParseCounts:
    pages: int
    near_empty_pages: int
    zero_text_documents: list[tuple[str, str, int]]  # source, path, pages
    tiers: list[tuple[str, int]]
    dead_letters: list[tuple[str, int]]  # reason, documents
    live_documents: int
    flagged_chunks: list[tuple[str, str, int, str]]  # source, path, ordinal, patterns
    # pages whose text layer set words apart by gaps alone, or printed glyphs twice (rag_pipeline.parsing.word_gaps)
    spaced_pages: int = 0
    overprinted_pages: int = 0


def parse_counts(conn: psycopg.Connection, near_empty_chars: int) -> ParseCounts:
    pages, near_empty, spaced, overprinted = conn.execute(
        """SELECT count(*), count(*) FILTER (WHERE p.text_chars < %s),
                  count(*) FILTER (WHERE (p.signals ->> 'word_gaps_spaced')::int > 0),
                  count(*) FILTER (WHERE (p.signals ->> 'overprinted_glyphs')::int > 0)
           FROM document_pages p JOIN documents d USING (doc_id) WHERE d.status <> %s""",
        (near_empty_chars, D.DEAD_LETTER),
    ).fetchone()
    # Only a document with a page without text can have none: those few are read (document_pages_textless).
    zero_text = conn.execute(
        """SELECT d.source, d.rel_path, count(*) FROM documents d JOIN document_pages p USING (doc_id)
           WHERE d.status <> %s AND d.doc_id IN (SELECT doc_id FROM document_pages WHERE text_chars = 0)
           GROUP BY d.doc_id HAVING max(p.text_chars) = 0 ORDER BY 1, 2""",
        (D.DEAD_LETTER,),
    ).fetchall()
    tiers = conn.execute("SELECT tier, count(*) FROM document_pages GROUP BY tier ORDER BY count(*) DESC").fetchall()
    dead = conn.execute(
        "SELECT reason, count(*) FROM dead_letters GROUP BY reason ORDER BY count(*) DESC, reason"
    ).fetchall()
    live = conn.execute("SELECT count(*) FROM documents WHERE NOT status = ANY(%s)", (list(DOCUMENT_HELD),)
                        ).fetchone()[0]
    flagged = conn.execute(
        """SELECT d.source, d.rel_path, c.ordinal, array_to_string(c.flags, ', ')
           FROM chunks c JOIN documents d USING (doc_id) WHERE cardinality(c.flags) > 0
           ORDER BY d.source, d.rel_path, c.ordinal"""
    ).fetchall()
    return ParseCounts(pages, near_empty, zero_text, tiers, dead, live, flagged, spaced, overprinted)


# --- the latest check outcomes ----------------------------------------------------------------------------------


def record_check(conn: psycopg.Connection, name: str, passed: bool, summary: str) -> None:
    conn.execute(
        """INSERT INTO check_results (check_name, passed, summary) VALUES (%s, %s, %s)
           ON CONFLICT (check_name) DO UPDATE SET passed = EXCLUDED.passed, summary = EXCLUDED.summary,
                                                  checked_at = now()""",
        (name, passed, summary),
    )


def latest_checks(conn: psycopg.Connection) -> list[tuple[str, bool, str, Any]]:
    """(name, passed, summary, checked_at) of every check that has run, by name."""
    return conn.execute("SELECT check_name, passed, summary, checked_at FROM check_results ORDER BY check_name"
                        ).fetchall()


# --- the index's totals --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IndexTotals:
    counts: dict[str, int]  # documents, documents_indexed, documents_queued, documents_held, dead_letters, pages,
    #                         chunks, vectors (rows of the active version)
    pages_by_tier: dict[str, int]


def index_totals(conn: psycopg.Connection) -> IndexTotals:
    row = conn.execute(
        """SELECT count(*),
                  count(*) FILTER (WHERE status = %(indexed)s),
                  count(*) FILTER (WHERE status = ANY(%(queued)s)),
                  count(*) FILTER (WHERE status = ANY(%(held)s)),
                  count(*) FILTER (WHERE status = %(dead)s),
                  (SELECT count(*) FROM document_pages),
                  (SELECT count(*) FROM chunks),
                  (SELECT coalesce(max(v.row_count), 0) FROM index_alias a JOIN index_versions v USING (version_id)
                   WHERE a.alias = %(alias)s)
           FROM documents""",
        {"indexed": DocumentStatus.INDEXED, "queued": list(DOCUMENT_QUEUED), "held": list(DOCUMENT_HELD),
         "dead": DocumentStatus.DEAD_LETTER, "alias": ACTIVE_ALIAS},
    ).fetchone()
    names = ("documents", "documents_indexed", "documents_queued", "documents_held", "dead_letters", "pages",
             "chunks", "vectors")
    tiers = dict(conn.execute("SELECT tier, count(*) FROM document_pages GROUP BY tier").fetchall())
    return IndexTotals(dict(zip(names, (int(v) for v in row), strict=True)), {t: int(n) for t, n in tiers.items()})
