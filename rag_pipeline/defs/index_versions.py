"""Index-version assets: the backfill that fills a building version, partitioned by version and hash shard, so that
each build is a backfill of its own version's partitions (the UI shows a new build as 0 of 8 until it runs) that
Dagster's executors, run launchers and backfills spread over N workers."""

import time
import uuid
from typing import TYPE_CHECKING, Any

import dagster as dg
from dagster._core.definitions.assets.graph.asset_graph_subset import AssetGraphSubset
from dagster._core.definitions.events import AssetKeyPartitionKey
from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill

from rag_pipeline import store
from rag_pipeline.config import Settings
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
BACKFILL_ASSET = "index_version_backfill"
SHARDS = 8
VERSION_PARTITIONS = "index_version"  # the dynamic partitions: one per version built ("v5")
version_shards = dg.MultiPartitionsDefinition({
    "version": dg.DynamicPartitionsDefinition(name=VERSION_PARTITIONS),
    "shard": dg.StaticPartitionsDefinition([f"{i:02d}" for i in range(SHARDS)]),
})


def backfill_asset_key(settings: Settings) -> dg.AssetKey:
    """The backfill asset's key under the configured prefix (rag_pipeline.defs.code_location.keyed_under)."""
    return dg.AssetKey([*settings.asset_key_prefix, BACKFILL_ASSET])


def build_partition_keys(version_label: str) -> list[dg.MultiPartitionKey]:
    """The partitions of one version's build: its shards."""
    return [dg.MultiPartitionKey({"version": version_label, "shard": f"{shard:02d}"}) for shard in range(SHARDS)]


@dg.asset(
    group_name=GROUP,
    partitions_def=version_shards,
    description="Embeds one hash shard of the live documents into an index version being built (start one with "
    "`rag-pipeline index build --model NAME` or the start_index_build job, which launches this backfill).",
)
def index_version_backfill(context: dg.AssetExecutionContext, rag: Rag):
    keys = version_shards.get_partition_key_from_str(str(context.partition_key)).keys_by_dimension
    label, shard = keys["version"], int(keys["shard"])
    if not label.removeprefix("v").isdigit():
        raise dg.Failure(f"partition version {label!r} names no index version (v1, v2, ...)")
    db_url = rag.database_url()
    with connect(db_url) as conn:
        version = store.versions.get_version(conn, int(label.removeprefix("v")))
        missing = 0 if version is None else store.versions.groups_without_row(conn, version)
    if version is None:
        raise dg.Failure(f"{label} was dropped (or never existed): nothing to build")
    if version.status != VersionStatus.BUILDING:
        # Built and past its gates (or forced past them): a shard run again writes nothing, and says so.
        if missing:
            raise dg.Failure(f"{label} is {version.status} but {missing} chunk groups have no row in it; it is no "
                             "longer building, so this shard cannot fill them: build a new version")
        context.log.info(f"{label} is {version.status}: built already, nothing to backfill")
        return dg.MaterializeResult(metadata={"building_version": f"{label} (already built: {version.status})"})
    stats = blue_green.backfill_version(
        db_url, rag.settings(), version.version_id, shard, SHARDS, progress=context.log.info
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
        partitions_def=version_shards,
        description="Backfill the shards of a building index version (its `version` partitions; start_index_build "
        "launches it).",
    )


def build_backfill(instance: dg.DagsterInstance, asset_graph: Any, backfill_key: dg.AssetKey, version_label: str,
                   tags: dict[str, str]) -> PartitionBackfill:
    """A backfill of one version's shards (registered as partitions of that version first), as the UI's backfill
    dialog makes one: the Backfills tab and the partition view show it."""
    instance.add_dynamic_partitions(VERSION_PARTITIONS, [version_label])
    return PartitionBackfill.from_asset_partitions(
        backfill_id=uuid.uuid4().hex[:8], asset_graph=asset_graph,
        partition_names=[str(key) for key in build_partition_keys(version_label)], asset_selection=[backfill_key],
        backfill_timestamp=time.time(), tags={**tags, "rag_pipeline/index_version": version_label},
        dynamic_partitions_store=instance, all_partitions=False, title=f"build {version_label}",
        description=f"embed every live document into index version {version_label}", run_config=None)


def record_finished_backfill(instance: dg.DagsterInstance, asset_graph: Any, backfill: PartitionBackfill,
                             backfill_key: dg.AssetKey, failed: list[str]) -> None:
    """Record a backfill whose runs this process ran itself (the CLI: no daemon), as Dagster's own `job backfill`
    command does once its runs are submitted: finished (never REQUESTED, or a daemon would run it again), every
    partition requested, and each materialized or, those in `failed`, failed."""
    data = backfill.asset_backfill_data
    assert data is not None  # from_asset_partitions makes an asset backfill
    failures = AssetGraphSubset.from_asset_partition_set(
        {AssetKeyPartitionKey(backfill_key, key) for key in failed}, asset_graph)
    data = data._replace(requested_subset=data.target_subset, materialized_subset=data.target_subset - failures,
                         failed_and_downstream_subset=failures)
    status = BulkActionStatus.COMPLETED_FAILED if failed else BulkActionStatus.COMPLETED_SUCCESS
    instance.add_backfill(backfill.with_asset_backfill_data(data, instance, asset_graph).with_status(status)
                          .with_end_timestamp(time.time()))


# --- the swap from the UI: start a build, backfill it (above), promote it ---------------------------------


class StartBuildConfig(dg.Config):
    model: str  # sentence-transformers name or local folder, e.g. all-mpnet-base-v2


@dg.op(description="Register an index version for a new embedding model, in status 'building', and launch the "
                   "backfill of its shards (the daemon runs it; the Backfills tab follows it).")
def start_index_version(context: dg.OpExecutionContext, config: StartBuildConfig, rag: Rag) -> int:
    graph = context.repository_def.asset_graph  # before the version exists: nothing half-started if this fails
    backfill_key = backfill_asset_key(rag.settings())
    try:
        version = blue_green.start_version_build(rag.database_url(), rag.settings(), config.model)
    except (ModelArgumentError, blue_green.VersionError) as exc:  # the message says it all: no traceback
        raise dg.Failure(str(exc)) from None
    backfill = build_backfill(context.instance, graph, backfill_key, version.label, {})
    context.instance.add_backfill(backfill)
    context.log.info(
        f"{version.label} ({version.embedding_model}, {version.dimensions} dims) is building: backfill "
        f"{backfill.backfill_id} of its {SHARDS} shards launched; then promote_index_version"
    )
    context.add_output_metadata({"version": version.version_id, "model": version.embedding_model,
                                 "dimensions": version.dimensions, "backfill": backfill.backfill_id})
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
