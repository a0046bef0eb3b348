"""Asset checks that keep the index true. Each wraps one function of rag_pipeline.lifecycle.checks.

The checks that protect what readers see (deletions honoured, labels on every row, one model per version)
fail with severity ERROR and are blocking: anything downstream of `search_index` in the same run does
not materialize, and the run fails. The others report a WARN when they fail; `retrieval_quality` reports an
ERROR but blocks nothing (a version swap has its own promotion gates).
"""

from typing import TYPE_CHECKING

import dagster as dg

from rag_pipeline.defs.metadata import document_table
from rag_pipeline.defs.resources import Rag
from rag_pipeline.lifecycle import checks as health
from rag_pipeline.retrieval.search import SearchOptions
from rag_pipeline.store.database import connect

if TYPE_CHECKING:
    from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition


def _result(outcome: health.CheckOutcome, severity: dg.AssetCheckSeverity, conn) -> dg.AssetCheckResult:
    metadata: dict = {"summary": outcome.summary, **outcome.numbers}
    metadata.update({name: document_table(conn, t.header, t.rows) for name, t in outcome.tables.items()})
    return dg.AssetCheckResult(
        passed=outcome.passed, severity=severity, description=outcome.summary, metadata=metadata
    )


@dg.asset_check(
    asset="search_index", name="staleness",
    description="Per source: time since the last completed scan and age of the oldest change not yet indexed, "
    "against the source's freshness SLA (freshness_sla in the source's configuration).",
)
def staleness_check(rag: Rag) -> dg.AssetCheckResult:
    with connect(rag.database_url()) as conn:
        return _result(health.record(conn, "staleness", health.staleness(conn, rag.settings().sources)), dg.AssetCheckSeverity.WARN, conn)


@dg.asset_check(
    asset="search_index", name="deletion_replay", blocking=True,
    description="Every deleted document has zero rows in every index version and every derived table.",
)
def deletion_replay_check(rag: Rag) -> dg.AssetCheckResult:
    with connect(rag.database_url()) as conn:
        return _result(health.record(conn, "deletion_replay", health.deletion_replay(conn)), dg.AssetCheckSeverity.ERROR, conn)


@dg.asset_check(
    asset="search_index", name="acl_coverage", blocking=True,
    description="No row without labels, none whose labels differ from its document's, none of a held document.",
)
def acl_coverage_check(rag: Rag) -> dg.AssetCheckResult:
    with connect(rag.database_url()) as conn:
        return _result(health.record(conn, "acl_coverage", health.acl_coverage(conn)), dg.AssetCheckSeverity.ERROR, conn)


@dg.asset_check(
    asset="search_index", name="index_drift", blocking=True,
    description="One model and dimension per version, one vector per chunk group, no orphan rows, and the "
    "active alias on an active version.",
)
def index_drift_check(rag: Rag) -> dg.AssetCheckResult:
    with connect(rag.database_url()) as conn:
        return _result(health.record(conn, "index_drift", health.index_drift(conn)), dg.AssetCheckSeverity.ERROR, conn)


@dg.asset_check(
    asset="parsed_documents", name="parse_health",
    description="Near-empty pages, documents without text, tier mix and dead letters against the thresholds "
    "in the `checks` configuration.",
)
def parse_health_check(rag: Rag) -> dg.AssetCheckResult:
    with connect(rag.database_url()) as conn:
        return _result(health.record(conn, "parse_health", health.parse_health(conn, rag.settings().checks)), dg.AssetCheckSeverity.WARN, conn)


@dg.asset_check(
    asset="search_index", name="retrieval_quality",
    description="Golden-set recall@k and nDCG@k of the active version (and of a version being built) against "
    "the active version's stored baseline; re-evaluated only when the index changed.",
)
def retrieval_quality_check(rag: Rag) -> dg.AssetCheckResult:
    settings = rag.settings()
    with connect(rag.database_url()) as conn:
        outcome = health.record(conn, "retrieval_quality",
                                health.retrieval_quality(conn, settings.checks, SearchOptions.from_settings(settings)))
        return _result(outcome, dg.AssetCheckSeverity.ERROR, conn)


index_checks = [
    staleness_check, deletion_replay_check, acl_coverage_check, index_drift_check, parse_health_check,
    retrieval_quality_check,
]
CHECK_NAMES = ("staleness", "deletion_replay", "acl_coverage", "index_drift", "parse_health", "retrieval_quality")


def index_health_job(checks: list[dg.AssetChecksDefinition]) -> "UnresolvedAssetJobDefinition":
    # These checks by name, not every check of the code location: a user's project may hold its own.
    return dg.define_asset_job(
        "index_health",
        selection=dg.AssetSelection.checks(*checks),
        description="Run the six checks alone, materializing nothing: staleness is noticed even when no refresh runs.",
    )
