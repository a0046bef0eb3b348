"""Housekeeping: what the index no longer uses, collected after its grace period (rag_pipeline.lifecycle.erasure,
rag_pipeline.lifecycle.reclaim)."""

import dagster as dg

from rag_pipeline.defs.metadata import typed_table
from rag_pipeline.defs.resources import Rag
from rag_pipeline.defs.run_monitoring import INDEX_WRITER_POOL
from rag_pipeline.lifecycle.alerts import AlertSender
from rag_pipeline.lifecycle.erasure import housekeeping
from rag_pipeline.lifecycle.reclaim import reclaim_versions


@dg.op(pool=INDEX_WRITER_POOL, description="Drop previous index versions past retention.rollback (not pinned; an "
                   "alert before), collect embedding-cache entries no index row uses (older than "
                   "retention.embedding_cache_grace) and forget deletion-log paths older than retention.deletion_log.")
def collect_unused(context: dg.OpExecutionContext, rag: Rag) -> None:
    settings = rag.settings()
    retention = settings.retention
    # Versions first: the cache entries only a reclaimed version used become collectable after their grace.
    versions = reclaim_versions(rag.database_url(), retention, AlertSender(settings.alerts, context.log),
                                settings.lock_timeout_seconds)
    report = housekeeping(rag.database_url(), retention.embedding_cache_grace_seconds,
                          retention.deletion_log_seconds, settings.lock_timeout_seconds)
    context.add_output_metadata({
        "embedding_cache_entries_collected": report.embedding_cache_entries,
        "deletion_log_entries_forgotten": report.deletion_log_entries,
        "versions_reclaimed": len(versions.reclaimed),
        "bytes_reclaimed": sum(v["bytes"] for v in versions.reclaimed),
        "reclaimable_bytes": versions.reclaimable_bytes,
        "previous_versions": typed_table(
            ("version", "model", "rows", "bytes", "reclaimed", "reclaim due", "pinned because"),
            [(f"v{v['version']}", v["embedding_model"], v["rows"], v["bytes"], reclaimed,
              "" if reclaimed else f"{v['reclaim_at']:%Y-%m-%d %H:%M} UTC" if v["reclaim_at"] else "never (pinned)",
              v["pinned_reason"])
             for reclaimed, entries in ((True, versions.reclaimed), (False, versions.kept)) for v in entries]),
    })
    context.log.info(f"housekeeping: {len(versions.reclaimed)} previous versions reclaimed, "
                     f"{report.embedding_cache_entries} cache entries collected, "
                     f"{report.deletion_log_entries} deletion-log entries forgotten")


@dg.job(description="Collect what the index no longer uses after its grace period (also `rag-pipeline gc`).")
def housekeeping_job():
    collect_unused()
