"""What every stage shares: its statistics, progress reporting, and the write lock with timing around it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

from rag_pipeline.store.database import index_write_lock

log = logging.getLogger("rag_pipeline.stages")
Progress = Callable[[str], None]


def log_progress(message: str) -> None:
    log.info(message)


@dataclass
class StageStats:
    seconds: float = 0.0
    # The fields that go into the ingest run's summary (`rag-pipeline ingest --json`).
    SUMMARY: ClassVar[tuple[str, ...]] = ()

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.SUMMARY}

    def add(self, other: StageStats) -> None:
        """Add another worker's counts (numbers summed, per-key counts summed, lists joined; `seconds` is the
        stage's own wall time and stays)."""
        for item in fields(self):
            if item.name == "seconds":
                continue
            mine, theirs = getattr(self, item.name), getattr(other, item.name)
            if isinstance(mine, bool) or isinstance(mine, str):
                setattr(self, item.name, mine or theirs)
            elif isinstance(mine, int | float):
                setattr(self, item.name, mine + theirs)
            elif isinstance(mine, dict):
                for key, value in theirs.items():
                    mine[key] = mine.get(key, 0) + value if isinstance(value, int | float) else mine.get(key, value)
            elif isinstance(mine, list):
                mine.extend(theirs)


def count(mapping: dict[str, int], key: str, amount: int = 1) -> None:
    mapping[key] = mapping.get(key, 0) + amount


@contextmanager
def locked_stage(
    db_url: str, holder: str, stats: StageStats, *, timeout_seconds: float, progress: Progress,
    shared: bool = False,
) -> Iterator[None]:
    """Hold the index write lock for the stage (refreshes exclusively, backfill shards shared) and record the
    stage's time, the wait for the lock excluded."""
    with index_write_lock(db_url, holder, shared=shared, timeout_seconds=timeout_seconds, progress=progress):
        started = time.perf_counter()
        try:
            yield
        finally:
            stats.seconds = time.perf_counter() - started
