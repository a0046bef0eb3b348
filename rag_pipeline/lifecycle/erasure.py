"""Erasure on request: a document (or a whole source) removed from everything the pipeline keeps, with an audit
record that proves it happened without keeping what was erased.

`rag-pipeline erase --doc SOURCE:PATH | --source NAME` removes, under the index write lock and in one
transaction: the document's rows in every index version (retired ones kept for rollback included), its chunks,
pages, prefix cache, dead letters and deletion-log entries, the document row, and the embedding-cache entries its
rows used that nothing else uses. Near-duplicates it answered for get rows of their own (from the cache).
The audit record (`erasures`) holds the time, what was removed per table, and the document's id under an
HMAC-SHA256 keyed from the environment (RAG_PIPELINE_ERASURE_KEY): a plain hash of a path could be confirmed
by guessing the path. `deletion_replay` checks, with the same key, that no erased document has a row anywhere.

A file that is still at its source comes back on the next scan: erase it at the source first (or remove the
source from the configuration) for the erasure to last.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from rag_pipeline import store
from rag_pipeline.store.database import connect, index_write_lock

ERASURE_KEY_ENV = "RAG_PIPELINE_ERASURE_KEY"
MIN_KEY_CHARS = 16


class ErasureError(RuntimeError):
    """Erasure cannot run (no key, nothing to erase); nothing was changed."""


def erasure_key() -> bytes:
    key = os.environ.get(ERASURE_KEY_ENV, "")
    if len(key) < MIN_KEY_CHARS:
        raise ErasureError(f"{ERASURE_KEY_ENV} must hold a secret of at least {MIN_KEY_CHARS} characters: erasure "
                           "records name documents by an HMAC under it, never by a guessable hash")
    return key.encode()


def subject(key: bytes, doc_id: str) -> str:
    """How the audit record names a document: HMAC-SHA256 of its id under the erasure key."""
    return hmac.new(key, doc_id.encode(), hashlib.sha256).hexdigest()


@dataclass
class ErasureReport:
    documents: int
    removed: dict[str, int] = field(default_factory=dict)
    embedding_cache_entries: int = 0


def erase(db_url: str, source: str, rel_path: str | None = None, lock_timeout_seconds: float = 3600) -> ErasureReport:
    """Erase the document at source:rel_path, or every document of the source when rel_path is None."""
    key = erasure_key()
    with index_write_lock(db_url, "erase", timeout_seconds=lock_timeout_seconds), connect(db_url) as conn, \
            conn.transaction():
        doc_ids = store.erasure.documents_of(conn, source, rel_path)
        if not doc_ids:
            what = f"{source}:{rel_path}" if rel_path is not None else f"source {source}"
            raise ErasureError(f"no document of {what} is known (live or deleted): nothing to erase")
        removed, input_shas = store.erasure.erase_documents(conn, doc_ids)
        cache = store.erasure.collect_embedding_cache(conn, input_shas)
        removed["embedding_cache"] = cache
        if rel_path is None:
            removed["sources"] = store.erasure.unregister_source(conn, source)
        store.erasure.record_erasures(conn, [subject(key, doc_id) for doc_id in doc_ids],
                                "document" if rel_path is not None else "source", removed)
    return ErasureReport(len(doc_ids), removed, cache)


def surviving_erased(doc_ids: Iterable[str], erased: set[str], key: bytes) -> list[str]:
    """The subjects of erased documents that still have a row (deletion_replay's proof)."""
    return sorted({s for s in (subject(key, d) for d in doc_ids) if s in erased})


@dataclass
class HousekeepingReport:
    embedding_cache_entries: int
    deletion_log_entries: int


def housekeeping(db_url: str, embedding_cache_grace_seconds: float, deletion_log_seconds: float,
                 lock_timeout_seconds: float = 3600) -> HousekeepingReport:
    """Collect embedding-cache entries no index row uses (retired versions kept for rollback included) that are
    older than the grace period, and forget deletion-log paths older than their retention. Under the exclusive
    index write lock: no write that might still want an entry runs meanwhile."""
    with index_write_lock(db_url, "housekeeping", timeout_seconds=lock_timeout_seconds), connect(db_url) as conn, \
            conn.transaction():
        cache = store.erasure.collect_embedding_cache(conn, None, embedding_cache_grace_seconds)
        log = store.erasure.prune_deletion_log(conn, deletion_log_seconds)
    return HousekeepingReport(cache, log)
