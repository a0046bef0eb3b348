"""The ingestion stages as plain functions: discover -> parse -> chunk -> index.

State lives in Postgres, not in Dagster's IO manager: each stage drains its own queue (documents in
status pending_parse / pending_chunk / pending_index) in keyset-paginated batches, so memory is bounded
by the batch, a failed run resumes where it stopped, and work is proportional to what changed.
Every write is one transaction per document, and each first re-checks (under a row lock) that the
document is still in the state the work was planned for.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Any

import numpy as np
import psycopg

from rag_pipeline import dedup, store, versions
from rag_pipeline.cascade import Cascade, parse_document
from rag_pipeline.chunking import Chunker, chunker_version, template_prefix, truncate_to_tokens
from rag_pipeline.cleaning import clean_parsed_pages, content_hash
from rag_pipeline.config import Settings, SourceConfig
from rag_pipeline.database import connect, index_write_lock
from rag_pipeline.embedding import get_embedder, input_sha, load_tokenizer, max_sequence_length, resolve_model
from rag_pipeline.parsing import DeadLetter, parser_version
from rag_pipeline.prefixes import LlmPrefixer, PrefixError, PrefixRequest
from rag_pipeline.sources import ScanProblem, UnsafePathError, document_password, safe_join, scan_source

log = logging.getLogger(__name__)
Progress = Callable[[str], None]


def _quiet(message: str) -> None:
    log.info(message)


@dataclass
class StageStats:
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DiscoverStats(StageStats):
    sources: int = 0
    documents_seen: int = 0
    new: int = 0
    changed: int = 0
    unchanged: int = 0
    relabelled: int = 0
    deleted: int = 0
    held_no_labels: int = 0
    problems: list[dict[str, str]] = field(default_factory=list)
    per_source: dict[str, dict[str, int]] = field(default_factory=dict)


@dataclass
class ParseStats(StageStats):
    parsed: int = 0
    content_unchanged: int = 0  # file changed, text did not: no chunking, no embedding
    dead_lettered: int = 0
    vanished: int = 0
    pages: int = 0
    tiers: dict[str, int] = field(default_factory=dict)
    dead_letter_reasons: dict[str, int] = field(default_factory=dict)
    chars_removed: dict[str, int] = field(default_factory=dict)  # by cleaning rule
    escalated: int = 0  # pages that failed the structural check
    escalation_reasons: dict[str, int] = field(default_factory=dict)
    unresolved_pages: int = 0  # failed the check and no tier could do better
    tiers_unavailable: dict[str, str] = field(default_factory=dict)


@dataclass
class ChunkStats(StageStats):
    documents_chunked: int = 0
    chunks_written: int = 0
    requeued_for_new_chunker: int = 0
    chunker_version: str = ""
    prefixes_generated: int = 0  # LLM calls made
    prefixes_cached: int = 0  # LLM prefixes reused from the cache
    prefix_failures: int = 0  # documents left in the queue because the endpoint failed
    token_counts: list[int] = field(default_factory=list)


@dataclass
class IndexStats(StageStats):
    documents_indexed: int = 0
    rows_written: int = 0
    occurrences: int = 0  # chunks of the documents indexed in this run
    deduplicated: int = 0  # of those, near-duplicates of a chunk already in the index
    dedup_rate: float = 0.0
    vectors_embedded: int = 0
    vectors_reused: int = 0
    versions: list[str] = field(default_factory=list)


def prepare_index(db_url: str, settings: Settings) -> store.IndexVersion:
    """The active index version, creating the first one for the configured model on a new database.

    The model is loaded only when a version must be created: a no-op refresh never pays for it.
    """
    with connect(db_url) as conn:
        current = store.active_version(conn)
    if current is not None:
        return current
    model = resolve_model(settings.embedding.model)
    embedder = get_embedder(settings.embedding.model, settings.embedding.device, settings.embedding.batch_size)
    with connect(db_url) as conn, conn.transaction():
        return store.ensure_active_version(
            conn, model.name, model.location, embedder.dimensions, current_chunker_version(settings, model.location),
            parser_version(),
        )


def start_version_build(db_url: str, settings: Settings, model: str) -> store.IndexVersion:
    """Register a version for `model` in status 'building' beside the active one; the backfill fills it."""
    resolved = resolve_model(model)
    embedder = get_embedder(model, settings.embedding.device, settings.embedding.batch_size)
    with connect(db_url) as conn, conn.transaction():
        chunker = current_chunker_version(settings, sizing_model_location(conn))
        return versions.start_build(conn, resolved.name, resolved.location, embedder.dimensions, chunker,
                                    parser_version())


def sizing_model_location(conn: psycopg.Connection) -> str:
    """The model whose window sizes the chunks: the shortest among the versions that receive writes, so
    that every chunk fits every version, and a swap (or a rollback) does not re-chunk the corpus."""
    locations = [resolve_model(v.embedding_model).location for v in store.writable_versions(conn)]
    if not locations:
        raise RuntimeError("no index version yet: prepare_index must run first")
    return min(locations, key=max_sequence_length)


def chunk_size(settings: Settings, model_location: str) -> int:
    # Two special tokens ([CLS]/[SEP]) and the contextual prefix share the model's window with the chunk.
    return settings.chunking.max_tokens or (
        max_sequence_length(model_location) - 2 - settings.chunking.prefix_token_budget
    )


def current_chunker_version(settings: Settings, model_location: str) -> str:
    return chunker_version(chunk_size(settings, model_location), settings.chunking.overlap_tokens)


def build_chunker(settings: Settings, model_location: str) -> Chunker:
    return Chunker(
        load_tokenizer(model_location), chunk_size(settings, model_location), settings.chunking.overlap_tokens
    )


# --- discover --------------------------------------------------------------------------------------


def discover(
    db_url: str, sources: Sequence[SourceConfig], progress: Progress = _quiet, lock_timeout_seconds: float = 3600
) -> DiscoverStats:
    with index_write_lock(db_url, "discover", timeout_seconds=lock_timeout_seconds, progress=progress):
        return _discover(db_url, sources, progress)


def _discover(db_url: str, sources: Sequence[SourceConfig], progress: Progress) -> DiscoverStats:
    started = time.perf_counter()
    stats = DiscoverStats(sources=len(sources))
    for source in sources:
        scan_started = datetime.now(UTC)
        problems: list[ScanProblem] = []
        if not source.root.is_dir():
            # A missing (unmounted, mistyped) root must never read as "every document was deleted".
            stats.problems.append({"source": source.name, "path": str(source.root), "problem": "root folder missing; nothing changed"})
            progress(f"source {source.name}: root folder {source.root} is missing; skipped, nothing deleted")
            continue
        with connect(db_url) as conn, conn.transaction():
            store.upsert_source(conn, source)
            # One transaction per source: a scan interrupted half-way changes nothing.
            counts = store.reconcile_source(conn, source.name, scan_source(source, problems))
            store.record_scan(conn, source.name, scan_started, counts)
        stats.documents_seen += counts.seen
        stats.new += counts.new
        stats.changed += counts.changed + counts.released + counts.retitled
        stats.unchanged += counts.unchanged
        stats.relabelled += counts.relabelled
        stats.deleted += counts.deleted
        stats.held_no_labels += counts.held
        stats.problems += [{"source": source.name, "path": p.rel_path, "problem": p.problem} for p in problems]
        stats.per_source[source.name] = {
            "seen": counts.seen, "new": counts.new, "changed": counts.changed, "deleted": counts.deleted,
            "relabelled": counts.relabelled, "held": counts.held,
        }
        progress(
            f"source {source.name}: {counts.seen} files, {counts.new} new, {counts.changed} changed, "
            f"{counts.deleted} deleted, {counts.relabelled} relabelled, {counts.held} held (no ACL labels)"
        )
        for problem in problems:
            progress(f"source {source.name}: skipped {problem.rel_path}: {problem.problem}")
    stats.seconds = time.perf_counter() - started
    return stats


# --- parse -----------------------------------------------------------------------------------------


def parse_pending(db_url: str, settings: Settings, progress: Progress = _quiet) -> ParseStats:
    with index_write_lock(db_url, "parse", timeout_seconds=settings.lock_timeout_seconds, progress=progress):
        return _parse_pending(db_url, settings, progress)


def _parse_pending(db_url: str, settings: Settings, progress: Progress) -> ParseStats:
    started = time.perf_counter()
    stats = ParseStats()
    version = parser_version()
    cascade = Cascade(settings.parsing)
    with connect(db_url) as conn, contextlib.closing(cascade):
        roots = {s.name: s for s in store.registered_sources(conn)}
        after = ""
        while batch := store.pending_documents(conn, "pending_parse", settings.batch_size, after):
            conn.commit()
            for doc in batch:
                _parse_one(conn, doc, roots[doc.source], version, cascade, stats)
            after = batch[-1].doc_id
            progress(f"parse: {stats.parsed} parsed, {stats.dead_lettered} dead-lettered so far")
    stats.tiers_unavailable = dict(cascade.unavailable)
    for tier, why in cascade.unavailable.items():
        progress(f"parse: tier {tier} could not run: {why}")
    stats.seconds = time.perf_counter() - started
    return stats


def _count(mapping: dict[str, int], key: str, amount: int = 1) -> None:
    mapping[key] = mapping.get(key, 0) + amount


def _parse_one(
    conn: psycopg.Connection,
    doc: store.PendingDocument,
    source: SourceConfig,
    version: str,
    cascade: Cascade,
    stats: ParseStats,
) -> None:
    try:
        path = safe_join(source.root, doc.rel_path)
        password = document_password(source, doc.rel_path)
    except UnsafePathError as exc:
        _dead_letter(conn, doc, DeadLetter("unsupported", str(exc)), stats)
        return
    try:
        size = path.stat().st_size
        if size > cascade.config.max_file_bytes:
            raise DeadLetter("too_large", f"{size:,} bytes; parsing.max_file_bytes is {cascade.config.max_file_bytes:,}")
        # Only page text is kept in memory (pdfplumber frees each page's objects as it goes), because
        # furniture is found by comparing pages.
        pages = parse_document(path, password, cascade)
        removed = clean_parsed_pages(pages)
        new_hash = content_hash([page.markdown for page in pages])
        unchanged = new_hash == doc.indexed_content_hash
        with conn.transaction():
            if not store.claim(conn, doc.doc_id, "pending_parse", doc.fingerprint):
                stats.vanished += 1
                return
            store.replace_pages(conn, doc.doc_id, pages, version)
            store.finish_parse(
                conn, doc.doc_id, new_hash, len(pages), version, "indexed" if unchanged else "pending_chunk",
                removed,
            )
    except DeadLetter as exc:
        _dead_letter(conn, doc, exc, stats)
        return
    except FileNotFoundError:
        stats.vanished += 1  # deleted after discovery; the next scan logs the deletion
        return
    except Exception as exc:  # a parser bug must not stop the run or lose the document
        log.exception("parser failed on %s/%s", doc.source, doc.rel_path)
        _dead_letter(conn, doc, DeadLetter("parser_error", f"{type(exc).__name__}: {exc}"), stats)
        return
    if unchanged:
        stats.content_unchanged += 1
    else:
        stats.parsed += 1
    stats.pages += len(pages)
    for page in pages:
        _count(stats.tiers, page.tier)
        if "escalation" in page.signals:
            stats.escalated += 1
            _count(stats.escalation_reasons, page.signals["escalation"])
        if page.signals.get("unresolved"):
            stats.unresolved_pages += 1
    for rule, count in removed.items():
        _count(stats.chars_removed, rule, count)


def _dead_letter(conn: psycopg.Connection, doc: store.PendingDocument, exc: DeadLetter, stats: ParseStats) -> None:
    with conn.transaction():
        if store.claim(conn, doc.doc_id, "pending_parse", doc.fingerprint):
            store.dead_letter(conn, doc.doc_id, exc.reason, exc.detail, doc.fingerprint)
    log.warning("dead-lettered %s/%s: %s", doc.source, doc.rel_path, exc)
    stats.dead_lettered += 1
    _count(stats.dead_letter_reasons, exc.reason)


# --- chunk -----------------------------------------------------------------------------------------


def chunk_pending(db_url: str, settings: Settings, progress: Progress = _quiet) -> ChunkStats:
    with index_write_lock(db_url, "chunk", timeout_seconds=settings.lock_timeout_seconds, progress=progress):
        return _chunk_pending(db_url, settings, progress)


def _chunk_pending(db_url: str, settings: Settings, progress: Progress) -> ChunkStats:
    started = time.perf_counter()
    with connect(db_url) as conn:
        model_location = sizing_model_location(conn)
    stats = ChunkStats(chunker_version=current_chunker_version(settings, model_location))
    chunker: Chunker | None = None  # the tokenizer loads only when there is something to chunk
    prefixer = LlmPrefixer(settings.prefix) if settings.prefix.mode == "llm" else None
    try:
        with connect(db_url) as conn:
            with conn.transaction():
                stats.requeued_for_new_chunker = store.requeue_for_chunker(conn, stats.chunker_version)
            after = ""
            while batch := store.pending_documents(conn, "pending_chunk", settings.batch_size, after):
                conn.commit()
                chunker = chunker or build_chunker(settings, model_location)
                for doc in batch:
                    _chunk_one(conn, doc, chunker, prefixer, settings, stats)
                after = batch[-1].doc_id
                progress(f"chunk: {stats.documents_chunked} documents, {stats.chunks_written} chunks so far")
    finally:
        if prefixer is not None:
            prefixer.close()
    stats.seconds = time.perf_counter() - started
    return stats


def _chunk_one(
    conn: psycopg.Connection,
    doc: store.PendingDocument,
    chunker: Chunker,
    prefixer: LlmPrefixer | None,
    settings: Settings,
    stats: ChunkStats,
) -> None:
    pages = store.document_pages(conn, doc.doc_id)
    table_reach = store.table_continuations(conn, doc.doc_id)
    conn.commit()  # end the read: the write below must be a transaction of its own
    chunks = chunker.chunk(doc.doc_id, pages, table_reach)
    title = doc.title or PurePosixPath(doc.rel_path).stem
    prefixes = [template_prefix(title, c.section_path, c.page_start, c.page_end) for c in chunks]
    if prefixer is not None:
        # The LLM is called outside any transaction (no row lock is held while waiting on the network);
        # what it writes is cached at once, so a retry after a failure pays only for what is missing.
        try:
            sentences = _llm_sentences(conn, doc, chunks, pages, prefixer, settings, stats)
        except PrefixError as exc:
            stats.prefix_failures += 1
            log.warning("no contextual prefix for %s/%s, left for the next run: %s", doc.source, doc.rel_path, exc)
            return
        prefixes = [f"{p}\n{sentences[c.content_hash]}" for p, c in zip(prefixes, chunks, strict=True)]
    budget = settings.chunking.prefix_token_budget
    prefixes = [truncate_to_tokens(chunker.tokenizer, p, budget) for p in prefixes]
    with conn.transaction():
        if not store.claim(conn, doc.doc_id, "pending_chunk"):
            return
        store.replace_chunks(conn, doc.doc_id, chunks, prefixes, chunker.version)
    stats.documents_chunked += 1
    stats.chunks_written += len(chunks)
    stats.token_counts.extend(c.token_count for c in chunks)


def _llm_sentences(
    conn: psycopg.Connection,
    doc: store.PendingDocument,
    chunks: list,
    pages: list[tuple[int, str]],
    prefixer: LlmPrefixer,
    settings: Settings,
    stats: ChunkStats,
) -> dict[str, str]:
    version = settings.prefix.prompt_version
    doc_hash = doc.content_hash or ""
    sentences = store.cached_prefixes(conn, doc.doc_id, doc_hash, version)
    conn.commit()
    missing = [PrefixRequest(c.content_hash, c.text) for c in chunks if c.content_hash not in sentences]
    stats.prefixes_cached += len({c.content_hash for c in chunks}) - len({r.chunk_hash for r in missing})
    if missing:
        document = "\n\n".join(text for _, text in pages)
        fresh = prefixer.prefixes(document, missing)
        with conn.transaction():
            store.store_prefixes(conn, doc.doc_id, doc_hash, version, fresh)
        sentences.update(fresh)
        stats.prefixes_generated += len(fresh)
    return sentences


# --- index -----------------------------------------------------------------------------------------


def index_pending(db_url: str, settings: Settings, progress: Progress = _quiet) -> IndexStats:
    """Group pending documents' chunks into near-duplicate groups and write one row per group into every
    writable version, with vectors from the embedding cache where possible."""
    with index_write_lock(db_url, "index", timeout_seconds=settings.lock_timeout_seconds, progress=progress):
        return _index_pending(db_url, settings, progress)


def _index_pending(db_url: str, settings: Settings, progress: Progress) -> IndexStats:
    started = time.perf_counter()
    stats = IndexStats()
    params = dedup.lsh_params(settings.dedup_threshold)
    with connect(db_url) as conn:
        versions = store.writable_versions(conn)
        stats.versions = [f"v{v.version_id} ({v.status}, {v.embedding_model})" for v in versions]
        def fetch(after: str) -> list[store.PendingDocument]:
            batch = store.pending_documents(conn, "pending_index", settings.batch_size * EMBED_BATCHES, after)
            conn.commit()
            return batch

        for batch, (chunks_by_doc, vectors_by_version) in _vectors_ahead(db_url, fetch, versions, settings, stats):
            for doc in batch:
                if not doc.acl_labels:
                    continue  # cannot happen through discovery; the table's CHECK would refuse it anyway
                with conn.transaction():
                    if not store.claim(conn, doc.doc_id, "pending_index"):
                        continue
                    write_document(conn, doc, chunks_by_doc[doc.doc_id], versions, vectors_by_version, params,
                                   settings, stats)
                    store.mark_indexed(conn, doc.doc_id)
                stats.documents_indexed += 1
            progress(
                f"index: {stats.documents_indexed} documents, {stats.vectors_embedded} embedded, "
                f"{stats.vectors_reused} reused, {stats.deduplicated} near-duplicates so far"
            )
        with conn.transaction():
            for version in versions:
                store.refresh_version_stats(conn, version)
    stats.dedup_rate = round(stats.deduplicated / stats.occurrences, 4) if stats.occurrences else 0.0
    stats.seconds = time.perf_counter() - started
    return stats


def write_document(
    conn: psycopg.Connection,
    doc: store.PendingDocument,
    stored_chunks: list[store.StoredChunk],
    versions: Sequence[store.IndexVersion],
    vectors_by_version: dict[int, dict[str, np.ndarray]],
    params: dedup.LshParams,
    settings: Settings,
    stats: IndexStats,
) -> None:
    """Replace one document's rows in the given versions (inside the caller's transaction)."""
    chunks = store.assign_groups(conn, stored_chunks, doc.acl_labels, params)
    stats.occurrences += len(chunks)
    for version in versions:
        vectors = vectors_by_version[version.version_id]
        released = store.delete_document_rows(conn, version, doc.doc_id)
        rows = [store.IndexRow(c, sha, vectors[sha]) for c in chunks for sha in (input_sha(c.embedding_input),)]
        written = store.insert_group_rows(conn, version, doc.acl_labels, rows)
        stats.rows_written += written
        stats.deduplicated += len(rows) - written
        # Groups this document owned but no longer holds get a row from another occurrence.
        _rehome_groups(conn, version, settings, released, stats)
    store.drop_empty_groups(conn, [c.group_id for c in stored_chunks if c.group_id])


def backfill_version(
    db_url: str, settings: Settings, version_id: int, shard: int, shards: int, progress: Progress = _quiet
) -> IndexStats:
    """Fill a building version with the indexed documents of one hash shard, from their stored chunks.

    Reads the live documents (never an export) and only embeds: parsing and chunking are reused. Documents
    that change meanwhile are written to the building version by the index stage, like to the active one.
    Shards share the write lock with each other, not with a refresh.
    """
    with index_write_lock(db_url, f"backfill v{version_id} shard {shard}", shared=True,
                          timeout_seconds=settings.lock_timeout_seconds, progress=progress):
        return _backfill_version(db_url, settings, version_id, shard, shards, progress)


def _backfill_version(
    db_url: str, settings: Settings, version_id: int, shard: int, shards: int, progress: Progress
) -> IndexStats:
    started = time.perf_counter()
    stats = IndexStats()
    params = dedup.lsh_params(settings.dedup_threshold)
    with connect(db_url) as conn:
        version = next((v for v in store.index_versions(conn) if v.version_id == version_id), None)
        if version is None or version.status != "building":
            raise RuntimeError(f"index version {version_id} is not building")
        stats.versions = [f"v{version.version_id} ({version.embedding_model})"]
        def fetch(after: str) -> list[store.PendingDocument]:
            batch = store.shard_documents(conn, shard, shards, settings.batch_size * EMBED_BATCHES, after)
            conn.commit()
            return batch

        for batch, (chunks_by_doc, vectors) in _vectors_ahead(db_url, fetch, [version], settings, stats):
            for doc in batch:
                with conn.transaction():
                    if not store.claim(conn, doc.doc_id, "indexed"):
                        continue  # changed meanwhile: the index stage writes it to every writable version
                    write_document(conn, doc, chunks_by_doc[doc.doc_id], [version], vectors, params, settings, stats)
                stats.documents_indexed += 1
            progress(f"backfill v{version_id} shard {shard}/{shards}: {stats.documents_indexed} documents")
        with conn.transaction():
            store.refresh_version_stats(conn, version)
    stats.seconds = time.perf_counter() - started
    return stats


def _rehome_groups(
    conn: psycopg.Connection, version: store.IndexVersion, settings: Settings, group_ids: list[str], stats: IndexStats
) -> None:
    for chunk, labels in store.rowless_group_occurrences(conn, version, group_ids):
        sha = input_sha(chunk.embedding_input)
        vectors = store.cached_embeddings(conn, version.embedding_model, [sha])
        if sha not in vectors:
            embedder = get_embedder(version.embedding_model, settings.embedding.device, settings.embedding.batch_size)
            vectors[sha] = embedder.embed_documents([chunk.embedding_input])[0]
            store.store_embeddings(conn, version.embedding_model, vectors)
            stats.vectors_embedded += 1
        stats.rows_written += store.insert_group_rows(conn, version, labels, [store.IndexRow(chunk, sha, vectors[sha])])
    store.drop_empty_groups(conn, group_ids)


# The embedding stages read this many batches at a time: one encode call over more inputs sorts them by length
# into better-filled model batches (measured: 8% faster over 5x more inputs); memory stays bounded.
EMBED_BATCHES = 4
Prepared = tuple[dict[str, list[store.StoredChunk]], dict[int, dict[str, np.ndarray]]]


def _vectors_ahead(
    db_url: str,
    fetch: Callable[[str], list[store.PendingDocument]],
    versions: Sequence[store.IndexVersion],
    settings: Settings,
    stats: IndexStats,
) -> Iterator[tuple[list[store.PendingDocument], Prepared]]:
    """Keyset-paginated batches with their chunks and vectors, the next batch embedded in a worker thread
    (on a connection of its own) while the caller writes the current one: the model never waits for the
    database. The worker only reads chunks and fills the embedding cache; every index write stays with
    the caller, under its row locks."""

    def prepare(batch: list[store.PendingDocument]) -> tuple[Prepared, IndexStats]:
        counts = IndexStats()
        with connect(db_url) as worker_conn:
            chunks_by_doc = store.chunks_of(worker_conn, [d.doc_id for d in batch])
            vectors = {v.version_id: _vectors_for(worker_conn, v, settings, chunks_by_doc, counts) for v in versions}
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
    version: store.IndexVersion,
    settings: Settings,
    chunks_by_doc: dict[str, list[store.StoredChunk]],
    stats: IndexStats,
) -> dict[str, np.ndarray]:
    """Vectors for every chunk input of a batch: from the cache where possible, embedded (once) otherwise."""
    inputs = {input_sha(c.embedding_input): c.embedding_input for chunks in chunks_by_doc.values() for c in chunks}
    vectors = store.cached_embeddings(conn, version.embedding_model, list(inputs))
    stats.vectors_reused += len(vectors)
    missing = [sha for sha in inputs if sha not in vectors]
    if missing:
        # Loaded on first use (then kept per process): a refresh whose inputs are all cached never loads it.
        embedder = get_embedder(version.embedding_model, settings.embedding.device, settings.embedding.batch_size)
        fresh = embedder.embed_documents([inputs[sha] for sha in missing])
        new_vectors = dict(zip(missing, fresh, strict=True))
        with conn.transaction():
            store.store_embeddings(conn, version.embedding_model, new_vectors)
        vectors.update(new_vectors)
        stats.vectors_embedded += len(missing)
    return vectors
