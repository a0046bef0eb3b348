"""Long-lived worker processes that each work one item at a time within a wall-clock and a memory budget.

A worker that runs past its time, grows past its resident-memory limit or dies is killed and replaced, and the
supervisor is told which item it had in hand; the other workers go on. Memory is watched from outside (resident
set size, polled) rather than capped with an address-space rlimit, which breaks torch and onnxruntime: they
reserve far more address space than they ever touch.

The time budget is `seconds` plus `seconds_per_page` for each page the worker reports (rag_pipeline.workers.budget),
and the clock stops while the worker waits on an LLM or VLM endpoint.

With `isolated=False` items run in the caller's process, one after another and unbounded (for debugging).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Protocol

import psutil

from rag_pipeline.workers import budget

log = logging.getLogger(__name__)
POLL_SECONDS = 0.2  # how often a busy worker's memory is measured


class Runner(Protocol):
    """Work done in a worker: `setup` once per process (load models lazily there), `run` once per item."""

    def setup(self, *args: Any) -> Any: ...

    def run(self, state: Any, item: Any) -> Any: ...


@dataclass(frozen=True)
class Limits:
    seconds: float
    seconds_per_page: float
    memory_bytes: int


@dataclass(frozen=True)
class Finished:
    key: str
    result: Any


@dataclass(frozen=True)
class Failed:
    """The item raised, or its worker died or went over budget (`reason`: error, fatal (an error the runner
    names in its `fatal` tuple: the run should stop), crashed, timeout, memory)."""

    key: str
    reason: str
    detail: str


Event = Finished | Failed


def _exit_with_parent() -> None:
    """A worker outlives no supervisor: if it is killed (SIGKILL), the worker exits at once, whatever it is doing,
    rather than parse on without a budget after the run's locks are gone."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os._exit(1)

    threading.Thread(target=watch, name="supervisor-watch", daemon=True).start()


def _worker_main(channel: Connection, runner: Runner, setup_args: tuple[Any, ...]) -> None:
    _exit_with_parent()
    budget.attach(channel)
    state = None
    ready = False
    while True:
        try:
            item = channel.recv()
        except (EOFError, OSError):
            return  # the supervisor is gone
        if item is None:
            return
        if not ready:  # set up on the first item, so a worker that is never used loads nothing
            try:
                state, ready = runner.setup(*setup_args), True
            except Exception as exc:  # the environment, not the item: the run must stop, not dead-letter
                channel.send(("fatal", f"worker setup failed: {type(exc).__name__}: {exc}"))
                continue
        try:
            result = runner.run(state, item)
        except Exception as exc:
            kind = "fatal" if isinstance(exc, getattr(runner, "fatal", ())) else "error"
            channel.send((kind, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"))
        else:
            channel.send(("done", result))


def worker_context() -> Any:
    """Never fork the run's own process (it runs threads and torch). A fork server is a clean process that has
    imported the parsing modules once: each worker forks from it in milliseconds instead of importing them again
    (a fresh interpreter per worker cost seconds per run). Spawn where there is no fork server (Windows)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["rag_pipeline.stages.process"])
    return context


@dataclass
class _Slot:
    process: Any = None
    channel: Connection | None = None
    key: str | None = None
    started: float = 0.0
    paused_total: float = 0.0
    paused_since: float | None = None
    waiting: int = 0
    pages: int = 0
    peak_rss: int = 0
    measured_at: float = 0.0  # when its memory was last measured (a measurement walks /proc: not on every event)

    def clock(self, now: float) -> float:
        """Seconds of the item's budget used: wall time less the time spent waiting on endpoints."""
        paused = self.paused_total + (now - self.paused_since if self.paused_since is not None else 0.0)
        return now - self.started - paused


def _rss(process: psutil.Process) -> int:
    total = 0
    for proc in (process, *process.children(recursive=True)):
        with contextlib.suppress(psutil.Error):  # a child that exited between the listing and the read
            total += proc.memory_info().rss
    return total


class WorkerPool:
    def __init__(self, size: int, runner: Runner, setup_args: tuple[Any, ...], limits: Limits, *,
                 isolated: bool = True):
        self.size = max(1, size)
        self.runner = runner
        self.setup_args = setup_args
        self.limits = limits
        self.isolated = isolated
        self._slots = [_Slot() for _ in range(self.size)]
        self._context = worker_context()
        self._inline_state: Any = None
        self._inline_ready = False
        self._inline_events: list[Event] = []
        self.replaced = 0  # workers killed for their budget or found dead

    # --- submitting ---------------------------------------------------------------------------------------

    def idle(self) -> int:
        if not self.isolated:  # one item at a time, its event collected before the next is taken
            return 0 if self._inline_events else 1
        return sum(slot.key is None for slot in self._slots)

    def busy(self) -> int:
        return self.size - self.idle()

    def submit(self, key: str, item: Any) -> None:
        if not self.isolated:
            self._run_inline(key, item)
            return
        slot = next(s for s in self._slots if s.key is None)
        if slot.process is None or not slot.process.is_alive():
            self._spawn(slot)
        assert slot.channel is not None
        try:
            slot.channel.send(item)
        except (BrokenPipeError, OSError):  # it died between the check and the send: a new one takes the item
            self._kill(slot)
            self._spawn(slot)
            assert slot.channel is not None
            slot.channel.send(item)
        now = time.monotonic()
        slot.key, slot.started, slot.paused_total, slot.paused_since, slot.waiting, slot.pages = key, now, 0.0, None, 0, 0
        slot.measured_at = now

    def _spawn(self, slot: _Slot) -> None:
        if multiprocessing.current_process().daemon:
            raise RuntimeError(
                "this process is daemonic and may not start worker processes: run Dask workers with "
                "DASK_DISTRIBUTED__WORKER__DAEMON=False (or `dask worker --no-nanny`), or set execution.isolation "
                "false")
        parent_end, child_end = self._context.Pipe()
        process = self._context.Process(target=_worker_main, args=(child_end, self.runner, self.setup_args),
                                        name="rag-pipeline-worker")  # not daemonic: a parser may start processes
        process.start()
        child_end.close()
        slot.process, slot.channel = process, parent_end

    def _run_inline(self, key: str, item: Any) -> None:
        if not self._inline_ready:
            try:
                self._inline_state, self._inline_ready = self.runner.setup(*self.setup_args), True
            except Exception as exc:
                self._inline_events.append(Failed(key, "fatal", f"setup failed: {type(exc).__name__}: {exc}"))
                return
        try:
            self._inline_events.append(Finished(key, self.runner.run(self._inline_state, item)))
        except Exception as exc:
            log.exception("work on an item failed (the caller names it)")  # a key may be a hash of a path
            kind = "fatal" if isinstance(exc, getattr(self.runner, "fatal", ())) else "error"
            self._inline_events.append(Failed(key, kind, f"{type(exc).__name__}: {exc}"))

    # --- collecting ---------------------------------------------------------------------------------------

    def collect(self, timeout: float = POLL_SECONDS) -> list[Event]:
        """Events since the last call, waiting up to `timeout` for one; enforces every busy worker's budget."""
        if not self.isolated:
            events, self._inline_events = self._inline_events, []
            return events
        busy = [s for s in self._slots if s.key is not None]
        if not busy:
            return []
        ready = wait([s.channel for s in busy] + [s.process.sentinel for s in busy], timeout)
        events: list[Event] = []
        now = time.monotonic()
        for slot in busy:
            if slot.channel in ready or slot.process.sentinel in ready:
                event = self._read(slot, now)
                if event is not None:
                    events.append(event)
                    continue
            if slot.key is not None:
                event = self._enforce(slot, now)
                if event is not None:
                    events.append(event)
        return events

    def _read(self, slot: _Slot, now: float) -> Event | None:
        assert slot.channel is not None and slot.key is not None
        try:
            while slot.channel.poll():
                kind, value = slot.channel.recv()
                if kind == "pages":
                    slot.pages += value
                elif kind == "waiting":
                    slot.waiting += value
                    if slot.waiting > 0 and slot.paused_since is None:
                        slot.paused_since = now
                    elif slot.waiting <= 0 and slot.paused_since is not None:
                        slot.paused_total += now - slot.paused_since
                        slot.paused_since = None
                elif kind == "done":
                    return self._free(slot, Finished(slot.key, value))
                elif kind in ("error", "fatal"):
                    return self._free(slot, Failed(slot.key, kind, value))
        except (EOFError, OSError):
            pass  # the worker's end closed: it died, which the check below reports
        if not slot.process.is_alive():
            code = slot.process.exitcode
            why = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            return self._replace(slot, Failed(slot.key, "crashed", f"the worker process died ({why})"))
        return None

    def _enforce(self, slot: _Slot, now: float) -> Event | None:
        assert slot.key is not None
        allowed = self.limits.seconds + self.limits.seconds_per_page * slot.pages
        used = slot.clock(now)
        if used > allowed:
            return self._replace(slot, Failed(slot.key, "timeout", (
                f"still working after {used:.0f} s; the budget was {allowed:.0f} s (execution.document_timeout "
                f"{self.limits.seconds:.0f} s + execution.page_timeout {self.limits.seconds_per_page:.0f} s x "
                f"{slot.pages} pages)")))
        if now - slot.measured_at < POLL_SECONDS:
            return None
        slot.measured_at = now
        try:
            rss = _rss(psutil.Process(slot.process.pid))
        except psutil.Error:
            return None
        slot.peak_rss = max(slot.peak_rss, rss)
        if rss > self.limits.memory_bytes:
            return self._replace(slot, Failed(slot.key, "memory", (
                f"the worker's resident memory reached {rss / 2**20:,.0f} MiB; execution.worker_memory_mb is "
                f"{self.limits.memory_bytes / 2**20:,.0f}")))
        return None

    def _free(self, slot: _Slot, event: Event) -> Event:
        slot.key = None
        return event

    def _replace(self, slot: _Slot, event: Event) -> Event:
        """Kill the worker (and anything it started); a new one is spawned when the slot is next used."""
        self.replaced += 1
        self._kill(slot)
        slot.key = None
        return event

    def _kill(self, slot: _Slot) -> None:
        if slot.process is None:
            return
        with contextlib.suppress(psutil.Error):  # already gone, with its children
            for child in psutil.Process(slot.process.pid).children(recursive=True):
                child.kill()
        slot.process.kill()
        slot.process.join(10)
        if slot.channel is not None:
            slot.channel.close()
        slot.process, slot.channel = None, None

    def close(self) -> None:
        for slot in self._slots:
            if slot.process is None:
                continue
            if slot.key is None and slot.process.is_alive() and slot.channel is not None:
                with contextlib.suppress(OSError):  # it died while idle: killed below if still there
                    slot.channel.send(None)
                    slot.process.join(5)
            if slot.process.is_alive():
                self._kill(slot)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def auto_workers(configured: int, memory_bytes: int) -> int:
    """`configured`, or (0) one per usable core, no more than the machine's memory holds at `memory_bytes` each."""
    if configured:
        return configured
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    fits = max(1, psutil.virtual_memory().total // memory_bytes)
    return max(1, min(cores, fits))
