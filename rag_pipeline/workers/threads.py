"""How many compute threads each process may run, so parse workers and the run's embedder share the cores
instead of each sizing its thread pools to the whole machine.

onnxruntime (layout, table structure, OCR) and torch (Docling, the embedder) each start one thread per core by
default. With one parse worker per core and the run's own process embedding at the same time, a 2-core machine
ran six busy threads on two cores: every tier paid for the switching. A worker's models read `compute_threads()`
when they are built; the run's process bounds torch while its workers are alive.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

UNBOUNDED = -1  # the libraries' own choice: one thread per core

_compute_threads = UNBOUNDED
# The OpenMP and BLAS pools torch and numpy start read these once, when they load.
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@dataclass(frozen=True)
class ThreadBudget:
    per_worker: int
    embedder: int


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def thread_budget(workers: int, configured_per_worker: int = 0, cores: int | None = None) -> ThreadBudget:
    """Threads for each of `workers` parse workers and for the embedder beside them: the configured number per
    worker, or (0) the cores shared out over the workers and the embedder; never fewer than one."""
    cores = cores or usable_cores()
    per_worker = configured_per_worker or max(1, cores // (workers + 1))
    return ThreadBudget(per_worker=per_worker, embedder=max(1, cores - workers * per_worker))


def compute_threads() -> int:
    """This process's bound for a model's intra-op threads (UNBOUNDED unless `bound_compute_threads` set one)."""
    return _compute_threads


def bound_compute_threads(threads: int) -> None:
    """Bound this process's compute threads, for the models it builds from now on (a worker, before it loads its
    parsers) and for torch if it is loaded already."""
    global _compute_threads
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    _compute_threads = threads
    for name in _THREAD_VARIABLES:
        os.environ[name] = str(threads)
    torch = _loaded_torch()
    if torch is not None:
        torch.set_num_threads(threads)


_torch_bound: int | None = None  # the run's embedder bound while parse workers are alive (torch_threads)


def _loaded_torch() -> Any:
    """torch if it is imported and initialised; None while another thread is still importing it (its loader then
    applies the bound: apply_torch_bound)."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and hasattr(torch, "set_num_threads") and hasattr(torch, "get_num_threads") \
        else None


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op threads bounded for the block (the run's embedder while parse workers share the cores),
    then restored; a model that loads torch during the block applies the bound itself (apply_torch_bound)."""
    global _torch_bound
    torch = _loaded_torch()
    before = torch.get_num_threads() if torch is not None else None
    _torch_bound = threads
    apply_torch_bound()
    try:
        yield
    finally:
        _torch_bound = None
        torch = _loaded_torch()
        if torch is not None:
            torch.set_num_threads(before or usable_cores())


def embedder_threads() -> int:
    """The bound on this process's embedder now: torch_threads' while parse workers run beside it, else this
    process's compute bound (UNBOUNDED: the library's own choice). An ONNX Runtime session reads it when made."""
    return _torch_bound if _torch_bound is not None else _compute_threads


def apply_torch_bound() -> None:
    """Bound torch as torch_threads says, if it is loaded and a bound is in force (called by whatever loads it)."""
    torch = _loaded_torch()
    if torch is not None and _torch_bound is not None:
        torch.set_num_threads(_torch_bound)
