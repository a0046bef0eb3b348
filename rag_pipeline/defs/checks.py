"""Asset checks that keep the index true: one Dagster asset check for each check of the registry
(rag_pipeline.lifecycle.checks.CHECKS), which `rag-pipeline checks` and the index_health job run as well.

The checks that protect what readers see (deletions honoured, labels on every row, one model per version)
fail with severity ERROR and are blocking: anything downstream of `search_index` in the same run does
not materialize, and the run fails. The others report a WARN when they fail; `retrieval_quality` reports an
ERROR but blocks nothing (a version swap has its own promotion gates). `staleness` is blocking too but fails
with ERROR only for a source whose latest scan failed: a late source warns, a source that cannot be scanned fails
the run.
"""

from typing import TYPE_CHECKING

import dagster as dg

from rag_pipeline.defs.metadata import document_table, without_credentials
from rag_pipeline.defs.resources import Rag
from rag_pipeline.endpoints.redaction import redact_credentials
from rag_pipeline.lifecycle.checks import CHECKS, CheckOutcome, IndexCheck, run_check
from rag_pipeline.store.database import connect

if TYPE_CHECKING:
    from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition


def _result(outcome: CheckOutcome, severity: dg.AssetCheckSeverity, conn) -> dg.AssetCheckResult:
    metadata: dict = {"summary": outcome.summary, **outcome.numbers}
    metadata.update({name: document_table(conn, t.header, t.rows) for name, t in outcome.tables.items()})
    # A check that reports a source's failed scan repeats its error, which may name an endpoint's URL.
    return dg.AssetCheckResult(
        passed=outcome.passed, severity=dg.AssetCheckSeverity.ERROR if outcome.error else severity,
        description=redact_credentials(outcome.summary),
        metadata=without_credentials(metadata),
    )


def _asset_check(check: IndexCheck) -> dg.AssetChecksDefinition:
    severity = dg.AssetCheckSeverity.ERROR if check.error else dg.AssetCheckSeverity.WARN

    @dg.asset_check(asset=check.asset, name=check.name, blocking=check.blocking, description=check.description)
    def run(rag: Rag) -> dg.AssetCheckResult:
        with connect(rag.database_url()) as conn:
            return _result(run_check(conn, check, rag.settings()), severity, conn)

    return run


index_checks = [_asset_check(check) for check in CHECKS]


def index_health_job(checks: list[dg.AssetChecksDefinition]) -> "UnresolvedAssetJobDefinition":
    # These checks by name, not every check of the code location: a user's project may hold its own.
    return dg.define_asset_job(
        "index_health",
        selection=dg.AssetSelection.checks(*checks),
        description="Run the six checks alone, materializing nothing: staleness is noticed even when no refresh runs.",
    )
