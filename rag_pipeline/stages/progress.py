"""Progress of long stages: documents done out of a total, a rate, and an ETA, reported every few seconds.

Each report is one line for the run log, and also a `Snapshot` for anyone listening in this process (the CLI
draws its progress bar from them). The total is what was done plus what is still queued, read from the
database at each report: work another worker (or machine) takes from the same queue is counted too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Snapshot:
    stage: str
    done: int  # documents finished by this run
    total: int  # done + still queued
    units: int  # pages parsed, chunks embedded, ...
    unit: str
    seconds: float

    @property
    def rate(self) -> float:
        return self.units / self.seconds if self.seconds > 0 else 0.0

    @property
    def eta_seconds(self) -> float | None:
        left = self.total - self.done
        if left <= 0:
            return 0.0
        if not self.done or self.seconds <= 0:
            return None
        return left * self.seconds / self.done

    def line(self) -> str:
        eta = self.eta_seconds
        return (f"{self.stage}: {self.done:,}/{self.total:,} documents, {self.units:,} {self.unit} "
                f"({self.rate:,.1f} {self.unit}/s), ETA {format_duration(eta) if eta is not None else 'unknown'}")


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


Listener = Callable[[Snapshot], None]
_listeners: list[Listener] = []
_listeners_lock = threading.Lock()


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Receive every snapshot reported in this process while the block runs."""
    with _listeners_lock:
        _listeners.append(listener)
    try:
        yield
    finally:
        with _listeners_lock:
            _listeners.remove(listener)


class Reporter:
    """Reports a stage's snapshot at most every `interval` seconds (and always when asked to `finish`)."""

    def __init__(self, stage: str, unit: str, interval: float, log: Callable[[str], None], *,
                 steady_total: bool = False):
        self.stage, self.unit, self.interval, self.log = stage, unit, interval, log
        self.started = time.monotonic()
        self._last = self.started
        # steady_total: the total never grows between reports (what is done and what is left are read a moment
        # apart, so a document finishing in between could count twice); it is never less than what is done.
        self._steady = steady_total
        self._total: int | None = None

    def due(self) -> bool:
        return time.monotonic() - self._last >= self.interval

    def report(self, done: int, left: int, units: int) -> Snapshot:
        now = time.monotonic()
        self._last = now
        total = done + max(0, left)
        if self._steady and self._total is not None:
            total = max(done, min(total, self._total))
        self._total = total
        snapshot = Snapshot(self.stage, done, total, units, self.unit, now - self.started)
        self.log(snapshot.line())
        with _listeners_lock:
            listeners = list(_listeners)
        for listener in listeners:
            listener(snapshot)
        return snapshot
