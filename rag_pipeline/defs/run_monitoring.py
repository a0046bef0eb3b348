"""Runs whose process died do not block anything.

A Dagster run that is killed (`kill -9`, an OOM kill, a machine that reboots) stays STARTED in Dagster's storage:
nothing is left to write its failure. Under the one-writer rule (a run that writes the index takes the only slot
of the `rag_pipeline_index_writer` pool) every queued ingest would wait for it for ever. Two things mark such
runs failed, with the reason in the run's log:

- `LocalRunLauncher`, the run launcher of the instance the project generates: Dagster's launcher for runs on
  this machine, with the worker health check Dagster's run monitoring needs (the stock one has none), so the
  daemon marks a dead run failed within run_monitoring.poll_interval_seconds;
- `fail_dead_runs`, which the CLI calls before it starts a run: its own earlier runs whose process is gone.

A run's worker is known from the `rag_pipeline/run_worker` tag the CLI sets on its runs (host, pid, process
start time), or, for a run LocalRunLauncher started (it tags the run with its host), from the pid the run worker
reports in its first engine event. A run of any other launcher or machine is never judged from here, and a pid
alone is not proof: a process that started after the run is another process that reuses the pid.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter
from dagster._core.events import DagsterEventType
from dagster._core.launcher import CheckRunHealthResult, DefaultRunLauncher, WorkerStatus

log = logging.getLogger(__name__)

RUN_WORKER_TAG = "rag_pipeline/run_worker"
LAUNCH_HOST_TAG = "rag_pipeline/launch_host"  # set by LocalRunLauncher: its run workers run on this host
INDEX_WRITER_POOL = "rag_pipeline_index_writer"
# A process's start time and the run's, as two clocks read a moment apart.
START_SLACK_SECONDS = 2.0


@dataclass(frozen=True)
class Worker:
    host: str
    pid: int
    started_at: float | None  # the process's start time (epoch seconds), when known


def _process_started_at(pid: int) -> float | None:
    import psutil

    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return process.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def worker_tags() -> dict[str, str]:
    """Tags that name this process as the run's worker (for the runs the CLI executes in process)."""
    pid = os.getpid()
    return {RUN_WORKER_TAG: f"{socket.gethostname()}:{pid}:{_process_started_at(pid) or 0:.3f}"}


def run_worker(instance: DagsterInstance, run: DagsterRun) -> Worker | None:
    """Who runs `run`: from its tag, else (a run LocalRunLauncher started) from the pid its worker reported."""
    tag = run.tags.get(RUN_WORKER_TAG)
    if tag:
        try:
            host, pid, started_at = tag.rsplit(":", 2)
            return Worker(host, int(pid), float(started_at) or None)
        except ValueError:
            return None
    host = run.tags.get(LAUNCH_HOST_TAG)
    if host is None:  # another launcher's run (another machine, a container): not ours to judge
        return None
    for record in instance.all_logs(run.run_id, of_type=DagsterEventType.ENGINE_EVENT)[:20]:
        event = record.dagster_event
        data = getattr(event, "event_specific_data", None) if event else None
        pid = getattr(data, "metadata", {}).get("pid") if data is not None else None
        if pid is not None and str(getattr(pid, "value", pid)).isdigit():
            return Worker(host, int(getattr(pid, "value", pid)), None)
    return None


def worker_gone(instance: DagsterInstance, run: DagsterRun) -> str | None:
    """Why the run's worker process is known to be gone, or None (alive, or not knowable from here)."""
    worker = run_worker(instance, run)
    if worker is None or worker.host != socket.gethostname():
        return None
    started_at = _process_started_at(worker.pid)
    if started_at is None:
        return f"its worker process {worker.pid} on {worker.host} is gone"
    if worker.started_at is not None:
        if abs(started_at - worker.started_at) > START_SLACK_SECONDS:
            return f"its worker process {worker.pid} is gone (the pid now belongs to another process)"
        return None
    record = instance.get_run_record_by_id(run.run_id)
    run_started = record.start_time if record is not None else None
    if run_started is not None and started_at > run_started + START_SLACK_SECONDS:
        return f"its worker process {worker.pid} is gone (the pid now belongs to a later process)"
    return None


def fail_dead_runs(instance: DagsterInstance) -> list[str]:
    """Mark failed the started runs of this machine whose worker process is gone; returns their ids."""
    failed = []
    for record in instance.get_run_records(RunsFilter(statuses=[DagsterRunStatus.STARTED,
                                                                 DagsterRunStatus.STARTING])):
        run = record.dagster_run
        reason = worker_gone(instance, run)
        if reason is None:
            continue
        message = f"rag_pipeline marked this run failed: {reason} (killed?)"
        log.warning("run %s: %s", run.run_id, message)
        instance.report_run_failed(run, message)
        failed.append(run.run_id)
    return failed


class LocalRunLauncher(DefaultRunLauncher):
    """Dagster's DefaultRunLauncher (a run worker process on this machine per run), with the worker health check
    that lets Dagster's run monitoring mark a run whose process died as failed."""

    def launch_run(self, context: Any) -> None:
        # Before the worker exists: the health check trusts the pid it will report only for runs of this host.
        self._instance.add_run_tags(context.dagster_run.run_id, {LAUNCH_HOST_TAG: socket.gethostname()})
        super().launch_run(context)

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        reason = worker_gone(self._instance, run)
        if reason is not None:
            return CheckRunHealthResult(WorkerStatus.FAILED, reason)
        # Alive, or not knowable from this machine: never fail a run on a guess.
        return CheckRunHealthResult(WorkerStatus.RUNNING)

    @classmethod
    def from_config_value(cls, inst_data: Any, config_value: Any) -> LocalRunLauncher:
        return cls(inst_data=inst_data)
