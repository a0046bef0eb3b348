"""Index-version assets: the backfill that fills a building version, partitioned by hash shard so that
Dagster's executors, run launchers and backfills can spread it over N workers."""

import dagster as dg

from rag_pipeline import ingest, store
from rag_pipeline.database import connect
from rag_pipeline.defs.resources import RagResource

GROUP = "index_versions"
SHARDS = 8
shards = dg.StaticPartitionsDefinition([f"{i:02d}" for i in range(SHARDS)])


@dg.asset(
    group_name=GROUP,
    partitions_def=shards,
    description="Embeds one hash shard of the live documents into the index version being built "
    "(start one with `rag-pipeline index build --model NAME`); a no-op when none is building.",
)
def index_version_backfill(context: dg.AssetExecutionContext, rag: RagResource):
    db_url = rag.database_url()
    with connect(db_url) as conn:
        building = store.index_versions(conn, ("building",))
    if not building:
        context.log.info("no index version is building: nothing to backfill")
        return dg.MaterializeResult(metadata={"building_version": "none", "documents": 0})
    version = building[0]
    stats = ingest.backfill_version(
        db_url, rag.settings(), version.version_id, int(context.partition_key), SHARDS, progress=context.log.info
    )
    return dg.MaterializeResult(
        metadata={
            "building_version": f"v{version.version_id} ({version.embedding_model})",
            "documents": stats.documents_indexed,
            "rows_written": stats.rows_written,
            "vectors_embedded": stats.vectors_embedded,
            "vectors_reused": stats.vectors_reused,
            "seconds": round(stats.seconds, 3),
        }
    )


build_index_version_job = dg.define_asset_job(
    "build_index_version",
    selection=[index_version_backfill],
    partitions_def=shards,
    description="Backfill all shards of the building index version (launch as a backfill over every partition).",
)
