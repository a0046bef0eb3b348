"""The refresh's document work, one document at a time per worker.

Worker processes (one per core by default, rag_pipeline.workers.pool) each lease a queued document from Postgres
(rag_pipeline.store.work), parse and clean it and chunk it, within a time and a memory budget; this process
meanwhile embeds and indexes what they finish, so parsing overlaps with embedding. Any number of such runs, in
any number of processes or machines, share the same queue: a lease is taken with FOR UPDATE SKIP LOCKED and
lapses when its holder dies, and every write re-checks the state its work was planned for.

A document over its budget, or whose worker died, is dead-lettered (`timeout`, `memory`, `crashed`) with the
limit in its reason; its worker is replaced and the run goes on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from rag_pipeline import store
from rag_pipeline.config import Settings, SourceConfig
from rag_pipeline.domain.refs import in_log
from rag_pipeline.domain.status import DocumentStatus
from rag_pipeline.embedding.identity import adopt_model_identities
from rag_pipeline.parsing.pages import REPARSE_PDFS_BELOW, DeadLetter
from rag_pipeline.stages.chunk import (
    ChunkStats,
    check_configured_model,
    chunk_one,
    chunk_size,
    current_chunker_version,
    sizing_model_location,
)
from rag_pipeline.stages.common import Progress, log_progress
from rag_pipeline.stages.index import IndexStats, index_documents
from rag_pipeline.stages.parse import ParseStats, dead_letter, parse_one, remove_orphaned_copies
from rag_pipeline.stages.progress import Reporter
from rag_pipeline.store.database import connect, index_write_lock
from rag_pipeline.store.queue import PendingDocument
from rag_pipeline.workers.pool import Failed, Finished, Limits, Runner, WorkerPool, auto_workers
from rag_pipeline.workers.threads import bound_compute_threads, thread_budget, torch_threads

log = logging.getLogger(__name__)
D = DocumentStatus
BUDGET_REASONS = ("timeout", "memory", "crashed")
RETRIED_ONCE = ("memory", "crashed")  # possibly the worker's state, not the document's: one more try


@dataclass
class ProcessStats:
    parse: ParseStats = field(default_factory=ParseStats)
    chunk: ChunkStats = field(default_factory=ChunkStats)
    index: IndexStats = field(default_factory=IndexStats)
    workers: int = 0  # worker processes the run could use
    workers_replaced: int = 0  # killed for their budget, or found dead
    host: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")  # who did this work

    def as_dict(self) -> dict[str, Any]:
        return {"parse": self.parse.as_dict(), "chunk": self.chunk.as_dict(), "index": self.index.as_dict(),
                "workers": self.workers, "workers_replaced": self.workers_replaced, "host": self.host}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProcessStats:
        return cls(ParseStats(**data["parse"]), ChunkStats(**data["chunk"]), IndexStats(**data["index"]),
                   data["workers"], data["workers_replaced"], data["host"])

    def add(self, other: ProcessStats) -> None:
        """Another step's work in the same run (steps run side by side: wall times are the longest one's)."""
        for mine, theirs in ((self.parse, other.parse), (self.chunk, other.chunk), (self.index, other.index)):
            mine.add(theirs)
        self.parse.seconds = max(self.parse.seconds, other.parse.seconds)
        self.chunk.seconds += other.chunk.seconds
        self.index.seconds = max(self.index.seconds, other.index.seconds)
        self.index.dedup_rate = (round(self.index.near_duplicates / self.index.occurrences, 4)
                                 if self.index.occurrences else 0.0)
        self.index.versions = sorted(set(self.index.versions))
        self.workers += other.workers
        self.workers_replaced += other.workers_replaced


@dataclass(frozen=True)
class ChunkPlan:
    """Decided once per run by the supervisor (it reads the index versions), used by every worker."""

    model_location: str
    size: int
    overlap: int
    version: str


@dataclass(frozen=True)
class DocumentTask:
    status: DocumentStatus
    doc: PendingDocument
    source: SourceConfig
    chunk: bool  # chunk it once parsed (the pipeline), or only parse it


@dataclass
class TaskResult:
    parse: ParseStats
    chunk: ChunkStats


@dataclass
class _WorkerState:
    db_url: str
    settings: Settings
    plan: ChunkPlan | None
    conn: psycopg.Connection
    parser_version: str
    cascade: Any = None
    describer: Any = None
    chunker: Any = None
    prefixer: Any = None


class DocumentRunner:
    """Parse, clean and chunk one document in a worker process (each worker keeps its models between documents)."""

    fatal = (psycopg.OperationalError,)  # the database is gone: stop the run, do not dead-letter documents

    def setup(self, db_url: str, settings: Settings, plan: ChunkPlan | None) -> _WorkerState:
        """Everything a document needs, loaded once per worker: a failure here is the machine's (a missing model,
        an unreachable database), and stops the run instead of dead-lettering every document."""
        from rag_pipeline.parsing.cascade import Cascade
        from rag_pipeline.parsing.pages import parser_version

        if settings.execution.threads_per_worker:  # before any model loads: they size their pools from it
            bound_compute_threads(settings.execution.threads_per_worker)
        state = _WorkerState(db_url, settings, plan, connect(db_url), parser_version())
        state.cascade = Cascade(settings.parsing)
        if settings.parsing.vlm.describe_pictures:
            from rag_pipeline.parsing.descriptions import PictureDescriber

            state.describer = PictureDescriber(settings.parsing.vlm, settings.parsing.max_render_pixels)
        if plan is not None:
            from rag_pipeline.embedding.locations import load_chunking_tokenizer
            from rag_pipeline.text.chunking import Chunker

            state.chunker = Chunker(load_chunking_tokenizer(plan.model_location), plan.size, plan.overlap)
        if settings.prefix.mode == "llm":
            from rag_pipeline.text.prefixes import LlmPrefixer

            state.prefixer = LlmPrefixer(settings.prefix)
        return state

    def run(self, state: _WorkerState, task: DocumentTask) -> TaskResult:
        result = TaskResult(ParseStats(), ChunkStats())
        doc: PendingDocument | None = task.doc
        if task.status == D.PENDING_PARSE:
            started = time.perf_counter()
            parse_one(state.conn, task.doc, task.source, state.parser_version, state.cascade, result.parse,
                      state.describer)
            result.parse.seconds = time.perf_counter() - started
            result.parse.tiers_unavailable = dict(state.cascade.unavailable)
            doc = store.queue.pending_document(state.conn, task.doc.doc_id, D.PENDING_CHUNK) if task.chunk else None
        if doc is not None and state.chunker is not None:
            started = time.perf_counter()
            chunk_one(state.conn, doc, state.chunker, state.prefixer, state.settings, result.chunk)
            result.chunk.seconds = time.perf_counter() - started
        return result


def lease_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def leases_kept(db_url: str, lease_seconds: float) -> Iterator[store.work.Lease]:
    """A lease for this run, kept alive by a connection of its own (a third of the lease apart it renews every
    lease taken under it); every lease still held is released at the block's end. If this process dies, its
    session ends and the leases are void at once."""
    keeper_conn = connect(db_url)
    lease = store.work.open_lease(keeper_conn, lease_owner(), lease_seconds)
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(lease_seconds / 3):
            try:
                store.work.renew(keeper_conn, lease, lease_seconds)
            except psycopg.Error as exc:  # try again next time; the session itself keeps the leases alive
                log.warning("could not renew the document leases of %s: %s", lease.owner, exc)

    keeper = threading.Thread(target=renew, name="lease-keeper", daemon=True)
    keeper.start()
    try:
        yield lease
    finally:
        stop.set()
        keeper.join(5)
        with contextlib.suppress(psycopg.Error):
            store.work.release_all(keeper_conn, lease)
        keeper_conn.close()


def process_pending(
    db_url: str, settings: Settings, progress: Progress = log_progress, *, parse: bool = True, chunk: bool = True,
    index: bool = True, runner: Runner | None = None,
) -> ProcessStats:
    """Work every queued document through the stages asked for; returns what each stage did.

    The index write lock is held shared (with other refreshes and backfill shards; erasure and housekeeping take
    it exclusively): documents are claimed one at a time, not stages.
    """
    result = ProcessStats()
    execution = settings.execution
    statuses = [status for status, wanted in ((D.PENDING_PARSE, parse), (D.PENDING_CHUNK, chunk)) if wanted]
    with index_write_lock(db_url, "refresh", shared=True, timeout_seconds=settings.lock_timeout_seconds,
                          progress=progress):
        plan = None
        with connect(db_url) as conn:
            if chunk or index:
                adopt_model_identities(conn, settings.embedding)  # versions from before model identities
                check_configured_model(conn, settings)
            if chunk:
                location = sizing_model_location(conn, settings)
                plan = ChunkPlan(location, chunk_size(settings, location), settings.chunking.overlap_tokens,
                                 current_chunker_version(settings, location))
                result.chunk.chunker_version = plan.version
                with conn.transaction():
                    store.groups.lock_assignment(conn)  # before the row locks (see store.groups)
                    result.chunk.requeued_for_new_chunker = store.queue.requeue_for_chunker(conn, plan.version)
            if parse:
                with conn.transaction():
                    store.groups.lock_assignment(conn)  # before the row locks (see store.groups)
                    result.parse.requeued_for_new_parser = store.queue.requeue_for_parser(conn, REPARSE_PDFS_BELOW)
        with leases_kept(db_url, execution.lease_seconds) as lease:
            parsing, stop = threading.Event(), threading.Event()
            indexer = (_IndexThread(db_url, settings, lease, result.index, parsing.is_set, stop.is_set)
                       if index else None)
            index_reporter = Reporter("index", "chunks", execution.progress_seconds, progress, steady_total=True)
            try:
                if statuses:
                    parsing.set()  # before the indexer starts: it must not take an empty queue for the end
                if indexer is not None:
                    indexer.start()
                if statuses:
                    try:
                        _work_documents(db_url, settings, lease, statuses, plan, runner or DocumentRunner(), result,
                                        progress, indexer, index_reporter)
                    finally:
                        parsing.clear()
                        if indexer is not None:
                            indexer.wake()
                if indexer is not None:
                    with connect(db_url) as conn:
                        while indexer.is_alive():
                            indexer.join(0.5)
                            if index_reporter.due():
                                _report_index(conn, index_reporter, result.index)
                        indexer.raise_failure()
                        if result.index.documents_indexed:
                            _report_index(conn, index_reporter, result.index)
            except BaseException:
                stop.set()  # a failed run indexes nothing more once it has reported its failure
                if indexer is not None and indexer.is_alive():
                    indexer.join(60)
                raise
    return result


class _IndexThread(threading.Thread):
    """Embeds and indexes in this process while the workers parse (torch releases the GIL while it computes)."""

    def __init__(self, db_url: str, settings: Settings, lease: store.work.Lease, stats: IndexStats,
                 more_coming: Callable[[], bool], stop: Callable[[], bool]):
        super().__init__(name="index", daemon=True)
        self.args_ = (db_url, settings, lease, stats, more_coming, stop)
        self.failure: BaseException | None = None
        self._wake = threading.Event()

    def wake(self) -> None:
        """A document was queued for it, or parsing ended: look now, not at the next poll."""
        self._wake.set()

    def _idle(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def run(self) -> None:
        try:
            index_documents(*self.args_, idle=self._idle)
        except BaseException as exc:  # re-raised in the supervisor by raise_failure
            self.failure = exc

    def raise_failure(self) -> None:
        if self.failure is not None:
            raise self.failure


def _report_index(conn: psycopg.Connection, reporter: Reporter, stats: IndexStats,
                  still_parsing: Sequence[DocumentStatus] = ()) -> None:
    """The index stage's progress. While documents are still being parsed and chunked they count as left too: they
    come to the index next, and a total of only what is queued for it now grew with every document parsed, its ETA
    at 0 s long before the end (a few of them will need no new rows: an upper bound, settled as they arrive)."""
    waiting = store.work.queued(conn, [D.PENDING_INDEX, *still_parsing])
    reporter.report(stats.documents_indexed, sum(waiting.values()), stats.chunks_indexed)


def _work_documents(
    db_url: str, settings: Settings, lease: store.work.Lease, statuses: list[DocumentStatus], plan: ChunkPlan | None,
    runner: Runner, result: ProcessStats, progress: Progress, indexer: _IndexThread | None, index_reporter: Reporter,
) -> None:
    execution = settings.execution
    limits = Limits(execution.document_timeout, execution.page_timeout, execution.worker_memory_mb * 2**20)
    size = auto_workers(execution.workers, limits.memory_bytes)
    threads = thread_budget(size, execution.threads_per_worker)
    if execution.isolation:  # the workers' share, resolved (in-process items run with the run's own threads)
        settings = settings.model_copy(update={"execution": execution.model_copy(
            update={"threads_per_worker": threads.per_worker})})
    reporter = Reporter("parse" if D.PENDING_CHUNK not in statuses else "parse and chunk" if D.PENDING_PARSE
                        in statuses else "chunk", "pages", execution.progress_seconds, progress)
    in_hand: dict[str, DocumentTask] = {}
    retried: set[str] = set()
    done = 0
    started = time.perf_counter()
    with connect(db_url) as conn:
        # The configured definition where there is one (it carries allow_hard_links); else what is registered.
        roots = {s.name: s for s in store.sources.registered_sources(conn)}
        roots.update({s.name: s for s in settings.sources})
        conn.commit()
        remove_orphaned_copies()
        with (WorkerPool(size, runner, (db_url, settings, plan), limits, isolated=execution.isolation) as pool,
              torch_threads(threads.embedder)):
            result.workers = pool.size
            exhausted = False
            while True:
                while not exhausted and pool.idle():
                    leased = store.work.lease_next(conn, statuses, lease)
                    if leased is None:
                        exhausted = True
                        break
                    status, doc = leased
                    source = roots.get(doc.source)
                    if source is None:
                        continue  # its source is gone: discovery holds it; the lease keeps it out of this run
                    task = DocumentTask(status, doc, source, chunk=plan is not None)
                    in_hand[doc.doc_id] = task
                    pool.submit(doc.doc_id, task)
                for event in pool.collect():
                    task = in_hand.pop(event.key)
                    if isinstance(event, Failed) and event.reason in RETRIED_ONCE and event.key not in retried:
                        # The worker may have grown on earlier documents, or been killed from outside: the
                        # document gets one fresh worker before it is judged.
                        retried.add(event.key)
                        log.warning("%s: %s; retrying once in a fresh worker",
                                    *in_log(task.doc.source, task.doc.rel_path, task.doc.ref, event.detail))
                        in_hand[event.key] = task
                        pool.submit(event.key, task)
                        continue
                    _finish(conn, task, event, result)
                    done += 1
                    # Documents that moved on are released (the index worker leases them next); the others keep
                    # their lease until the run ends, so nothing is retried in a loop within one run.
                    store.work.release_moved_on(conn, task.doc.doc_id, lease, statuses)
                    if indexer is not None:
                        indexer.wake()
                    exhausted = False
                if exhausted and not in_hand:
                    break
                if indexer is not None and indexer.failure is not None:
                    indexer.raise_failure()  # no point parsing what cannot be indexed
                if reporter.due():
                    left = sum(store.work.queued(conn, statuses).values())
                    reporter.report(done, left, result.parse.pages)
                    if indexer is not None and index_reporter.due():
                        _report_index(conn, index_reporter, result.index, statuses)
            result.workers_replaced = pool.replaced
        remove_orphaned_copies()  # of the workers killed over their budget in this run
    result.parse.seconds = time.perf_counter() - started
    if done:
        reporter.report(done, 0, result.parse.pages)
    for tier, why in result.parse.tiers_unavailable.items():
        progress(f"parse: tier {tier} could not run: {why}")


def _finish(conn: psycopg.Connection, task: DocumentTask, event: Finished | Failed, result: ProcessStats) -> None:
    if isinstance(event, Finished):
        outcome: TaskResult = event.result
        result.parse.add(outcome.parse)
        result.chunk.add(outcome.chunk)
        result.chunk.seconds += outcome.chunk.seconds  # worker seconds spent chunking, summed over workers
        return
    if event.reason == "fatal":  # the database went away under a worker: the run stops, nothing is dead-lettered
        name, detail = in_log(task.doc.source, task.doc.rel_path, task.doc.ref, event.detail.splitlines()[0])
        raise psycopg.OperationalError(f"a worker lost the database on {name}: {detail}")
    reason = event.reason if event.reason in BUDGET_REASONS else "parser_error"
    log.warning("%s: %s", *in_log(task.doc.source, task.doc.rel_path, task.doc.ref, event.detail))
    dead_letter(conn, task.doc, DeadLetter(reason, event.detail), result.parse)
