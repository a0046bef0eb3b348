"""SQL of erasure on request: every row of some documents, in every table and index version, and the embedding
cache entries nothing uses any more."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from rag_pipeline.domain import ids as ids_module
from rag_pipeline.domain.erasure import ErasureError
from rag_pipeline.domain.status import DOCUMENT_HELD, DocumentStatus
from rag_pipeline.store import scans, versions
from rag_pipeline.store.health import table_exists

# Tables keyed by doc_id that outlive or sit beside the documents row (chunks and pages go with it).
_BY_DOC_ID = ("dead_letters", "prefix_cache", "picture_descriptions", "chunks", "document_pages", "deletion_log",
              "document_embedding_inputs")


# A name is the same name whatever its Unicode normalisation (`café` typed as NFC, stored as NFD by a Mac): erasing
# by a name erases every spelling of it (canonical equivalence, NFC; not NFKC, which would merge `ﬁ` with `fi`).
_SAME_NAME = sql.SQL(" AND normalize(rel_path, NFC) = normalize(%(path)s, NFC)")


def documents_of(conn: psycopg.Connection, source: str, rel_path: str | None) -> list[tuple[str, str]]:
    """(id, path) of every document at source:rel_path in any Unicode normalisation (or of every document of the
    source), live or deleted."""
    where = sql.SQL("source = %(source)s") + (sql.SQL("") if rel_path is None else _SAME_NAME)
    query = sql.SQL("""SELECT doc_id, rel_path FROM documents WHERE {where}
                       UNION SELECT doc_id, rel_path FROM deletion_log WHERE {where}""").format(where=where)
    return [(r[0], r[1]) for r in conn.execute(query, {"source": source, "path": rel_path}).fetchall()]


def held_erased(conn: psycopg.Connection, source: str, rel_path: str | None) -> list[str]:
    """Ids of the documents of the source (at rel_path in any normalisation) held because they were erased."""
    query = sql.SQL("SELECT doc_id FROM documents WHERE source = %(source)s AND status = %(held)s{}").format(
        sql.SQL("") if rel_path is None else _SAME_NAME)
    return [r[0] for r in conn.execute(query, {"source": source, "path": rel_path,
                                               "held": DocumentStatus.HELD_ERASED.value}).fetchall()]


def refs_of_ids(conn: psycopg.Connection, doc_ids: Sequence[str]) -> dict[str, int]:
    return dict(conn.execute("SELECT doc_id, ref FROM documents WHERE doc_id = ANY(%s)", (list(doc_ids),)).fetchall())


def held_erased_count(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT count(*) FROM documents WHERE status = %s",
                        (DocumentStatus.HELD_ERASED.value,)).fetchone()[0]


def known_ids(conn: psycopg.Connection, source: str) -> set[str]:
    """Ids of the source's documents that are not held (a held one may be an erased one, back)."""
    return {r[0] for r in conn.execute("SELECT doc_id FROM documents WHERE source = %s AND NOT status = ANY(%s)",
                                       (source, list(DOCUMENT_HELD))).fetchall()}


def refresh_statistics(conn: psycopg.Connection) -> list[str]:
    """ANALYZE every table that holds (or held) documents' paths, text or rows: the planner's statistics
    (pg_stats) keep sampled values, erased ones included, until the next ANALYZE. In the erasing transaction, the
    rows it deleted are not sampled. Returns the tables analysed."""
    tables = ["documents", *_BY_DOC_ID, "embedding_cache", "sources", "erasures"]
    tables += [v.table_name for v in versions.index_versions(conn) if table_exists(conn, v.table_name)]
    # ANALYZE of a table the role may not maintain is skipped with a mere WARNING: pg_stats would keep what was
    # erased while the erasure reported success. Refused instead (the erasure's transaction rolls back).
    refused = [r[0] for r in conn.execute(
        """SELECT c.relname FROM unnest(%s::text[]) AS t(name) JOIN pg_class c ON c.oid = to_regclass(t.name)
           WHERE NOT pg_has_role(c.relowner, 'USAGE')
             AND NOT CASE WHEN current_setting('server_version_num')::int >= 170000
                          THEN has_table_privilege(c.oid, 'MAINTAIN') ELSE false END""",
        (tables,)).fetchall()]
    if refused:
        raise ErasureError(f"this database role may not ANALYZE {', '.join(refused)}, so the planner's statistics "
                              "would keep samples of what is erased: run erase as the tables' owner (or grant it "
                              "MAINTAIN); nothing was erased")
    for table in tables:
        conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))
    return tables


def erase_documents(conn: psycopg.Connection, doc_ids: Sequence[str]) -> tuple[dict[str, int], list[str]]:
    """Remove every row of these documents; returns rows removed per table and the embedding inputs their
    index rows used (candidates for the cache collection). Run it inside a transaction, under the index
    write lock."""
    ids = list(doc_ids)
    removed: dict[str, int] = {}
    input_shas: set[str] = set()
    touched_groups = [r[0] for r in conn.execute(
        "SELECT DISTINCT group_id FROM chunks WHERE doc_id = ANY(%s) AND group_id IS NOT NULL", (ids,)).fetchall()]
    # Chunks not in any version yet (queued for indexing) may have cache entries too: their inputs count.
    input_shas.update(ids_module.embedding_input_sha(f"{prefix}\n{text}" if prefix else text)
                      for prefix, text in conn.execute("SELECT prefix, text FROM chunks WHERE doc_id = ANY(%s)",
                                                       (ids,)).fetchall())
    # A document held back or dead-lettered before its erasure has no rows left, but its inputs were remembered.
    input_shas.update(r[0] for r in conn.execute(
        "SELECT input_sha FROM document_embedding_inputs WHERE doc_id = ANY(%s)", (ids,)).fetchall())
    for version in versions.index_versions(conn):
        if not table_exists(conn, version.table_name):
            continue
        table = sql.Identifier(version.table_name)
        shas = conn.execute(sql.SQL("DELETE FROM {} WHERE doc_id = ANY(%s) RETURNING embedding_input_sha").format(
            table), (ids,)).fetchall()
        removed[version.table_name] = len(shas)
        input_shas.update(r[0] for r in shas)
    for table_name in _BY_DOC_ID:
        removed[table_name] = conn.execute(
            sql.SQL("DELETE FROM {} WHERE doc_id = ANY(%s)").format(sql.Identifier(table_name)), (ids,)).rowcount
    removed["documents"] = conn.execute("DELETE FROM documents WHERE doc_id = ANY(%s)", (ids,)).rowcount
    # Near-duplicates of an erased document that it answered for get rows of their own (from the cache).
    scans.repair_groups(conn, touched_groups)
    return removed, sorted(input_shas)


def collect_embedding_cache(conn: psycopg.Connection, input_shas: Sequence[str] | None = None,
                            older_than_seconds: float = 0) -> int:
    """Delete cache entries no row of any index version uses (previous versions kept for rollback included):
    the given ones at once, or every such entry older than the grace period."""
    tables = [v.table_name for v in versions.index_versions(conn) if table_exists(conn, v.table_name)]
    used = sql.SQL(" UNION ALL ").join(
        sql.SQL("SELECT embedding_input_sha FROM {}").format(sql.Identifier(t)) for t in tables
    ) if tables else sql.SQL("SELECT NULL::text WHERE false")
    condition = (sql.SQL("c.input_sha = ANY(%(shas)s)") if input_shas is not None
                 else sql.SQL("c.created_at < now() - make_interval(secs => %(grace)s)"))
    return conn.execute(
        sql.SQL("""DELETE FROM embedding_cache c WHERE {condition}
                   AND NOT EXISTS (SELECT 1 FROM ({used}) u WHERE u.embedding_input_sha = c.input_sha)""").format(
            condition=condition, used=used),
        {"shas": list(input_shas or []), "grace": older_than_seconds},
    ).rowcount


def unregister_source(conn: psycopg.Connection, source: str) -> int:
    """Forget a source (and its scan history): a command-line source is then no longer refreshed."""
    return conn.execute("DELETE FROM sources WHERE name = %s", (source,)).rowcount


def record_erasures(conn: psycopg.Connection, subjects: Sequence[str], scope: str, removed: dict[str, Any]) -> None:
    with conn.cursor() as cursor:
        cursor.executemany("INSERT INTO erasures (subject, scope, removed) VALUES (%s, %s, %s)",
                           [(subject, scope, Jsonb(removed)) for subject in subjects])


def erased_subjects(conn: psycopg.Connection) -> set[str]:
    """Subjects erased and not re-admitted since (a 'readmit' row after their latest erasure)."""
    return {r[0] for r in conn.execute(
        """SELECT subject FROM (SELECT DISTINCT ON (subject) subject, scope FROM erasures ORDER BY subject, id DESC) s
           WHERE scope <> 'readmit'""").fetchall()}


def ids_anywhere(conn: psycopg.Connection) -> set[str]:
    """Every doc_id that has a row in any document table or index version; a document held as erased (its row,
    and the embedding inputs it is remembered by) is not counted: holding it is what erasure asks for."""
    held = sql.SQL("(SELECT doc_id FROM documents WHERE status = {})").format(
        sql.Literal(DocumentStatus.HELD_ERASED.value))
    parts = [sql.SQL("SELECT doc_id FROM {} WHERE doc_id NOT IN {}").format(sql.Identifier(t), held)
             if t in ("documents", "document_embedding_inputs") else
             sql.SQL("SELECT doc_id FROM {}").format(sql.Identifier(t))
             for t in ("documents", *_BY_DOC_ID)]
    parts += [sql.SQL("SELECT doc_id FROM {}").format(sql.Identifier(v.table_name))
              for v in versions.index_versions(conn) if table_exists(conn, v.table_name)]
    return {r[0] for r in conn.execute(sql.SQL(" UNION ").join(parts)).fetchall()}


def prune_deletion_log(conn: psycopg.Connection, older_than_seconds: float) -> int:
    """Forget the paths of documents deleted longer ago than the retention, and the remembered embedding inputs
    of documents gone as long (their cache entries are collected by then)."""
    conn.execute("""DELETE FROM document_embedding_inputs i WHERE recorded_at < now() - make_interval(secs => %s)
                    AND NOT EXISTS (SELECT 1 FROM documents d WHERE d.doc_id = i.doc_id)""", (older_than_seconds,))
    return conn.execute("DELETE FROM deletion_log WHERE deleted_at < now() - make_interval(secs => %s)",
                        (older_than_seconds,)).rowcount
