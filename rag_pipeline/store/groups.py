"""Near-duplicate groups and their LSH bands. Which group a chunk joins is decided in rag_pipeline.text.dedup."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import psycopg

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


def group_key(conn: psycopg.Connection, group_id: str) -> tuple[str, str] | None:
    """(ACL key, LSH parameters) a group was opened with, or None when it no longer exists."""
    return conn.execute(
        "SELECT acl_key, lsh_params FROM chunk_groups WHERE group_id = %s", (group_id,)
    ).fetchone()


def candidates(
    conn: psycopg.Connection, buckets: Sequence[int], labels_key: str, params_key: str
) -> list[tuple[str, list[int]]]:
    """Groups (id, MinHash signature) that share at least one LSH band bucket with a chunk."""
    return conn.execute(
        """SELECT DISTINCT g.group_id, g.signature FROM chunk_group_bands b JOIN chunk_groups g USING (group_id)
           WHERE (b.bucket, b.band) IN (SELECT * FROM unnest(%s::bigint[], %s::int[]))
             AND g.acl_key = %s AND g.lsh_params = %s""",
        (list(buckets), list(range(len(buckets))), labels_key, params_key),
    ).fetchall()


def open_group(
    conn: psycopg.Connection,
    group_id: str,
    labels_key: str,
    params_key: str,
    signature: np.ndarray,
    buckets: Sequence[int],
) -> None:
    conn.execute(
        """INSERT INTO chunk_groups (group_id, acl_key, lsh_params, signature) VALUES (%s, %s, %s, %s)
           ON CONFLICT (group_id) DO NOTHING""",
        (group_id, labels_key, params_key, signature.tolist()),
    )
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO chunk_group_bands (bucket, band, group_id) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
            [(bucket, band, group_id) for band, bucket in enumerate(buckets)],
        )
