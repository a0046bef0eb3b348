"""Housekeeping: what the index no longer uses, collected after its grace period (rag_pipeline.lifecycle.erasure)."""

import dagster as dg

from rag_pipeline.defs.resources import Rag
from rag_pipeline.defs.run_monitoring import INDEX_WRITER_POOL
from rag_pipeline.lifecycle.erasure import housekeeping


@dg.op(pool=INDEX_WRITER_POOL, description="Collect embedding-cache entries no index row uses (older than retention.embedding_cache_grace) "
                   "and forget deletion-log paths older than retention.deletion_log.")
def collect_unused(context: dg.OpExecutionContext, rag: Rag) -> None:
    settings = rag.settings()
    report = housekeeping(rag.database_url(), settings.retention.embedding_cache_grace_seconds,
                          settings.retention.deletion_log_seconds, settings.lock_timeout_seconds)
    context.add_output_metadata({"embedding_cache_entries_collected": report.embedding_cache_entries,
                                 "deletion_log_entries_forgotten": report.deletion_log_entries})
    context.log.info(f"housekeeping: {report.embedding_cache_entries} cache entries collected, "
                     f"{report.deletion_log_entries} deletion-log entries forgotten")


@dg.job(description="Collect what the index no longer uses after its grace period (also `rag-pipeline gc`).")
def housekeeping_job():
    collect_unused()
