"""Stage 1: scan every source and reconcile it with the documents table (new, changed, moved, relabelled,
deleted), one transaction per source, without reading any document's bytes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from rag_pipeline.config import SourceConfig
from rag_pipeline.sources import ScanProblem, scan_source
from rag_pipeline.stages.common import Progress, StageStats, locked_stage, log_progress
from rag_pipeline.store import documents
from rag_pipeline.store.database import connect


@dataclass
class DiscoverStats(StageStats):
    sources: int = 0
    documents_seen: int = 0
    new: int = 0
    changed: int = 0
    unchanged: int = 0
    relabelled: int = 0
    deleted: int = 0
    held_no_labels: int = 0
    problems: list[dict[str, str]] = field(default_factory=list)
    per_source: dict[str, dict[str, int]] = field(default_factory=dict)
    SUMMARY = ("documents_seen", "new", "changed", "unchanged", "deleted", "relabelled", "held_no_labels",
               "problems")


def discover(
    db_url: str, sources: Sequence[SourceConfig], progress: Progress = log_progress, lock_timeout_seconds: float = 3600
) -> DiscoverStats:
    stats = DiscoverStats(sources=len(sources))
    with locked_stage(db_url, "discover", stats, timeout_seconds=lock_timeout_seconds, progress=progress):
        for source in sources:
            _discover_source(db_url, source, stats, progress)
    return stats


def _discover_source(db_url: str, source: SourceConfig, stats: DiscoverStats, progress: Progress) -> None:
    scan_started = datetime.now(UTC)
    problems: list[ScanProblem] = []
    if not source.root.is_dir():
        # A missing (unmounted, mistyped) root must never read as "every document was deleted".
        stats.problems.append({"source": source.name, "path": str(source.root),
                               "problem": "root folder missing; nothing changed"})
        progress(f"source {source.name}: root folder {source.root} is missing; skipped, nothing deleted")
        return
    with connect(db_url) as conn, conn.transaction():
        documents.upsert_source(conn, source)
        # One transaction per source: a scan interrupted half-way changes nothing.
        counts = documents.reconcile_source(conn, source.name, scan_source(source, problems))
        documents.record_scan(conn, source.name, scan_started, counts)
    stats.documents_seen += counts.seen
    stats.new += counts.new
    stats.changed += counts.changed + counts.released + counts.retitled
    stats.unchanged += counts.unchanged
    stats.relabelled += counts.relabelled
    stats.deleted += counts.deleted
    stats.held_no_labels += counts.held
    stats.problems += [{"source": source.name, "path": p.rel_path, "problem": p.problem} for p in problems]
    stats.per_source[source.name] = {
        "seen": counts.seen, "new": counts.new, "changed": counts.changed, "deleted": counts.deleted,
        "relabelled": counts.relabelled, "held": counts.held,
    }
    progress(
        f"source {source.name}: {counts.seen} files, {counts.new} new, {counts.changed} changed, "
        f"{counts.deleted} deleted, {counts.relabelled} relabelled, {counts.held} held (no ACL labels)"
    )
    for problem in problems:
        progress(f"source {source.name}: skipped {problem.rel_path}: {problem.problem}")
