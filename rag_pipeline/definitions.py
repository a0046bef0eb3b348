"""The Dagster code location: `dagster dev -w workspace.yaml` (or `rag-pipeline ui`) loads `defs`."""

from __future__ import annotations

import os

import dagster as dg

from rag_pipeline.config import Settings, load_settings
from rag_pipeline.defs.index_versions import build_index_version_job, index_version_backfill
from rag_pipeline.defs.ingestion import ingest_job, ingestion_assets
from rag_pipeline.defs.resources import RagResource


def build_definitions(settings: Settings) -> dg.Definitions:
    """Bind resources and configuration in one place."""
    config_file = str(settings.config_file) if settings.config_file else None
    refresh = dg.ScheduleDefinition(
        name="incremental_refresh",
        job=ingest_job,
        cron_schedule=settings.refresh_cron,
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description="Re-scan every source and index what changed.",
    )
    return dg.Definitions(
        assets=[*ingestion_assets, index_version_backfill],
        jobs=[ingest_job, build_index_version_job],
        schedules=[refresh],
        resources={"rag": RagResource(config_file=config_file)},
    )


defs = build_definitions(load_settings(os.environ.get("RAG_CONFIG")))
