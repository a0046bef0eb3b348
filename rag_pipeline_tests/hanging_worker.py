"""The real document runner with two hostile documents. It lives in a module (not a test) so spawned worker
processes import it."""

from __future__ import annotations

import time
from typing import Any

from rag_pipeline.stages.process import DocumentRunner, DocumentTask, TaskResult


class HangingRunner(DocumentRunner):
    """The real runner, except that a document whose name starts with "hang" never finishes (a parser stuck in
    a loop), and "bloat" grows its worker's memory without bound."""

    def run(self, state: Any, task: DocumentTask) -> TaskResult:
        name = task.doc.rel_path
        if name.startswith("hang"):
            time.sleep(3600)
        if name.startswith("bloat"):
            blocks = []
            while True:
                block = bytearray(64 * 2**20)
                block[::4096] = b"x" * len(block[::4096])
                blocks.append(block)
                time.sleep(0.05)
        return super().run(state, task)
