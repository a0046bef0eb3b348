"""A runner for worker-pool tests. It lives in a module (not a test) so spawned worker processes import it."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from rag_pipeline.workers import budget


class ScriptedRunner:
    """Does what each item says: finish, sleep, hold memory, die, wait on an "endpoint", report pages."""

    def setup(self, marker: str) -> dict[str, Any]:
        return {"marker": marker, "pid": os.getpid()}

    def run(self, state: dict[str, Any], item: tuple[str, float]) -> Any:
        kind, amount = item
        if kind == "sleep":
            time.sleep(amount)
        elif kind == "allocate":  # touch every page, as a parser building a huge structure would
            block = bytearray(int(amount) * 2**20)
            block[::4096] = b"x" * len(block[::4096])
            time.sleep(5)
        elif kind == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        elif kind == "endpoint":
            with budget.waiting_on_endpoint():
                time.sleep(amount)
        elif kind == "pages":
            for _ in range(10):
                budget.pages_parsed()
            time.sleep(amount)
        elif kind == "raise":
            raise ValueError("a parser bug")
        return (state["marker"], state["pid"])


