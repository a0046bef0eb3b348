"""What a worker process tells its supervisor about the document in hand (rag_pipeline.workers.pool).

Each page parsed adds `execution.page_timeout` to the document's time budget (a 300-page filing may take longer
than a memo), and time spent waiting on an LLM or VLM endpoint is not counted at all: a slow endpoint leaves a
document queued through its own timeout, it never dead-letters it. Outside a worker process these are no-ops.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_channel: Any = None  # the worker's end of its pipe to the supervisor
_lock = threading.Lock()  # VLM pages are escalated from several threads at once


def attach(channel: Any) -> None:
    global _channel
    _channel = channel


def _send(message: tuple[str, int]) -> None:
    if _channel is not None:
        with _lock:
            _channel.send(message)


def pages_parsed(count: int = 1) -> None:
    _send(("pages", count))


@contextmanager
def waiting_on_endpoint() -> Iterator[None]:
    _send(("waiting", 1))
    try:
        yield
    finally:
        _send(("waiting", -1))
