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
from rag_pipeline.defs.ingestion import executor, ingest_job, ingestion_assets
from rag_pipeline.defs.io import RUN_OUTPUTS, RunOutputsIOManager
from rag_pipeline.defs.preview import preview_refresh_job
from rag_pipeline.defs.resources import RagResource, fixed_resource
from rag_pipeline.endpoints.redaction import install_log_redaction, keep_secrets_of


def build_definitions(settings: Settings, *, own_code_location: bool = True) -> dg.Definitions:
    """Bind resources and configuration in one place. In the project's own code location, with one document step
    on one machine, every job runs its steps in the run's process, "Materialize all" included; a Component inside
    a user's project leaves their default alone (its ingest job names its own executor)."""
    # Every process that runs the pipeline builds these (the CLI, the code server, a run's or a step's worker):
    # from here on no log record of it, and so no compute log or Dagster event it writes, shows a credential.
    install_log_redaction()
    keep_secrets_of(settings.model_dump(mode="json"))
    ingestion, (backfill,), checks = keyed_under(
        settings.asset_key_prefix, ingestion_assets(settings), [index_version_backfill], index_checks)
    health_job = index_health_job(checks)
    jobs = [ingest_job(settings, ingestion), health_job, build_index_version_job(backfill), start_index_build,
            promote_index_version, housekeeping_job, preview_refresh_job]
    return dg.Definitions(
        # Only the in-process default: other jobs' ops (promotion, housekeeping) hold the writer pool, which
        # Dask cannot carry (see writer_pool).
        executor=dg.in_process_executor if own_code_location and executor(settings) is dg.in_process_executor
        else None,
        assets=[*ingestion, backfill],
        asset_checks=checks,
        jobs=jobs,
        schedules=schedules(settings, health_job),
        sensors=[source_changes_sensor(settings), alert_sensor([job.name for job in jobs], checks)],
        resources={
            "rag": fixed_resource(rag := RagResource(settings), "the configuration this code location loaded"),
            RUN_OUTPUTS: dg.IOManagerDefinition(resource_fn=lambda _: RunOutputsIOManager(rag), config_schema={},
                                                description="step outputs in the index database"),
        },
    )


def keyed_under(
    prefix: tuple[str, ...], ingestion: list[dg.AssetsDefinition], versions: list[dg.AssetsDefinition],
    checks: list[dg.AssetChecksDefinition],
) -> tuple[list[dg.AssetsDefinition], list[dg.AssetsDefinition], list[dg.AssetChecksDefinition]]:
    """The assets and checks with every key (and every dependency on one) under `prefix`, so that they cannot
    collide with a user's own in a shared code location. No prefix keeps the keys, and with them the history an
    existing deployment has recorded under them."""
    if not prefix:
        return ingestion, versions, checks
    renamed = {key: dg.AssetKey([*prefix, *key.path]) for a in (*ingestion, *versions) for key in a.keys}
    return ([a.with_attributes(asset_key_replacements=renamed) for a in ingestion],
            [a.with_attributes(asset_key_replacements=renamed) for a in versions],
            [c.with_attributes(asset_key_replacements=renamed) for c in checks])


def configured_ingest_job() -> dg.JobDefinition:
    """The ingest job of the configuration named by $RAG_CONFIG: what the processes of a distributed executor
    rebuild (dagster.reconstructable points at this function)."""
    return build_definitions(load_settings(os.environ.get("RAG_CONFIG"))).resolve_job_def("ingest")
