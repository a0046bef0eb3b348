"""Stage 4: near-duplicate groups, embeddings and one row per group in every version that receives writes.

Vectors come from the embedding cache wherever the exact input was embedded before (by any document, in any
run); the model loads only when something is missing. The first index version is created here, where
vectors are born.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import psycopg

from rag_pipeline import store
from rag_pipeline.config import Settings
from rag_pipeline.domain import ids
from rag_pipeline.domain.status import DocumentStatus
from rag_pipeline.embedding.embedders import get_embedder, get_light_first_embedder
from rag_pipeline.embedding.identity import cache_key, configured_identity, model_for_version
from rag_pipeline.parsing.pages import parser_version
from rag_pipeline.stages.chunk import current_chunker_version, sizing_model_location
from rag_pipeline.stages.common import StageStats
from rag_pipeline.store.chunks import StoredChunk
from rag_pipeline.store.database import connect
from rag_pipeline.store.queue import PendingDocument
from rag_pipeline.store.versions import IndexRow, IndexVersion
from rag_pipeline.text import dedup

D = DocumentStatus
log = logging.getLogger(__name__)
# The embedding stages read this many batches at a time: one encode call over more inputs sorts them by length
# into better-filled model batches (measured: 8% faster over 5x more inputs); memory stays bounded.
EMBED_BATCHES = 4


class DimensionMismatchError(RuntimeError):
    """The model gave vectors of another size than the version it writes to was made for."""


@dataclass
class IndexStats(StageStats):
    documents_indexed: int = 0
    rows_written: int = 0
    # Per document, whatever the number of versions written: rows_written counts rows in every version.
    occurrences: int = 0  # chunks of the documents indexed in this run
    near_duplicates: int = 0  # of those, near-duplicates of a chunk already in the index (stored once)
    dedup_rate: float = 0.0  # near_duplicates / occurrences: at most 1
    vectors_embedded: int = 0
    vectors_reused: int = 0
    chunks_indexed: int = 0  # chunks of the documents indexed (the progress reports' rate)
    versions: list[str] = field(default_factory=list)
    tables_vacuumed: list[str] = field(default_factory=list)  # execution.vacuum_dead_share
    SUMMARY = ("documents_indexed", "rows_written", "vectors_embedded", "vectors_reused", "near_duplicates",
               "dedup_rate")


def ensure_first_version(db_url: str, settings: Settings) -> IndexVersion:
    """The active index version, creating the first one for the configured model on a new database.

    The model is loaded only when a version must be created: a no-op refresh never pays for it.
    """
    with connect(db_url) as conn:
        current = store.versions.active_version(conn)
    if current is not None:
        return current
    embedding = settings.embedding.for_index(None)
    identity = configured_identity(embedding)
    embedder = get_embedder(embedding.backend_model, embedding)
    log.info("a new index: its first version is embedded by %s", embedding.backend_model)
    with connect(db_url) as conn, conn.transaction():
        chunker = current_chunker_version(settings, sizing_model_location(conn, settings))
        bm25 = settings.retrieval.bm25
        return store.versions.ensure_active(conn, identity, embedder.dimensions, chunker, parser_version(), bm25.k1, bm25.b)


def index_documents(
    db_url: str, settings: Settings, lease: store.work.Lease, stats: IndexStats,
    more_coming: Callable[[], bool] = lambda: False, stop: Callable[[], bool] = lambda: False,
    idle: Callable[[float], object] = time.sleep,
) -> None:
    """Lease pending_index documents one at a time and write each into every writable version: near-duplicate
    groups, then one row per group, with vectors from the embedding cache where possible.

    Each embedding call's vectors are cached as soon as they are made, and each document is written in its own
    transaction, so a crash loses at most the document in hand (and of that only the call in flight). While
    `more_coming()` says other workers may still queue documents, an empty queue is waited on, not left; once
    `stop()` says so, no further document is taken. `idle(seconds)` waits before the next look (a caller that
    knows when documents are queued, or parsing ends, returns early).
    """
    started = time.perf_counter()
    touched: dict[int, IndexVersion] = {}
    try:
        with connect(db_url) as conn:
            while not stop():
                leased = store.work.lease_next(conn, [D.PENDING_INDEX], lease)
                if leased is None:
                    if more_coming():
                        idle(IDLE_POLL_SECONDS)
                        continue
                    # Once more: a document may have been queued between the look above and the end of parsing.
                    leased = store.work.lease_next(conn, [D.PENDING_INDEX], lease)
                    if leased is None:
                        break
                _, doc = leased
                try:
                    if not touched:
                        ensure_first_version(db_url, settings)
                    for version in index_document(conn, doc, settings, stats):
                        touched[version.version_id] = version
                finally:
                    store.work.release_moved_on(conn, doc.doc_id, lease, [D.PENDING_INDEX])
            with conn.transaction():
                for version in touched.values():
                    store.versions.refresh_stats(conn, version)
            for version in touched.values():
                rebalance_bm25(conn, version, settings)
        if settings.execution.vacuum_dead_share > 0:  # deletions by the scan count too, not only this stage's writes
            with connect(db_url, autocommit=True) as conn:
                for version in store.versions.writable_versions(conn):
                    stats.tables_vacuumed += store.versions.vacuum_churned(conn, version, settings.execution.vacuum_dead_share)
            stats.versions = [f"{v.label} ({v.status}, {v.embedding_model})" for v in touched.values()]
    finally:
        stats.seconds = time.perf_counter() - started
        stats.dedup_rate = round(stats.near_duplicates / stats.occurrences, 4) if stats.occurrences else 0.0


# How long an index worker waiting for parse workers sleeps between looks at an empty queue.
IDLE_POLL_SECONDS = 0.5


def index_document(
    conn: psycopg.Connection, doc: PendingDocument, settings: Settings, stats: IndexStats,
) -> list[IndexVersion]:
    """Embed (what the cache lacks) and write one leased document; returns the versions written."""
    if not doc.acl_labels:
        return []  # cannot happen through discovery; the table's CHECK would refuse it anyway
    stored = store.chunks.chunks_of(conn, [doc.doc_id]).get(doc.doc_id, [])
    targets = store.versions.writable_versions(conn)
    conn.commit()
    inputs = {ids.embedding_input_sha(c.embedding_input): c.embedding_input for c in stored}
    vectors = {v.version_id: embed_inputs(conn, v, settings, inputs, stats) for v in targets}
    with conn.transaction():
        store.groups.lock_assignment(conn)  # before the row lock (see store.groups)
        if not store.queue.claim(conn, doc.doc_id, D.PENDING_INDEX):
            return []
        store.versions.share_registry(conn)
        current = store.versions.writable_versions(conn)
        for version in current:  # a version created since the vectors were made (rare): its vectors now
            if version.version_id not in vectors:
                vectors[version.version_id] = embed_inputs(conn, version, settings, inputs, stats, commit=False)
        write_document(conn, doc, stored, current, vectors, settings, stats)
        store.queue.mark_indexed(conn, doc.doc_id)
    stats.documents_indexed += 1
    stats.chunks_indexed += len(stored)
    return current


def rebalance_bm25(conn: psycopg.Connection, version: IndexVersion, settings: Settings) -> bool:
    """Recompute a version's BM25 weights when the corpus's average length has drifted from the one they were
    computed with (a first build, a corpus that changed shape) or k1/b changed: scores stay textbook BM25."""
    bm25 = settings.retrieval.bm25

    def due() -> bool:
        state = store.versions.bm25_state(conn, version)
        drifted = (state.live_avgdl is not None and state.weights_avgdl is not None
                   and abs(state.live_avgdl - state.weights_avgdl) > bm25.reweight_drift * state.weights_avgdl)
        return drifted or (state.k1, state.b) != (bm25.k1, bm25.b)

    with conn.transaction():
        if not due():
            return False
    with conn.transaction():
        # The version's writes locked before its state is read again: two re-weights of one version (backfill
        # shards finishing together) take turns instead of each holding a read the other's rewrite must wait for.
        store.versions.lock_writes(conn, version)
        if not due():
            return False
        store.versions.reweight_bm25(conn, version, bm25.k1, bm25.b)
    return True


def assign_groups(
    conn: psycopg.Connection, chunks: Sequence[StoredChunk], labels: Sequence[str], params: dedup.LshParams
) -> list[StoredChunk]:
    """Put each chunk in its near-duplicate group (same ACL labels only), opening groups as needed. One query finds
    the candidates of every chunk that needs a group, one write records the groups opened and one the assignments;
    a chunk also meets the groups opened by the chunks before it, as it would in the database."""
    labels_key = dedup.acl_key(labels)
    kept = store.groups.group_keys(conn, [c.group_id for c in chunks if c.group_id])  # one query, not one a chunk
    assigned = list(chunks)
    ungrouped = [i for i, c in enumerate(chunks)
                 if not (c.group_id and kept.get(c.group_id) == (labels_key, params.key))]
    if not ungrouped:
        return assigned
    signatures = [dedup.signature(chunks[i].text) for i in ungrouped]
    buckets = [dedup.band_buckets(sig, params, labels_key, dedup.figures_key(chunks[i].text))
               for i, sig in zip(ungrouped, signatures, strict=True)]
    stored = store.groups.candidates(conn, buckets, labels_key, params.key)
    opened: list[tuple[str, np.ndarray, list[int]]] = []
    for i, sig, chunk_buckets, found in zip(ungrouped, signatures, buckets, stored, strict=True):
        # A group opened above shares a band bucket with this chunk: the band lookup would have found it.
        here = [(group_id, group_sig) for group_id, group_sig, group_buckets in opened
                if any(a == b for a, b in zip(group_buckets, chunk_buckets, strict=True))]
        group_id = dedup.closest_group(sig, [*found, *here], params.threshold)
        if group_id is None:
            # Derived from the label set too: a relabelled chunk opens a new group, never re-labels an old one
            # that other documents' chunks still belong to.
            group_id = ids.group_id(chunks[i].chunk_id, labels_key, params.key)
            opened.append((group_id, sig, chunk_buckets))
        assigned[i] = replace(chunks[i], group_id=group_id)
    store.groups.open_groups(conn, labels_key, params.key, opened)
    store.chunks.set_groups(conn, [(assigned[i].chunk_id, assigned[i].group_id) for i in ungrouped])
    return assigned


def write_document(
    conn: psycopg.Connection,
    doc: PendingDocument,
    stored_chunks: list[StoredChunk],
    targets: Sequence[IndexVersion],
    vectors_by_version: dict[int, dict[str, np.ndarray]],
    settings: Settings,
    stats: IndexStats,
) -> None:
    """Replace one document's rows in the given versions (inside the caller's transaction, which has claimed the
    document's row): write_documents for one."""
    write_documents(conn, [(doc, stored_chunks)], targets, vectors_by_version, settings, stats)


def write_documents(
    conn: psycopg.Connection,
    documents: Sequence[tuple[PendingDocument, list[StoredChunk]]],
    targets: Sequence[IndexVersion],
    vectors_by_version: dict[int, dict[str, np.ndarray]],
    settings: Settings,
    stats: IndexStats,
) -> None:
    """Replace documents' rows in the given versions (inside the caller's transaction, which has claimed every
    document's row). Each version's new rows go in one statement per label set: BM25's trigger then tokenises and
    counts them in one pass (a backfill writes many documents a transaction). The labels are read here, under the
    row locks, never taken from when the work was planned: a scan that narrowed them meanwhile must not be undone by
    a writer holding the old ones."""
    store.groups.lock_assignment(conn)
    params = dedup.lsh_params(settings.dedup.threshold)
    target_ids = {v.version_id for v in targets}
    versions = {v.version_id: v for v in targets}  # and the others a regrouped document reaches
    rows_by_version: dict[int, dict[tuple[str, ...], list[IndexRow]]] = {}
    released: dict[int, list[str]] = {}
    stored_groups: list[str] = []
    for doc, stored_chunks in documents:
        labels = store.queue.current_labels(conn, doc.doc_id)
        if not labels:
            continue  # held back meanwhile (no labels): nothing of it may reach the index
        chunks = assign_groups(conn, stored_chunks, labels, params)
        doc_targets, doc_vectors = list(targets), vectors_by_version
        if any(old.group_id and old.group_id != new.group_id for old, new in zip(stored_chunks, chunks, strict=True)):
            # A chunk changed group (its labels changed since it was grouped): that holds in every version, so a
            # write meant for some (a backfill's) must reach all, or the others keep rows keyed by the old group.
            doc_targets += [v for v in store.versions.writable_versions(conn) if v.version_id not in target_ids]
            inputs = {ids.embedding_input_sha(c.embedding_input): c.embedding_input for c in chunks}
            doc_vectors = {**{v.version_id: embed_inputs(conn, v, settings, inputs, stats, commit=False)
                              for v in doc_targets if v.version_id not in vectors_by_version},
                           **vectors_by_version}
        stats.occurrences += len(chunks)
        for version in doc_targets:
            versions.setdefault(version.version_id, version)
            released.setdefault(version.version_id, []).extend(
                store.versions.delete_document_rows(conn, version, doc.doc_id))
            vectors = doc_vectors[version.version_id]
            rows_by_version.setdefault(version.version_id, {}).setdefault(labels, []).extend(
                IndexRow(c, sha, vectors[sha]) for c in chunks for sha in (ids.embedding_input_sha(c.embedding_input),))
        stored_groups += [c.group_id for c in stored_chunks if c.group_id]
    first = targets[0].version_id if targets else None
    for version_id, by_labels in rows_by_version.items():
        version = versions[version_id]
        for labels, rows in by_labels.items():
            written = store.versions.insert_group_rows(conn, version, labels, rows)
            stats.rows_written += written
            if version_id == first:  # the groups are shared by every version: a chunk is a near-duplicate in all or none
                stats.near_duplicates += len(rows) - written
        # Groups these documents owned but no longer hold get a row from another occurrence.
        _rehome_groups(conn, version, settings, released[version_id], stats)
    store.groups.drop_empty(conn, stored_groups)


def _rehome_groups(
    conn: psycopg.Connection, version: IndexVersion, settings: Settings, group_ids: list[str], stats: IndexStats
) -> None:
    if not group_ids:
        return  # the document owned no rows here (a first write, a backfill): two queries a document saved
    for chunk, labels in store.versions.rowless_group_occurrences(conn, version, group_ids):
        sha = ids.embedding_input_sha(chunk.embedding_input)
        vectors = store.chunks.cached_embeddings(conn, cache_key(version), [sha])
        if sha not in vectors:
            vectors = _embed_once(conn, version, settings, {sha: chunk.embedding_input}, stats, lock=False)
        stats.rows_written += store.versions.insert_group_rows(conn, version, labels, [IndexRow(chunk, sha, vectors[sha])])
    store.groups.drop_empty(conn, group_ids)


def _embedder(version: IndexVersion, settings: Settings) -> Any:
    """The model that gives `version`'s vectors here (loaded on first use, then kept per process; a refresh of a
    few chunks embeds them without loading torch: rag_pipeline.embedding.embedders.LightFirstEmbedder)."""
    return get_light_first_embedder(model_for_version(version, settings.embedding), settings.embedding)


Prepared = tuple[dict[str, list[StoredChunk]], dict[int, dict[str, np.ndarray]]]


def vectors_ahead(
    db_url: str,
    fetch: Callable[[str], list[PendingDocument]],
    targets: Sequence[IndexVersion],
    settings: Settings,
    stats: IndexStats,
) -> Iterator[tuple[list[PendingDocument], Prepared]]:
    """Keyset-paginated batches with their chunks and vectors, the next batch embedded in a worker thread
    (on a connection of its own) while the caller writes the current one: the model never waits for the
    database. The worker only reads chunks and fills the embedding cache; every index write stays with
    the caller, under its row locks."""

    def prepare(batch: list[PendingDocument]) -> tuple[Prepared, IndexStats]:
        counts = IndexStats()
        with connect(db_url) as worker_conn:
            chunks_by_doc = store.chunks.chunks_of(worker_conn, [d.doc_id for d in batch])
            vectors = {v.version_id: _vectors_for(worker_conn, v, settings, chunks_by_doc, counts) for v in targets}
        return (chunks_by_doc, vectors), counts

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed-ahead") as worker:
        batch = fetch("")
        ahead = worker.submit(prepare, batch) if batch else None
        while batch and ahead is not None:
            prepared, counts = ahead.result()
            stats.vectors_embedded += counts.vectors_embedded
            stats.vectors_reused += counts.vectors_reused
            following = fetch(batch[-1].doc_id)
            ahead = worker.submit(prepare, following) if following else None
            yield batch, prepared
            batch = following


def _vectors_for(
    conn: psycopg.Connection,
    version: IndexVersion,
    settings: Settings,
    chunks_by_doc: dict[str, list[StoredChunk]],
    stats: IndexStats,
) -> dict[str, np.ndarray]:
    inputs = {ids.embedding_input_sha(c.embedding_input): c.embedding_input
              for chunks in chunks_by_doc.values() for c in chunks}
    return embed_inputs(conn, version, settings, inputs, stats)


def embed_inputs(
    conn: psycopg.Connection,
    version: IndexVersion,
    settings: Settings,
    inputs: dict[str, str],
    stats: IndexStats,
    commit: bool = True,
) -> dict[str, np.ndarray]:
    """Vectors for inputs (by their sha): from the cache where possible, embedded (once) otherwise, each call of
    `execution.embed_batch` inputs cached as soon as it is made (in a transaction of its own when `commit`)."""
    key = cache_key(version)
    vectors = store.chunks.cached_embeddings(conn, key, list(inputs))
    if commit:
        conn.commit()
    stats.vectors_reused += len(vectors)
    missing = [sha for sha in inputs if sha not in vectors]
    step = settings.execution.embed_batch
    for start in range(0, len(missing), step):
        part = {sha: inputs[sha] for sha in missing[start:start + step]}
        if commit:
            with conn.transaction():
                vectors.update(_embed_once(conn, version, settings, part, stats, lock=True))
        else:  # inside the caller's write transaction: see _embed_once on why it does not wait for others there
            vectors.update(_embed_once(conn, version, settings, part, stats, lock=False))
    return vectors


# More inputs than this in one call are embedded without locks (a lock each would crowd the server's lock table).
MAX_INPUT_LOCKS = 1024


def _embed_once(
    conn: psycopg.Connection, version: IndexVersion, settings: Settings, inputs: dict[str, str], stats: IndexStats,
    *, lock: bool,
) -> dict[str, np.ndarray]:
    """Vectors for inputs the cache lacked a moment ago, cached as soon as they are made. With `lock` (in a
    transaction of its own that takes no other lock while it holds these), each is embedded by one run only: the
    inputs are locked until the transaction ends, so a run that wants the same ones (another document with the same
    text, or a refresh started at the same time) waits, then finds them cached. A write transaction (which holds
    the group-assignment lock, and may embed more than once) never waits for them: waiting there could close a
    cycle with a batch that holds some of its inputs; at worst it embeds an input another run is embedding too."""
    key = cache_key(version)
    if lock and len(inputs) <= MAX_INPUT_LOCKS:
        store.chunks.lock_inputs(conn, key, list(inputs))
    vectors = store.chunks.cached_embeddings(conn, key, list(inputs))  # made meanwhile by whoever held the locks
    stats.vectors_reused += len(vectors)
    missing = [sha for sha in inputs if sha not in vectors]
    if not missing:
        return vectors
    # Loaded on first use (then kept per process): a refresh whose inputs are all cached never loads it.
    embedded = _embedder(version, settings).embed_documents([inputs[sha] for sha in missing])
    if embedded.shape[1] != version.dimensions:  # e.g. an endpoint now serving another model under the name
        raise DimensionMismatchError(
            f"{version.embedding_model} returned {embedded.shape[1]}-dimensional vectors; index version "
            f"{version.label} holds {version.dimensions}: nothing was written. A different model is a new "
            "index version (rag-pipeline index build).")
    fresh = dict(zip(missing, embedded, strict=True))
    store.chunks.store_embeddings(conn, key, fresh)
    stats.vectors_embedded += len(missing)
    return {**vectors, **fresh}
