"""The Dagster instance the project prepares: DAGSTER_HOME with dagster-postgres storage on our server."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from rag_pipeline.config import Settings
from rag_pipeline.database import sqlalchemy_url
from rag_pipeline.defs.ingestion import REFRESH_TAG


def prepare_dagster_home(settings: Settings, dagster_url: str) -> Path:
    """Write dagster.yaml (runs, event log and schedules in Postgres) and point DAGSTER_HOME at it."""
    home = settings.dagster_home
    home.mkdir(parents=True, exist_ok=True)
    config = {
        "storage": {"postgres": {"postgres_url": sqlalchemy_url(dagster_url)}},
        "telemetry": {"enabled": False},
        "run_queue": {
            "max_concurrent_runs": 4,
            "tag_concurrency_limits": [{"key": REFRESH_TAG, "value": "refresh", "limit": 1}],
        },
    }
    target = home / "dagster.yaml"
    text = yaml.safe_dump(config, sort_keys=False)
    if not target.exists() or target.read_text() != text:
        target.write_text(text)
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def summarize_run(result: Any) -> dict[str, Any]:
    """Collect the stats each asset reported into one flat summary (the `ingest --json` contract)."""
    stats: dict[str, dict[str, Any]] = {}
    for event in result.get_asset_materialization_events():
        materialization = event.event_specific_data.materialization
        entry = materialization.metadata.get("stats")
        if entry is not None:
            stats[materialization.asset_key.to_user_string()] = entry.value
    discover = stats.get("source_documents", {})
    parse = stats.get("parsed_documents", {})
    chunk = stats.get("document_chunks", {})
    index = stats.get("search_index", {})
    return {
        "run_id": result.run_id,
        "success": result.success,
        "documents_seen": discover.get("documents_seen", 0),
        "new": discover.get("new", 0),
        "changed": discover.get("changed", 0),
        "unchanged": discover.get("unchanged", 0),
        "deleted": discover.get("deleted", 0),
        "relabelled": discover.get("relabelled", 0),
        "held_no_labels": discover.get("held_no_labels", 0),
        "parsed": parse.get("parsed", 0),
        "content_unchanged": parse.get("content_unchanged", 0),
        "dead_lettered": parse.get("dead_lettered", 0),
        "dead_letter_reasons": parse.get("dead_letter_reasons", {}),
        "pages": parse.get("pages", 0),
        "documents_chunked": chunk.get("documents_chunked", 0),
        "chunks_written": chunk.get("chunks_written", 0),
        "documents_indexed": index.get("documents_indexed", 0),
        "vectors_embedded": index.get("vectors_embedded", 0),
        "vectors_reused": index.get("vectors_reused", 0),
        "near_duplicates": index.get("deduplicated", 0),
        "dedup_rate": index.get("dedup_rate", 0.0),
        "problems": discover.get("problems", []),
        "checks": {
            evaluation.check_name: {"passed": evaluation.passed, "severity": evaluation.severity.value,
                                    "summary": evaluation.description}
            for evaluation in result.get_asset_check_evaluations()
        },
        "seconds": {
            "discover": discover.get("seconds", 0.0),
            "parse": parse.get("seconds", 0.0),
            "chunk": chunk.get("seconds", 0.0),
            "index": index.get("seconds", 0.0),
        },
    }


# psycopg's classes for a connection that broke or could not be made (OperationalError and its kin).
_CONNECTION_ERRORS = frozenset({
    "OperationalError", "InterfaceError", "AdminShutdown", "CrashShutdown", "CannotConnectNow",
    "ConnectionException", "ConnectionFailure", "ConnectionDoesNotExist", "SqlclientUnableToEstablishSqlconnection",
})


def _root_cause(error: Any) -> str:
    """The innermost error Dagster wrapped ("Error occurred while executing op" says nothing)."""
    while getattr(error, "cause", None) is not None:
        error = error.cause
    message = " ".join(str(error.message).split())
    if error.cls_name in _CONNECTION_ERRORS:
        message = f"lost the database connection ({message}); nothing half-written is kept, run again"
    return message


def run_ingest(
    settings: Settings,
    sources: list[str] | None = None,
    labels: list[str] | None = None,
    instance: Any = None,
    log_level: str = "INFO",
) -> dict[str, Any]:
    """Run the `ingest` job through Dagster against `instance` (the prepared one by default)."""
    import dagster as dg

    from rag_pipeline.definitions import build_definitions

    run_config = {
        "ops": {"source_documents": {"config": {"sources": sources or [], "labels": labels or []}}},
        "loggers": {"console": {"config": {"log_level": log_level}}},
    }
    job = build_definitions(settings).resolve_job_def("ingest")
    if instance is None:
        instance = dg.DagsterInstance.get()
    result = job.execute_in_process(run_config=run_config, instance=instance, raise_on_error=False)
    summary = summarize_run(result)
    if not result.success:
        summary["errors"] = [
            f"{event.step_key}: {_root_cause(event.event_specific_data.error)}"
            for event in result.all_events
            if event.is_step_failure and event.event_specific_data and event.event_specific_data.error
        ]
    return summary


def run_index_build(settings: Settings, model: str, instance: Any = None) -> dict[str, Any]:
    """Start building a version for `model` beside the active one and backfill every shard through Dagster.

    The shards run here one after another; from the UI (or a cluster run launcher) the same job runs as a
    backfill over all partitions, in parallel.
    """
    import dagster as dg

    from rag_pipeline import store, versions
    from rag_pipeline.database import connect, resolve_urls
    from rag_pipeline.definitions import build_definitions
    from rag_pipeline.defs.index_versions import shards
    from rag_pipeline.ingest import start_version_build

    db_url = resolve_urls(settings).index
    version = start_version_build(db_url, settings, model)
    job = build_definitions(settings).resolve_job_def("build_index_version")
    if instance is None:
        instance = dg.DagsterInstance.get()
    runs = []
    for key in shards.get_partition_keys():
        result = job.execute_in_process(
            instance=instance, partition_key=key, raise_on_error=False,
            run_config={"loggers": {"console": {"config": {"log_level": "INFO"}}}},
        )
        runs.append({"shard": key, "run_id": result.run_id, "success": result.success})
    with connect(db_url) as conn, conn.transaction():
        if all(r["success"] for r in runs) and versions.check_gates(conn, version).passed:
            versions.mark_ready(conn, version.version_id)
        rows = {v.version_id: v.row_count for v in store.index_versions(conn)}
    return {"version": version.version_id, "model": version.embedding_model, "dimensions": version.dimensions,
            "rows": rows.get(version.version_id, 0), "shards": runs,
            "success": all(r["success"] for r in runs)}
