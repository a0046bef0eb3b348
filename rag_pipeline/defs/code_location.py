"""Everything the code location holds, bound to one configuration."""

from __future__ import annotations

import os

import dagster as dg

from rag_pipeline.config import Settings, load_settings
from rag_pipeline.defs.automation import alert_sensor, schedules, source_changes_sensor
from rag_pipeline.defs.checks import index_checks, index_health_job
from rag_pipeline.defs.housekeeping import housekeeping_job
from rag_pipeline.defs.index_versions import (
    build_index_version_job,
    index_version_backfill,
    promote_index_version,
    start_index_build,
)
from rag_pipeline.defs.ingestion import ingest_job, ingestion_assets
from rag_pipeline.defs.io import RUN_OUTPUTS, RunOutputsIOManager
from rag_pipeline.defs.resources import RagResource


def build_definitions(settings: Settings) -> dg.Definitions:
    """Bind resources and configuration in one place."""
    config_file = str(settings.config_file) if settings.config_file else None
    jobs = [ingest_job(settings), index_health_job, build_index_version_job, start_index_build, promote_index_version,
            housekeeping_job]
    return dg.Definitions(
        assets=[*ingestion_assets(settings), index_version_backfill],
        asset_checks=index_checks,
        jobs=jobs,
        schedules=schedules(settings),
        sensors=[source_changes_sensor(settings), alert_sensor([job.name for job in jobs])],
        resources={"rag": (rag := RagResource(config_file=config_file)), RUN_OUTPUTS: RunOutputsIOManager(rag=rag)},
    )


def configured_ingest_job() -> dg.JobDefinition:
    """The ingest job of the configuration named by $RAG_CONFIG: what the processes of a distributed executor
    rebuild (dagster.reconstructable points at this function)."""
    return build_definitions(load_settings(os.environ.get("RAG_CONFIG"))).resolve_job_def("ingest")
