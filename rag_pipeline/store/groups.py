"""Near-duplicate groups and their LSH bands. Which group a chunk joins is decided in rag_pipeline.text.dedup."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import psycopg
from psycopg import sql

from rag_pipeline.domain.status import DocumentStatus

_ASSIGNMENT_LOCK = "rag_pipeline.group_assignment"


def lock_assignment(conn: psycopg.Connection) -> None:
    """Serialise the transactions that change documents' index state, until the transaction ends.

    Two workers writing near-duplicates at once would otherwise both find no group and open two (neither sees the
    other's new group), and a writer could give a group's row to a document whose labels a scan is narrowing. Every
    such transaction (an index write, a chunk write, a dead letter, a scan of a source, a requeue) takes this lock
    *first*, before any document row lock: one order everywhere, so they never deadlock. Parsing, chunking and
    embedding run outside these transactions, in parallel; only the writes take turns."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (_ASSIGNMENT_LOCK,))


def drop_empty(conn: psycopg.Connection, group_ids: Sequence[str]) -> None:
    conn.execute(
        """DELETE FROM chunk_groups g WHERE g.group_id = ANY(%s)
             AND NOT EXISTS (SELECT 1 FROM chunks c WHERE c.group_id = g.group_id)""",
        (list(group_ids),),
    )


def group_keys(conn: psycopg.Connection, group_ids: Sequence[str]) -> dict[str, tuple[str, str]]:
    """(ACL key, LSH parameters) each group was opened with; a group that no longer exists is left out."""
    if not group_ids:
        return {}  # a document written for the first time: no query
    rows = conn.execute(
        "SELECT group_id, acl_key, lsh_params FROM chunk_groups WHERE group_id = ANY(%s)", (list(group_ids),)
    ).fetchall()
    return {group_id: (acl_key, lsh_params) for group_id, acl_key, lsh_params in rows}


def candidates(
    conn: psycopg.Connection, buckets_by_chunk: Sequence[Sequence[int]], labels_key: str, params_key: str
) -> list[list[tuple[str, list[int]]]]:
    """For each chunk (its LSH band buckets, band by band), the groups (id, MinHash signature) sharing at least one
    band bucket with it: one query for all of a document's chunks."""
    positions = [p for p, buckets in enumerate(buckets_by_chunk) for _ in buckets]
    rows = conn.execute(
        """SELECT q.position, g.group_id, g.signature
           FROM (SELECT DISTINCT q.position, b.group_id
                 FROM unnest(%s::int[], %s::bigint[], %s::int[]) AS q (position, bucket, band)
                 JOIN chunk_group_bands b ON b.bucket = q.bucket AND b.band = q.band) q
           JOIN chunk_groups g USING (group_id)
           WHERE g.acl_key = %s AND g.lsh_params = %s""",
        (positions, [bucket for buckets in buckets_by_chunk for bucket in buckets],
         [band for buckets in buckets_by_chunk for band in range(len(buckets))], labels_key, params_key),
    ).fetchall()
    found: list[list[tuple[str, list[int]]]] = [[] for _ in buckets_by_chunk]
    for position, group_id, signature in rows:
        found[position].append((group_id, signature))
    return found


def open_groups(
    conn: psycopg.Connection, labels_key: str, params_key: str,
    groups: Sequence[tuple[str, np.ndarray, Sequence[int]]],
) -> None:
    """Record new groups (id, MinHash signature, LSH band buckets) and their bands."""
    if not groups:
        return
    with conn.cursor() as cur:
        cur.executemany(  # pipelined: one round trip
            """INSERT INTO chunk_groups (group_id, acl_key, lsh_params, signature) VALUES (%s, %s, %s, %s)
               ON CONFLICT (group_id) DO NOTHING""",
            [(group_id, labels_key, params_key, signature.tolist()) for group_id, signature, _ in groups],
        )
    # One statement for all bands (a chunk has dozens): a statement per band was most of an index write's time.
    conn.execute(
        """INSERT INTO chunk_group_bands (bucket, band, group_id)
           SELECT * FROM unnest(%s::bigint[], %s::int[], %s::text[])
           ON CONFLICT DO NOTHING""",
        ([bucket for _, _, buckets in groups for bucket in buckets],
         [band for _, _, buckets in groups for band in range(len(buckets))],
         [group_id for group_id, _, buckets in groups for _ in buckets]),
    )


# --- groups that follow labels -----------------------------------------------------------------------

# rag_pipeline.text.dedup.acl_key in SQL: the distinct labels in code point order (UTF-8 bytes under "C"), joined
# by U+001F. Computed once per distinct label set, not per chunk.
_LABEL_SETS = """label_sets AS MATERIALIZED (
    SELECT s.labels, array_to_string(ARRAY(SELECT DISTINCT l COLLATE "C" FROM unnest(s.labels) AS l ORDER BY 1),
                                     chr(31)) AS acl_key
    FROM (SELECT DISTINCT acl_labels AS labels FROM documents WHERE status = %(indexed)s) s)"""

# Chunks of indexed documents outside a group of their document's label set (in none, or in another set's).
_MISGROUPED = sql.SQL("""WITH """ + _LABEL_SETS + """
    SELECT c.doc_id FROM chunks c JOIN documents d USING (doc_id) JOIN label_sets k ON k.labels = d.acl_labels
    LEFT JOIN chunk_groups g ON g.group_id = c.group_id
    WHERE d.status = %(indexed)s AND g.acl_key IS DISTINCT FROM k.acl_key""")


def in_other_groups(conn: psycopg.Connection, doc_id: str, labels_key: str) -> bool:
    """Whether any chunk of the document is outside a group keyed `labels_key` (its labels changed since it was
    grouped, or it was re-chunked and never indexed): its rows cannot be kept as they are."""
    return conn.execute(
        """SELECT EXISTS (SELECT 1 FROM chunks c LEFT JOIN chunk_groups g ON g.group_id = c.group_id
                          WHERE c.doc_id = %s AND g.acl_key IS DISTINCT FROM %s)""",
        (doc_id, labels_key),
    ).fetchone()[0]


def misgrouped_chunks(conn: psycopg.Connection) -> int:
    """Chunks of indexed documents whose group is not of their document's label set (index_drift)."""
    return conn.execute(sql.SQL("SELECT count(*) FROM ({}) m").format(_MISGROUPED),
                        {"indexed": DocumentStatus.INDEXED}).fetchone()[0]


def requeue_misindexed(conn: psycopg.Connection, row_tables: Sequence[str], complete_tables: Sequence[str]) -> int:
    """Send back to indexing every indexed document whose index state the index_drift check would fail: a chunk
    outside its label set's group, a row in `row_tables` its chunk no longer backs, or a chunk whose group has no
    row in one of `complete_tables` (versions that must hold every group). The index stage then regroups it and
    rewrites its rows in every version, and the groups it leaves get rows of their own (vectors from the cache).
    Inside the caller's transaction, which holds the assignment lock. Returns how many documents."""
    parts: list[sql.Composable] = [_MISGROUPED]
    for table in row_tables:
        parts.append(sql.SQL(
            """SELECT t.doc_id FROM {} t
               WHERE NOT EXISTS (SELECT 1 FROM chunks c WHERE c.chunk_id = t.owner_chunk_id AND c.doc_id = t.doc_id
                                   AND coalesce(c.group_id, c.chunk_id) = t.chunk_id)""").format(sql.Identifier(table)))
    for table in complete_tables:
        parts.append(sql.SQL(
            """SELECT c.doc_id FROM chunks c
               WHERE c.group_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {} t WHERE t.chunk_id = c.group_id)"""
        ).format(sql.Identifier(table)))
    return conn.execute(
        # changed_at: queued now, for staleness (an old one would read as a change waiting for weeks)
        sql.SQL("""UPDATE documents SET status = %(pending_index)s, changed_at = now()
                   WHERE status = %(indexed)s AND doc_id IN ({})""").format(
            sql.SQL(" UNION ").join(sql.SQL("({})").format(part) for part in parts)),
        {"indexed": DocumentStatus.INDEXED, "pending_index": DocumentStatus.PENDING_INDEX},
    ).rowcount
