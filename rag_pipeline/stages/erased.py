"""What a scan holds because it was erased: an erased document whose file is still, or again, at its source is
held (`held_erased`), nothing of it parsed or served, until `rag-pipeline erase --undo` re-admits it
(rag_pipeline.lifecycle.erasure records that)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import psycopg

from rag_pipeline import store
from rag_pipeline.domain.erasure import ERASURE_KEY_ENV, ErasureError, erasure_key, subject
from rag_pipeline.domain.status import DocumentStatus
from rag_pipeline.sources.folders import DiscoveredFile


class ErasedGate:
    """What a scan holds because it was erased: each document found whose HMAC names a document erased and not
    re-admitted. Without the key (and with erasures recorded) nothing can be recognised, so every document the
    scan finds that is new or held is held instead ("not checked"), until a scan with the key judges it."""

    def __init__(self, conn: psycopg.Connection, source: str):
        self.erased = store.erasure.erased_subjects(conn)
        self.key: bytes | None = None
        self.known: set[str] = set()
        self.not_checked = 0  # held for want of the key: the scan reports them (a silent hold would look like a bug)
        if self.erased:
            try:
                self.key = erasure_key()
            except ErasureError:
                self.known = store.erasure.known_ids(conn, source)

    def __call__(self, files: Iterable[DiscoveredFile]) -> Iterator[DiscoveredFile]:
        for found in files:
            reason = self.reason(found.doc_id) if found.held is None and self.erased else None
            yield found if reason is None else dataclasses.replace(
                found, held=(DocumentStatus.HELD_ERASED, reason), acl_labels=(), title=None, metadata={})

    def reason(self, doc_id: str) -> str | None:
        if self.key is not None:
            return ERASED_REASON if subject(self.key, doc_id) in self.erased else None
        if doc_id in self.known:
            return None
        self.not_checked += 1
        return NOT_CHECKED_REASON.format(len(self.erased))


ERASED_REASON = ("erased on request and back at its source: held, nothing of it parsed or served, until "
                 "`rag-pipeline erase --undo --doc SOURCE:PATH` re-admits it")
NOT_CHECKED_REASON = ("new, and not checked against {} erased documents: " + ERASURE_KEY_ENV + " is not set where "
                      "this scan ran; held until a scan with the key")
