"""Index-version lifecycle (blue/green): build beside the active version, check, promote, roll back, retire.

Promotion is one transaction that moves the alias (and the `active_chunks` view); it refuses unless the
candidate is complete (every indexed document's groups have a row), has no row of a document deleted since
the build began (deletion replay), and — when a golden set is given — does not score worse than the active
version beyond a tolerance. `force` skips the gates and is recorded.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from rag_pipeline import store
from rag_pipeline.evaluation import evaluate, load_golden


class VersionError(RuntimeError):
    """A lifecycle step that is not allowed now (the message says why)."""


def _version(conn: psycopg.Connection, version_id: int) -> store.IndexVersion:
    version = next((v for v in store.index_versions(conn) if v.version_id == version_id), None)
    if version is None:
        raise VersionError(f"no index version {version_id}")
    return version


def record(conn: psycopg.Connection, version_id: int, event: str, forced: bool = False, **detail: Any) -> None:
    conn.execute(
        "INSERT INTO index_version_events (version_id, event, forced, detail) VALUES (%s, %s, %s, %s)",
        (version_id, event, forced, Jsonb(detail)),
    )


def start_build(
    conn: psycopg.Connection, model: str, location: str, dimensions: int, chunker_version: str, parser_version: str
) -> store.IndexVersion:
    """A new version in status 'building'; from now on every write reaches it too."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('rag_pipeline:index_versions'))")
    if store.index_versions(conn, ("building", "ready")):
        raise VersionError("another index version is already building (or ready): promote or retire it first")
    version = store.create_index_version(conn, model, location, dimensions, chunker_version, parser_version)
    record(conn, version.version_id, "build", model=model, dimensions=dimensions)
    return version


def mark_ready(conn: psycopg.Connection, version_id: int) -> None:
    """Backfill complete: the version is ready to be promoted (it keeps receiving writes meanwhile)."""
    conn.execute(
        "UPDATE index_versions SET status = 'ready', ready_at = now() WHERE version_id = %s AND status = 'building'",
        (version_id,),
    )


@dataclass
class GateReport:
    version: int
    missing_groups: int = 0  # groups of indexed documents without a row in the candidate
    replayed_deletions_left: int = 0  # rows of documents deleted since the build began
    quality: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


def check_gates(
    conn: psycopg.Connection,
    candidate: store.IndexVersion,
    golden: Path | None = None,
    labels: list[str] | None = None,
    k: int = 10,
    tolerance: float = 0.02,
) -> GateReport:
    report = GateReport(candidate.version_id)
    table = sql.Identifier(candidate.table_name)
    report.missing_groups = store.groups_without_row(conn, candidate)
    if report.missing_groups:
        report.failures.append(f"incomplete: {report.missing_groups} chunk groups have no row (backfill not done)")
    report.replayed_deletions_left = conn.execute(
        sql.SQL(
            """SELECT count(*) FROM {} t JOIN deletion_log l ON l.doc_id = t.doc_id
               JOIN index_versions v ON v.version_id = %s
               WHERE l.deleted_at >= v.build_started_at
                 AND NOT EXISTS (SELECT 1 FROM documents d WHERE d.doc_id = t.doc_id)"""
        ).format(table),
        (candidate.version_id,),
    ).fetchone()[0]
    if report.replayed_deletions_left:
        report.failures.append(f"deletion replay: {report.replayed_deletions_left} rows of deleted documents")
    active = store.active_version(conn)
    if golden is not None and active is not None and active.version_id != candidate.version_id:
        if not labels:
            raise VersionError("the quality gate needs the labels to evaluate as")
        questions = load_golden(golden)
        before = evaluate(conn, questions, labels, k=k, version=active).metrics["overall"]
        after = evaluate(conn, questions, labels, k=k, version=candidate).metrics["overall"]
        report.quality = {"active": before, "candidate": after, "tolerance": tolerance}
        for metric in ("recall@k", "ndcg@k"):
            if after.get(metric, 0.0) < before.get(metric, 0.0) - tolerance:
                report.failures.append(
                    f"quality: {metric} {after[metric]} < active {before[metric]} - {tolerance}"
                )
    return report


def promote(conn: psycopg.Connection, version_id: int, gates: GateReport | None, force: bool = False) -> None:
    """Make a version the one readers use, atomically; the previous one is kept for rollback."""
    candidate = _version(conn, version_id)
    if candidate.status not in ("building", "ready"):
        raise VersionError(f"v{version_id} is {candidate.status}: only a building or ready version can be promoted")
    if not force and (gates is None or not gates.passed):
        raise VersionError("promotion refused: " + "; ".join(gates.failures if gates else ["gates not checked"]))
    store.activate_version(conn, version_id)
    record(conn, version_id, "promote", forced=force, gates=asdict(gates) if gates else None)


def rollback(conn: psycopg.Connection) -> store.IndexVersion:
    """Re-activate the version that was active before the current one (its table still exists)."""
    row = conn.execute(
        """SELECT version_id FROM index_versions
           WHERE status = 'retired' AND promoted_at IS NOT NULL AND dropped_at IS NULL
           ORDER BY retired_at DESC LIMIT 1"""
    ).fetchone()
    if row is None:
        raise VersionError("nothing to roll back to: no retired version with its table")
    store.activate_version(conn, row[0])
    record(conn, row[0], "rollback")
    return _version(conn, row[0])


def retire(conn: psycopg.Connection, version_id: int) -> None:
    """Drop a version's table for good. The active version cannot be retired."""
    version = _version(conn, version_id)
    if version.status == "active":
        raise VersionError(f"v{version_id} is active: promote another version (or roll back) first")
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(version.table_name)))
    conn.execute(
        """UPDATE index_versions SET status = 'retired', retired_at = coalesce(retired_at, now()),
                  dropped_at = now(), row_count = 0 WHERE version_id = %s""",
        (version_id,),
    )
    record(conn, version_id, "drop")
