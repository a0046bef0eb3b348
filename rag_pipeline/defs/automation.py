"""Automation: the refresh and health schedules, the sensor on the source folders, and the alert sensor."""

import hashlib
import json
from typing import TYPE_CHECKING, Any

import dagster as dg

from rag_pipeline.config import Settings
from rag_pipeline.defs.housekeeping import housekeeping_job
from rag_pipeline.defs.ingestion import DiscoverConfig, sources_to_scan
from rag_pipeline.defs.resources import Rag
from rag_pipeline.endpoints.redaction import redact_credentials
from rag_pipeline.lifecycle.alerts import AlertSender, Observation, transitions
from rag_pipeline.sources import kinds

if TYPE_CHECKING:
    from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

RECENT_RUNS_PER_JOB = 50  # enough to see the latest run of every partition of a sharded backfill


def schedules(settings: Settings, health_job: "UnresolvedAssetJobDefinition") -> list[dg.ScheduleDefinition]:
    # Off until switched on in the UI (or the daemon's deployment config): nothing launches by surprise.
    return [
        dg.ScheduleDefinition(
            name="incremental_refresh", job_name="ingest", cron_schedule=settings.refresh_cron,
            default_status=dg.DefaultScheduleStatus.STOPPED,
            description="Re-scan every source and index what changed.",
        ),
        dg.ScheduleDefinition(
            name="index_health_checks", job=health_job, cron_schedule=settings.checks.health_cron,
            default_status=dg.DefaultScheduleStatus.STOPPED,
            description="Run the six index checks without refreshing: a refresh that stopped running is noticed.",
        ),
        dg.ScheduleDefinition(
            name="housekeeping", job=housekeeping_job, cron_schedule=settings.retention.cron,
            default_status=dg.DefaultScheduleStatus.STOPPED,
            description="Collect embedding-cache entries and deletion-log paths past their retention.",
        ),
    ]


def source_changes_sensor(settings: Settings) -> dg.SensorDefinition:
    @dg.sensor(
        name="source_changes", job_name="ingest", minimum_interval_seconds=settings.source_sensor_interval_seconds,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description="Launches a refresh when files appear, change or disappear in a source folder or object "
        "store prefix (or their sidecar metadata changes): one listing per source per interval. The cursor holds each source's digest and the number of launches.",
    )
    def source_changes(context: dg.SensorEvaluationContext, rag: Rag):
        cursor = json.loads(context.cursor) if context.cursor else {"launches": 0, "digests": {}}
        digests = {}
        for source in sources_to_scan(rag, DiscoverConfig()).sources:
            try:
                digests[source.name] = kinds.digest(source)
            except Exception as exc:  # noqa: BLE001 - a store that cannot be listed now is not a change
                if source.store_scheme is None:
                    raise  # a folder's digest does not fail on what it cannot read: this is a bug, shown as one
                context.log.warning(f"source {source.name}: cannot be listed ({type(exc).__name__}: "
                                    f"{redact_credentials(str(exc).splitlines()[0])[:200] if str(exc) else ''}); "
                                    "no change assumed")
                if source.name in cursor["digests"]:
                    digests[source.name] = cursor["digests"][source.name]
        changed = sorted(name for name, digest in digests.items() if cursor["digests"].get(name) != digest)
        if not changed:
            return dg.SkipReason(f"no change in {len(digests)} sources")
        launch = cursor["launches"] + 1
        context.update_cursor(json.dumps({"launches": launch, "digests": digests}, sort_keys=True))
        # The key names this change (the launch number and the state it leads to): a tick evaluated again
        # from the same cursor asks for the same run, which Dagster launches once; a folder that returns to
        # an earlier state is a new change and gets a new key.
        state = hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()[:24]
        return dg.RunRequest(
            run_key=f"{launch}:{state}",
            tags={"rag_pipeline/trigger": "source_changes", "rag_pipeline/changed_sources": ",".join(changed)[:200]},
        )

    return source_changes


def _check_observations(instance: dg.DagsterInstance,
                        checks: list[dg.AssetChecksDefinition]) -> list[Observation]:
    keys = [key for check in checks for key in check.check_keys]
    records = instance.event_log_storage.get_latest_asset_check_execution_by_key(keys)
    observations = []
    for key, record in sorted(records.items(), key=lambda item: item[0].to_user_string()):
        evaluation = record.event.dagster_event.event_specific_data if record.event and record.event.dagster_event else None
        if not isinstance(evaluation, dg.AssetCheckEvaluation):
            continue  # planned or in flight: no verdict yet
        observations.append(Observation(
            key=f"check:{key.asset_key.to_user_string()}:{key.name}",
            failing=not evaluation.passed,
            summary=evaluation.description or f"check {key.name} {'failed' if not evaluation.passed else 'passed'}",
            details={"check": key.name, "asset": key.asset_key.to_user_string(), "run_id": record.run_id,
                     "severity": evaluation.severity.value if evaluation.severity else None},
        ))
    return observations


def _run_failure_summary(instance: dg.DagsterInstance, run_id: str) -> str | None:
    """What failed in a run; None when only blocking checks failed (each check alerts on its own)."""
    messages, only_checks = [], True
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE):
        error = entry.dagster_event.event_specific_data.error if entry.dagster_event else None
        if error is not None:
            only_checks = only_checks and error.cls_name == "DagsterAssetCheckFailedError"
            messages.append(f"{entry.step_key}: {error.message.strip()[:300]}")
    if messages and only_checks:
        return None
    return "; ".join(messages[:3]) or "the run failed"


# A version build's shards, also when the daemon runs them as a backfill (the implicit asset job): one key per
# shard, whichever version it built last.
BUILD_JOB, ASSET_BACKFILL_JOB, BUILD_TAG = "build_index_version", "__ASSET_JOB", "rag_pipeline/index_version"


def _finished_runs(instance: dg.DagsterInstance, job_name: str) -> list[Any]:
    statuses = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE]
    records = list(instance.get_run_records(filters=dg.RunsFilter(job_name=job_name, statuses=statuses),
                                            limit=RECENT_RUNS_PER_JOB))
    if job_name == BUILD_JOB:
        records += [r for r in instance.get_run_records(
            filters=dg.RunsFilter(job_name=ASSET_BACKFILL_JOB, statuses=statuses), limit=RECENT_RUNS_PER_JOB)
            if BUILD_TAG in r.dagster_run.tags]
        records.sort(key=lambda r: r.create_timestamp, reverse=True)
    return records


def _run_observations(instance: dg.DagsterInstance, job_names: list[str]) -> list[Observation]:
    observations = []
    for job_name in job_names:
        latest: dict[str, dg.DagsterRun] = {}
        for record in _finished_runs(instance, job_name):  # newest first
            tags = record.dagster_run.tags
            latest.setdefault(tags.get("dagster/partition/shard", tags.get("dagster/partition", "")),
                              record.dagster_run)
        for partition, run in sorted(latest.items()):
            failure = (_run_failure_summary(instance, run.run_id)
                       if run.status == dg.DagsterRunStatus.FAILURE else None)
            observations.append(Observation(
                key=f"job:{job_name}" + (f"[{partition}]" if partition else ""),
                failing=failure is not None,
                summary=(f"run {run.run_id[:8]} of {job_name} failed: {failure}" if failure
                         else f"run {run.run_id[:8]} of {job_name} {run.status.value.lower()}"),
                details={"job": job_name, "partition": partition or None, "run_id": run.run_id},
            ))
    return observations


def alert_sensor(job_names: list[str], checks: list[dg.AssetChecksDefinition]) -> dg.SensorDefinition:
    @dg.sensor(
        name="index_alerts", minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
        description="Sends an alert (structured log line; webhook and e-mail when configured) when a check or a "
        "job starts failing, and once more when it recovers; never again in between.",
    )
    def index_alerts(context: dg.SensorEvaluationContext, rag: Rag):
        observations = _check_observations(context.instance, checks) + _run_observations(context.instance, job_names)
        previous = json.loads(context.cursor) if context.cursor else {}
        alerts, state = transitions(previous, observations)
        sender = AlertSender(rag.settings().alerts, context.log)
        for alert in alerts:
            sender.send(alert)
        context.update_cursor(json.dumps(state, sort_keys=True))
        failing = sorted(key for key, is_failing in state.items() if is_failing)
        return dg.SkipReason(
            f"{len(alerts)} alerts sent; failing now: {', '.join(failing) or 'nothing'}"
        )

    return index_alerts
