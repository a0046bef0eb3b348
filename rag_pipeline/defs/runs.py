"""The bridge between the CLI and Dagster: the instance the project prepares (DAGSTER_HOME with dagster-postgres
storage on the project's server) and runs of the code location's jobs, summarised for a shell."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import psycopg
import yaml

from rag_pipeline.config import Settings, SourceConfig
from rag_pipeline.defs.ingestion import STAGE_STATS
from rag_pipeline.defs.run_monitoring import fail_dead_runs, worker_tags
from rag_pipeline.endpoints.redaction import redact_credentials
from rag_pipeline.stages.preview import RefreshPreview
from rag_pipeline.store.database import sqlalchemy_url

log = logging.getLogger(__name__)


GENERATED_MARK = "# Written by rag_pipeline for its own Dagster instance; it is rewritten on every run."
# The variable a generated dagster.yaml reads Dagster's database URL from when the URL holds a password: the file
# never holds a secret in clear. The CLI sets it for the Dagster processes it starts.
DAGSTER_URL_VARIABLE = "RAG_DAGSTER_POSTGRES_URL"


def prepare_dagster_home(settings: Settings, dagster_url: str) -> Path:
    """The Dagster instance runs go to, with DAGSTER_HOME pointing at it.

    The project's own home (`data_dir/dagster_home`, used when DAGSTER_HOME is not set) gets a generated
    dagster.yaml: runs, event log and schedules in Postgres beside the index; one run that writes the index at a
    time (the index writer pool, at run granularity); run monitoring with a launcher that can tell a dead run
    worker (rag_pipeline.defs.run_monitoring), so a killed run is marked failed instead of holding the pool. A DAGSTER_HOME
    set by an operator is theirs: its dagster.yaml is never written, whatever it holds (or lacks)."""
    home = settings.dagster_home
    own_home = (settings.data_dir / "dagster_home").resolve()
    target = home / "dagster.yaml"
    if home.resolve() != own_home:
        if not target.exists():
            log.warning("DAGSTER_HOME=%s has no dagster.yaml: Dagster keeps runs in its default storage there. "
                        "Unset DAGSTER_HOME to use the project's instance (runs in Postgres beside the index).", home)
        os.environ["DAGSTER_HOME"] = str(home)
        return home
    if target.exists() and not _generated_here(target.read_text()):
        log.warning("%s was not written by rag_pipeline: it is left as it is", target)
    else:
        home.mkdir(parents=True, exist_ok=True)
        postgres_url: Any = sqlalchemy_url(dagster_url)
        if {"password", "sslpassword"} & set(psycopg.conninfo.conninfo_to_dict(dagster_url)):
            os.environ[DAGSTER_URL_VARIABLE] = postgres_url
            postgres_url = {"env": DAGSTER_URL_VARIABLE}
        config = {
            "storage": {"postgres": {"postgres_url": postgres_url}},
            "telemetry": {"enabled": False},
            "nux": {"enabled": False},  # no welcome pop-up over the first page a new user opens
            "run_launcher": {"module": "rag_pipeline.defs.run_monitoring", "class": "LocalRunLauncher"},
            "run_monitoring": {"enabled": True, "poll_interval_seconds": RUN_MONITORING_POLL_SECONDS,
                               "max_resume_run_attempts": 0},
            # A run launched from the UI waits in the queue until the daemon's next look (Dagster's default: every
            # 5 s, most of what a UI no-op costs over the CLI); one query a second is nothing to the database.
            "run_coordinator": {"module": "dagster.core.run_coordinator", "class": "QueuedRunCoordinator",
                                "config": {"dequeue_interval_seconds": RUN_DEQUEUE_SECONDS}},
            "concurrency": {
                "runs": {"max_concurrent_runs": 4},
                # Every asset and op that writes the index is in this pool: a run of any job or asset
                # selection that holds one ("Materialize all" included) waits for the run before it.
                "pools": {"granularity": "run", "default_limit": 1},
            },
        }
        text = f"{GENERATED_MARK}\n{yaml.safe_dump(config, sort_keys=False)}"
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
    os.environ["DAGSTER_HOME"] = str(home)
    _create_dagster_storage(dagster_url)
    return home


def _generated_here(text: str) -> bool:
    """Written by rag_pipeline: marked, or (written before the mark existed) exactly the keys it wrote then."""
    if text.startswith(GENERATED_MARK):
        return True
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError:
        return False
    return (isinstance(config, dict) and set(config) == {"storage", "telemetry", "run_queue"}
            and set(config["storage"] or {}) == {"postgres"} and config["telemetry"] == {"enabled": False})


RUN_DEQUEUE_SECONDS = 1
RUN_MONITORING_POLL_SECONDS = 10  # a killed run is marked failed within about this long (plus a daemon tick)

DAGSTER_SCHEMA_LOCK = 0x7261675F64616773  # "rag_dags": an advisory lock key of its own


# The table each of Dagster's Postgres storages (runs, event log, schedules) checks for before it creates its own.
DAGSTER_STORAGE_TABLES = ("runs", "instance_info", "event_logs", "jobs")


def _create_dagster_storage(dagster_url: str) -> None:
    """Let one process at a time create Dagster's tables: two first runs started together (two CLIs, a CLI and
    the daemon) would both issue CREATE TABLE and one would fail on "already exists". Once they exist (every run
    after the first) one query says so, instead of an instance built for nothing (half a second)."""
    import dagster as dg

    from rag_pipeline.store.database import advisory_lock, tables_exist

    if tables_exist(dagster_url, DAGSTER_STORAGE_TABLES):
        return
    with advisory_lock(dagster_url, DAGSTER_SCHEMA_LOCK), dg.DagsterInstance.get() as instance:
        instance.get_runs(limit=1)  # storage is created (or found) by now


def _run_instance(settings: Settings) -> Any:
    """The prepared instance for a run in this process (the CLI's). A run writes some seventy events and reads
    hundreds of rows back, and Dagster's Postgres storage opens a connection for each statement (its NullPool keeps
    a long-lived instance from holding connections), which is a server process started per statement: 0.8 s of a
    3 s no-op. This process ends with the run, so it holds a small pool as Dagster's webserver does. Only the
    instance the project generated: an operator's dagster.yaml keeps its storage settings."""
    import dagster as dg

    from rag_pipeline.store.database import resolve_urls, statement_timeout_ms

    instance = dg.DagsterInstance.get()
    generated = settings.data_dir / "dagster_home" / "dagster.yaml"
    if not (settings.dagster_home.resolve() == generated.parent.resolve() and generated.exists()
            and _generated_here(generated.read_text())):
        return instance
    storages = (instance.run_storage, instance.event_log_storage, instance.schedule_storage)
    if not all(hasattr(storage, "_engine") for storage in storages):
        return instance  # storage of another shape than dagster-postgres': left as it is
    # The pool sets statement_timeout on each connection: the one the server gives Dagster's sessions now (its
    # configuration, the role's or the database's, the URL's options), so pooling changes nothing there.
    instance.optimize_for_webserver(statement_timeout=statement_timeout_ms(resolve_urls(settings).dagster),
                                    pool_recycle=RUN_POOL_RECYCLE_SECONDS, max_overflow=RUN_POOL_OVERFLOW)
    for storage in storages:
        # A pooled connection is tested before each use (SQLAlchemy's pre-ping) and replaced if dead: a database
        # restarted under a run must not hand the run's failure event a dead connection, or the run ends without
        # its failure recorded (Dagster's webserver pools without it; its requests can simply be retried).
        storage._engine.pool._pre_ping = True
    return instance


# A pooled connection older than this is replaced when next used: one idle through a long parse is never reused
# after a firewall, proxy or idle_session_timeout has dropped it (a no-op's statements all fit in one connection).
RUN_POOL_RECYCLE_SECONDS = 60
RUN_POOL_OVERFLOW = 4  # the run's thread and the index thread's progress reports: rarely more


def summarize_run(result: Any) -> dict[str, Any]:
    """One flat summary of the stats each asset reported (the `ingest --json` contract)."""
    reported: dict[str, dict[str, Any]] = {}
    for event in result.get_asset_materialization_events():
        materialization = event.event_specific_data.materialization
        entry = materialization.metadata.get("stats")
        if entry is not None:
            reported[materialization.asset_key.path[-1]] = entry.value  # the asset's name, under any prefix
    summary: dict[str, Any] = {"run_id": result.run_id, "success": result.success}
    seconds: dict[str, float] = {}
    for asset, (stage, stats_class) in STAGE_STATS.items():
        values = {**stats_class().summary(), **reported.get(asset, {})}
        summary.update({name: values[name] for name in stats_class.SUMMARY})
        seconds[stage] = reported.get(asset, {}).get("seconds", 0.0)
    summary["checks"] = {
        evaluation.check_name: {"passed": evaluation.passed, "severity": evaluation.severity.value,
                                "summary": evaluation.description}
        for evaluation in result.get_asset_check_evaluations()
    }
    summary["seconds"] = seconds
    return summary


# psycopg's classes for a connection that broke or could not be made (OperationalError and its kin).
_CONNECTION_ERRORS = frozenset({
    "OperationalError", "InterfaceError", "AdminShutdown", "CrashShutdown", "CannotConnectNow",
    "ConnectionException", "ConnectionFailure", "ConnectionDoesNotExist", "SqlclientUnableToEstablishSqlconnection",
})


def _root_cause(error: Any) -> str:
    """The innermost error Dagster wrapped ("Error occurred while executing op" says nothing)."""
    while getattr(error, "cause", None) is not None:
        error = error.cause
    message = redact_credentials(" ".join(str(error.message).split()))  # printed by the CLI: no credential
    if error.cls_name in _CONNECTION_ERRORS:
        message = f"lost the database connection ({message}); nothing half-written is kept, run again"
    return message


def command_line_sources_checked(settings: Settings, sources: list[str] | None, labels: list[str] | None,
                                 confirm_deletions: list[str] | None) -> list[SourceConfig]:
    """The NAME=PATH folders of a command line, refused where they would redefine a configured source, and a
    --confirm-deletions that names no source refused."""
    from rag_pipeline.config import ConfigError, parse_labels
    from rag_pipeline.defs.ingestion import confirmable_sources

    adhoc = [SourceConfig.from_cli(spec, parse_labels(labels)) for spec in sources or []]
    clashes = sorted({s.name for s in adhoc} & {s.name for s in settings.sources})
    if clashes:  # a command line must not redefine a configured source's folder or labels
        raise ConfigError(f"--source {', '.join(clashes)}: a configured source has that name; pick another name")
    unknown = sorted(set(confirm_deletions or []) - {s.name for s in adhoc}
                     - set(confirmable_sources(settings, confirm_deletions or [])))
    if unknown:  # a typo must not look like a confirmation that was given
        raise ConfigError(f"--confirm-deletions {', '.join(unknown)}: no such source (configured: "
                          f"{', '.join(s.name for s in settings.sources) or 'none'})")
    return adhoc


def preview_ingest(settings: Settings, sources: list[str] | None = None, labels: list[str] | None = None,
                   confirm_deletions: list[str] | None = None) -> RefreshPreview:
    """What `run_ingest` with these arguments would do (stages.preview), without a Dagster run: nothing is written
    to the index, nor to Dagster's storage."""
    from rag_pipeline.config import ConfigError
    from rag_pipeline.stages.discover import refreshed_sources
    from rag_pipeline.stages.preview import preview
    from rag_pipeline.store.database import connect, resolve_urls, schema_behind

    adhoc = command_line_sources_checked(settings, sources, labels, confirm_deletions)
    url = resolve_urls(settings).index  # started if embedded; not migrated: a dry run writes nothing
    behind = schema_behind(url)
    if behind:
        raise ConfigError(f"the index database is not at this code's schema ({', '.join(behind)} to apply): run "
                          "`rag-pipeline migrate` (or a refresh) first; a dry run writes nothing, migrations included")
    if adhoc:
        return preview(url, adhoc, confirm_deletions or [])
    with connect(url) as conn:
        known, removed = refreshed_sources(conn, settings.sources)
    if not known and not removed:
        raise ConfigError("sources: none configured; add them to rag_pipeline.yaml or pass --source NAME=PATH")
    return preview(url, list(known.values()), confirm_deletions or [], removed)


def run_ingest(
    settings: Settings,
    sources: list[str] | None = None,
    labels: list[str] | None = None,
    instance: Any = None,
    log_level: str = "INFO",
    confirm_deletions: list[str] | None = None,
) -> dict[str, Any]:
    """Run the `ingest` job through Dagster against `instance` (the prepared one by default). `sources` are
    NAME=PATH folders from the command line (with default `labels`), scanned instead of the configured ones."""
    from rag_pipeline.config import ConfigError
    from rag_pipeline.defs.code_location import build_definitions
    from rag_pipeline.defs.ingestion import command_line_sources

    adhoc = command_line_sources_checked(settings, sources, labels, confirm_deletions)
    run_config = {
        "ops": {"source_documents": {"config": {"confirm_deletions": confirm_deletions or []}}},
        "loggers": {"console": {"config": {"log_level": log_level}}},
    }
    if instance is None:
        instance = _run_instance(settings)
    fail_dead_runs(instance)  # a killed earlier run must not hold the index writer pool
    if settings.execution.executor != "default":
        if adhoc:
            raise ConfigError("--source: a distributed run scans configured sources only (its steps run in other "
                              "processes); add the folder to the configuration's sources")
        return _run_distributed(settings, run_config, instance)
    job = build_definitions(settings).resolve_job_def("ingest")
    with command_line_sources(adhoc):
        result = job.execute_in_process(run_config=run_config, instance=instance, raise_on_error=False,
                                        tags=worker_tags())
    return _summary_with_errors(result)


def _run_distributed(settings: Settings, run_config: dict[str, Any], instance: Any) -> dict[str, Any]:
    """Run `ingest` on the configured executor: its steps run in other processes (machines), which rebuild the
    job from the same configuration file ($RAG_CONFIG)."""
    import dagster as dg

    from rag_pipeline.config import ConfigError
    from rag_pipeline.defs.code_location import configured_ingest_job

    if settings.config_file is None:
        raise ConfigError("execution.executor: a distributed run needs a configuration file (--config or RAG_CONFIG) "
                          "that every machine reads")
    os.environ["RAG_CONFIG"] = str(settings.config_file)
    with dg.execute_job(dg.reconstructable(configured_ingest_job), instance=instance, run_config=run_config,
                        raise_on_error=False, tags=worker_tags()) as result:
        return _summary_with_errors(result)


def _summary_with_errors(result: Any) -> dict[str, Any]:
    summary = summarize_run(result)
    if not result.success:
        summary["errors"] = [
            f"{event.step_key}: {_root_cause(event.event_specific_data.error)}"
            for event in result.all_events
            if event.is_step_failure and event.event_specific_data and event.event_specific_data.error
        ]
    return summary


def run_index_build(settings: Settings, model: str, instance: Any = None) -> dict[str, Any]:
    """Start building a version for `model` beside the active one and backfill its shards through Dagster, as a
    backfill of that version's partitions.

    The shards run here one after another, each a run of the backfill; the backfill is recorded once they have
    run (no daemon runs it again). From the UI, start_index_build launches the same backfill for the daemon, which
    spreads the shards over the run launcher.
    """
    from dagster._core.storage.tags import BACKFILL_ID_TAG

    from rag_pipeline import store
    from rag_pipeline.defs.code_location import build_definitions
    from rag_pipeline.defs.index_versions import (
        backfill_asset_key,
        build_backfill,
        build_partition_keys,
        record_finished_backfill,
    )
    from rag_pipeline.lifecycle.blue_green import start_version_build
    from rag_pipeline.store.database import connect, resolve_urls

    db_url = resolve_urls(settings).index
    version = start_version_build(db_url, settings, model)
    definitions = build_definitions(settings)
    job = definitions.resolve_job_def("build_index_version")
    if instance is None:
        instance = _run_instance(settings)
    fail_dead_runs(instance)
    graph = definitions.get_repository_def().asset_graph
    key = backfill_asset_key(settings)
    # The worker's tags go on the runs only: a backfill's tags go to every run a re-execution from the UI launches,
    # which this process's worker tag would mark dead.
    backfill = build_backfill(instance, graph, key, version.label, {})
    runs = []
    try:
        for partition in build_partition_keys(version.label):
            result = job.execute_in_process(
                instance=instance, partition_key=partition, raise_on_error=False,
                tags={**backfill.tags, **worker_tags(), BACKFILL_ID_TAG: backfill.backfill_id},
                run_config={"loggers": {"console": {"config": {"log_level": "INFO"}}}},
            )
            runs.append({"shard": partition.keys_by_dimension["shard"], "partition": str(partition),
                         "run_id": result.run_id, "success": result.success})
    finally:  # recorded whatever stopped it: its runs name it, and a shard never run counts as failed
        done = {run["partition"] for run in runs if run["success"]}
        record_finished_backfill(instance, graph, backfill, key,
                                 [str(p) for p in build_partition_keys(version.label) if str(p) not in done])
    # The last shard to finish marks the version ready (as a backfill launched from the UI does).
    with connect(db_url) as conn:
        built = store.versions.get_version(conn, version.version_id)
    return {"version": version.version_id, "model": version.embedding_model, "dimensions": version.dimensions,
            "rows": built.row_count if built else 0, "status": built.status if built else "dropped",
            "backfill": backfill.backfill_id,
            "shards": runs, "success": all(r["success"] for r in runs)}
