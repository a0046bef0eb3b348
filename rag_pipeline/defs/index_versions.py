"""Index-version assets: the backfill that fills a building version, partitioned by hash shard so that
Dagster's executors, run launchers and backfills can spread it over N workers."""

from typing import TYPE_CHECKING

import dagster as dg

from rag_pipeline import store
from rag_pipeline.defs.metadata import typed_table
from rag_pipeline.defs.resources import Rag
from rag_pipeline.defs.run_monitoring import INDEX_WRITER_POOL
from rag_pipeline.domain.status import VersionStatus
from rag_pipeline.embedding.locations import ModelArgumentError
from rag_pipeline.lifecycle import blue_green
from rag_pipeline.store.database import connect

if TYPE_CHECKING:
    from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

GROUP = "index_versions"
SHARDS = 8
shards = dg.StaticPartitionsDefinition([f"{i:02d}" for i in range(SHARDS)])


@dg.asset(
    group_name=GROUP,
    partitions_def=shards,
    description="Embeds one hash shard of the live documents into the index version being built "
    "(start one with `rag-pipeline index build --model NAME`); a no-op when none is building.",
)
def index_version_backfill(context: dg.AssetExecutionContext, rag: Rag):
    db_url = rag.database_url()
    with connect(db_url) as conn:
        building = store.versions.index_versions(conn, (VersionStatus.BUILDING,))
    if not building:
        context.log.info("no index version is building: nothing to backfill")
        return dg.MaterializeResult(metadata={"building_version": "none", "documents": 0})
    version = building[0]
    stats = blue_green.backfill_version(
        db_url, rag.settings(), version.version_id, int(context.partition_key), SHARDS, progress=context.log.info
    )
    return dg.MaterializeResult(
        metadata={
            "building_version": f"{version.label} ({version.embedding_model})",
            "documents": stats.documents_indexed,
            "rows_written": stats.rows_written,
            "vectors_embedded": stats.vectors_embedded,
            "vectors_reused": stats.vectors_reused,
            "seconds": round(stats.seconds, 3),
        }
    )


def build_index_version_job(backfill: dg.AssetsDefinition) -> "UnresolvedAssetJobDefinition":
    return dg.define_asset_job(
        "build_index_version",
        selection=dg.AssetSelection.assets(backfill),
        partitions_def=shards,
        description="Backfill all shards of the building index version (launch as a backfill over every partition).",
    )


# --- the swap from the UI: start a build, backfill it (above), promote it ---------------------------------


class StartBuildConfig(dg.Config):
    model: str  # sentence-transformers name or local folder, e.g. all-mpnet-base-v2


@dg.op(description="Register an index version for a new embedding model, in status 'building'.")
def start_index_version(context: dg.OpExecutionContext, config: StartBuildConfig, rag: Rag) -> int:
    try:
        version = blue_green.start_version_build(rag.database_url(), rag.settings(), config.model)
    except (ModelArgumentError, blue_green.VersionError) as exc:  # the message says it all: no traceback
        raise dg.Failure(str(exc)) from None
    context.log.info(
        f"{version.label} ({version.embedding_model}, {version.dimensions} dims) is building: launch a "
        "backfill of build_index_version over all partitions, then promote_index_version"
    )
    context.add_output_metadata({"version": version.version_id, "model": version.embedding_model,
                                 "dimensions": version.dimensions})
    return version.version_id


@dg.job(description="Step 1 of an embedding-model swap: start building a version for the model in the config.")
def start_index_build():
    start_index_version()


class PromoteConfig(dg.Config):
    version_id: int
    force: bool = False  # promote even when a gate fails: needs force_reason, recorded with the promotion
    force_reason: str = ""


@dg.op(pool=INDEX_WRITER_POOL, description="Check the gates (complete, deletions replayed, golden-set quality) and make the version active.")
def promote_version(context: dg.OpExecutionContext, config: PromoteConfig, rag: Rag) -> None:
    with connect(rag.database_url()) as conn, conn.transaction():
        try:
            gates = blue_green.promote_with_gates(conn, config.version_id, rag.settings(), force=config.force,
                                                  reason=config.force_reason)
        except blue_green.PromotionRefused as refused:
            context.add_output_metadata(_gate_metadata(refused.gates, forced=False))
            raise dg.Failure(str(refused)) from None
        except blue_green.VersionError as exc:
            raise dg.Failure(str(exc)) from None
    with connect(rag.database_url()) as conn:  # after the commit, under no lock of the promotion
        swap = blue_green.swap_report(conn, rag.settings(), config.version_id, gates)
    context.add_output_metadata({**_gate_metadata(gates, forced=config.force),
                                 "set_next": dg.MetadataValue.json(swap["set"])})
    context.log.info(f"{swap['active']} is active: {swap['embedding_model']}"
                     + ("; set " + ", ".join(f"{k}: {v}" for k, v in swap["set"].items()) + " before the next refresh"
                        if swap["set"] else ""))


def _gate_metadata(gates: blue_green.GateReport, forced: bool) -> dict:
    results = blue_green.gate_results(gates)
    return {"gates": typed_table(("gate", "result", "detail"),
                                 [(g["gate"], blue_green.GATE_RESULT_WORDS[g["passed"]],
                                   g["detail"]) for g in results]),
            "gate_failures": typed_table(("failure",), [(f,) for f in gates.failures]), "forced": forced,
            "quality": dg.MetadataValue.json(gates.quality)}


@dg.job(description="Step 3 of an embedding-model swap: promote the built version if its gates pass.")
def promote_index_version():
    promote_version()
