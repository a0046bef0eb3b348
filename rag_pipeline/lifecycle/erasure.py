"""Erasure on request: a document (or a whole source) removed from everything the pipeline keeps, with an audit
record that proves it happened without keeping what was erased.

`rag-pipeline erase --doc SOURCE:PATH | --source NAME` removes, under the index write lock and in one
transaction: the document's rows in every index version (previous ones kept for rollback included), its chunks,
pages, prefix cache, dead letters and deletion-log entries, the document row, and the embedding-cache entries its
rows used that nothing else uses. Near-duplicates it answered for get rows of their own (from the cache).
The audit record (`erasures`) holds the time, what was removed per table, and the document's id under an
HMAC-SHA256 keyed from the environment (RAG_PIPELINE_ERASURE_KEY): a plain hash of a path could be confirmed
by guessing the path. `deletion_replay` checks, with the same key, that no erased document has a row anywhere.

A name is matched in every Unicode normalisation (NFC and NFD spellings of `café.md` are one name). The planner's
statistics of the tables that held the rows are refreshed in the same transaction (pg_stats samples values).

A file that is still at its source comes back on the next scan: it is held (`held_erased`), nothing of it parsed or
served, until `rag-pipeline erase --undo` re-admits it (a 'readmit' audit row under the same HMAC). Without the key
where a scan runs, erased documents cannot be recognised: every new or held document is then held until a scan
with the key (rag_pipeline.stages.erased).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from rag_pipeline import store
from rag_pipeline.domain import ids
from rag_pipeline.domain.erasure import ERASURE_KEY_ENV, MIN_KEY_CHARS, ErasureError, erasure_key, subject
from rag_pipeline.store.database import connect, index_write_lock

__all__ = ["ERASURE_KEY_ENV", "MIN_KEY_CHARS", "ErasureError", "ErasureReport", "HousekeepingReport", "erase",
           "erasure_key", "housekeeping", "readmit", "subject", "surviving_erased"]


@dataclass
class ErasureReport:
    documents: int
    removed: dict[str, int] = field(default_factory=dict)
    embedding_cache_entries: int = 0
    names: int = 0  # distinct spellings erased (a name in several Unicode normalisations counts once each)


def erase(db_url: str, source: str, rel_path: str | None = None, lock_timeout_seconds: float = 3600) -> ErasureReport:
    """Erase the document at source:rel_path, or every document of the source when rel_path is None."""
    key = erasure_key()
    with index_write_lock(db_url, "erase", timeout_seconds=lock_timeout_seconds), connect(db_url) as conn, \
            conn.transaction():
        found = store.erasure.documents_of(conn, source, rel_path)
        doc_ids = sorted({doc_id for doc_id, _ in found})
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
        store.erasure.refresh_statistics(conn)
    return ErasureReport(len(doc_ids), removed, cache, len({path for _, path in found}))


def readmit(db_url: str, source: str, rel_path: str | None = None, lock_timeout_seconds: float = 3600) -> int:
    """Undo the hold on erased documents: the one at source:rel_path (in any normalisation; back at its source or
    not yet), or every document of the source held as erased. Recorded in `erasures` ('readmit', same HMAC); the
    next scan admits them. Returns how many were re-admitted."""
    key = erasure_key()
    with index_write_lock(db_url, "erase --undo", timeout_seconds=lock_timeout_seconds), connect(db_url) as conn, \
            conn.transaction():
        candidates = set(store.erasure.held_erased(conn, source, rel_path))
        if rel_path is not None:
            candidates.add(ids.doc_id(source, rel_path))
        erased = store.erasure.erased_subjects(conn)
        subjects = sorted({s for s in (subject(key, doc_id) for doc_id in candidates) if s in erased})
        if not subjects:
            what = f"{source}:{rel_path}" if rel_path is not None else f"source {source} (held as erased)"
            raise ErasureError(f"no erased document of {what} is known: nothing to re-admit")
        store.erasure.record_erasures(conn, subjects, "readmit", {})
    return len(subjects)


def surviving_erased(doc_ids: Iterable[str], erased: set[str], key: bytes) -> dict[str, str]:
    """The erased (and not re-admitted) documents that have a row again, subject by doc_id (deletion_replay's
    proof)."""
    return {d: s for d in doc_ids if (s := subject(key, d)) in erased}


@dataclass
class HousekeepingReport:
    embedding_cache_entries: int
    deletion_log_entries: int


def housekeeping(db_url: str, embedding_cache_grace_seconds: float, deletion_log_seconds: float,
                 lock_timeout_seconds: float = 3600) -> HousekeepingReport:
    """Collect embedding-cache entries no index row uses (previous versions kept for rollback included) that are
    older than the grace period, and forget deletion-log paths older than their retention. Under the exclusive
    index write lock: no write that might still want an entry runs meanwhile."""
    with index_write_lock(db_url, "housekeeping", timeout_seconds=lock_timeout_seconds), connect(db_url) as conn, \
            conn.transaction():
        cache = store.erasure.collect_embedding_cache(conn, None, embedding_cache_grace_seconds)
        log = store.erasure.prune_deletion_log(conn, deletion_log_seconds)
    return HousekeepingReport(cache, log)
