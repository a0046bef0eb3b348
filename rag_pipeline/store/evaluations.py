"""Golden-set evaluations of index versions (the retrieval_quality check) and their baselines."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from rag_pipeline.store.versions import IndexVersion, row_count

Metrics = dict[str, dict[str, float]]


@dataclass(frozen=True)
class Evaluation:
    metrics: Metrics
    per_question: list[dict[str, Any]] | None  # None: recorded before per-question results were kept


def index_state(conn: psycopg.Connection, version: IndexVersion) -> str:
    """Changes whenever what a search could return changes: rows, indexing, deletions, labels."""
    indexed, seen, deleted = conn.execute(
        """SELECT (SELECT max(indexed_at) FROM documents), (SELECT max(last_seen) FROM documents),
                  (SELECT max(id) FROM deletion_log)"""
    ).fetchone()
    return f"{version.label}|{row_count(conn, version)}|{indexed}|{seen}|{deleted}"


def cached(conn: psycopg.Connection, version_id: int, golden_sha: str, state: str) -> Evaluation | None:
    row = conn.execute(
        """SELECT metrics, per_question FROM retrieval_evaluations
           WHERE version_id = %s AND golden_sha = %s AND index_state = %s ORDER BY id DESC LIMIT 1""",
        (version_id, golden_sha, state),
    ).fetchone()
    return Evaluation(*row) if row else None


def record(
    conn: psycopg.Connection, version_id: int, golden_sha: str, k: int, state: str, evaluation: Evaluation
) -> None:
    conn.execute(
        """INSERT INTO retrieval_evaluations (version_id, golden_sha, k, index_state, metrics, per_question)
           VALUES (%s, %s, %s, %s, %s, %s)""",
        (version_id, golden_sha, k, state, Jsonb(evaluation.metrics), Jsonb(evaluation.per_question)),
    )


def baseline(conn: psycopg.Connection, version_id: int, golden_sha: str) -> Evaluation | None:
    row = conn.execute(
        """SELECT metrics, per_question FROM retrieval_evaluations
           WHERE version_id = %s AND golden_sha = %s AND is_baseline""",
        (version_id, golden_sha),
    ).fetchone()
    return Evaluation(*row) if row else None


def set_baseline(conn: psycopg.Connection, version_id: int, golden_sha: str) -> bool:
    """Make the latest evaluation of a version its baseline (after an intended change). False: none yet."""
    latest = conn.execute(
        "SELECT id FROM retrieval_evaluations WHERE version_id = %s AND golden_sha = %s ORDER BY id DESC LIMIT 1",
        (version_id, golden_sha),
    ).fetchone()
    if latest is None:
        return False
    conn.execute(
        "UPDATE retrieval_evaluations SET is_baseline = false WHERE version_id = %s AND golden_sha = %s AND is_baseline",
        (version_id, golden_sha),
    )
    conn.execute("UPDATE retrieval_evaluations SET is_baseline = true WHERE id = %s", (latest[0],))
    return True
