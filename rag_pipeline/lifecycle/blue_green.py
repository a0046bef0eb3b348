"""Index-version lifecycle (blue/green): build beside the active version, backfill, check, promote, roll back,
retire (reclaiming previous versions after their window: lifecycle.reclaim).

A build registers a version in status `building`; from then on every write reaches it too, and the backfill
(hash-sharded, so N workers share it) embeds the live documents into it. When no chunk group is missing and no
deleted document's row is left, the version is `ready`, whichever way the backfill ran (UI or CLI). Promotion is
one transaction that moves the alias (which rag.search and rag.indexed_chunks follow); it refuses unless the candidate is complete,
has every later deletion replayed, and, when a golden set is given, does not score worse than the active version
beyond a tolerance. `force` skips the gates and is recorded.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from rag_pipeline import store
from rag_pipeline.config import Settings, backend_model_name
from rag_pipeline.domain.ids import ModelIdentity
from rag_pipeline.domain.status import DocumentStatus, VersionStatus, check_version_transition
from rag_pipeline.embedding.embedders import get_embedder
from rag_pipeline.embedding.identity import for_database, identity_of, version_settings
from rag_pipeline.embedding.locations import ModelUnavailableError, check_model_argument
from rag_pipeline.parsing.pages import parser_version
from rag_pipeline.retrieval.evaluation import evaluate, load_golden, paired_differences, regressions
from rag_pipeline.retrieval.search import SearchOptions
from rag_pipeline.stages.chunk import (
    ModelMismatchError,
    check_configured_model,
    current_chunker_version,
    sizing_model_location,
)
from rag_pipeline.stages.common import Progress, locked_stage, log_progress
from rag_pipeline.stages.index import (
    EMBED_BATCHES,
    IndexStats,
    rebalance_bm25,
    vectors_ahead,
    write_documents,
)
from rag_pipeline.stages.progress import Reporter
from rag_pipeline.store.chunks import StoredChunk
from rag_pipeline.store.database import connect
from rag_pipeline.store.queue import PendingDocument
from rag_pipeline.store.versions import IndexVersion

V = VersionStatus


class VersionError(RuntimeError):
    """A lifecycle step that is not allowed now (the message says why)."""


def _require(conn: psycopg.Connection, version_id: int) -> IndexVersion:
    version = store.versions.get_version(conn, version_id)
    if version is None:
        raise VersionError(f"no index version {version_id} (see rag-pipeline index list)")
    return version


def _record(conn: psycopg.Connection, version_id: int, event: str, forced: bool = False, **detail: Any) -> None:
    store.versions.record_event(conn, version_id, event, forced, detail)


# --- build ---------------------------------------------------------------------------------------


def start_build(
    conn: psycopg.Connection, model: ModelIdentity, dimensions: int, chunker_version: str, parser: str,
    bm25_k1: float = 1.2, bm25_b: float = 0.75,
) -> IndexVersion:
    """A new version in status 'building'; from now on every write reaches it too."""
    store.versions.lock_registry(conn)
    if store.versions.index_versions(conn, (V.BUILDING, V.READY)):
        raise VersionError("another index version is already building (or ready): promote or retire it first")
    version = store.versions.create_version(conn, model, dimensions, chunker_version, parser, bm25_k1, bm25_b)
    _record(conn, version.version_id, "build", model=model.backend_model, model_identity=model.key,
            dimensions=dimensions)
    return version


def start_version_build(db_url: str, settings: Settings, model: str) -> IndexVersion:
    """Register a version for `model` (run by the configured backend) beside the active one (loading the model,
    or asking the endpoint, for its dimensions). A model that is neither a name nor a model folder is refused
    before anything is hashed or loaded (the Dagster op starts builds here too)."""
    check_model_argument(model)
    with connect(db_url) as conn:
        embedding = for_database(conn, settings.embedding)
    model = backend_model_name(model, embedding)
    identity = identity_of(model, embedding)
    embedder = get_embedder(model, embedding)
    with connect(db_url) as conn, conn.transaction():
        chunker = current_chunker_version(settings, sizing_model_location(conn, settings))
        bm25 = settings.retrieval.bm25
        return start_build(conn, identity, embedder.dimensions, chunker, parser_version(), bm25.k1, bm25.b)


def backfill_version(
    db_url: str, settings: Settings, version_id: int, shard: int, shards: int, progress: Progress = log_progress
) -> IndexStats:
    """Fill a building version with the indexed documents of one hash shard, from their stored chunks, and
    mark it ready when this shard completed it.

    Reads the live documents (never an export) and only embeds: parsing and chunking are reused. Documents
    that change meanwhile are written to the building version by the index stage, like to the active one.
    Shards share the write lock with each other, not with a refresh.
    """
    stats = IndexStats()
    with locked_stage(db_url, f"backfill v{version_id} shard {shard}", stats, shared=True,
                      timeout_seconds=settings.lock_timeout_seconds, progress=progress):
        with connect(db_url) as conn:
            version = store.versions.get_version(conn, version_id)
            if version is None or version.status != V.BUILDING:
                raise VersionError(f"index version {version_id} is not building")
            stats.versions = [f"{version.label} ({version.embedding_model})"]
            total = store.queue.count_shard_documents(conn, shard, shards)
            conn.commit()
            reporter = Reporter(f"backfill {version.label} shard {shard}/{shards}", "chunks",
                                settings.execution.progress_seconds, progress)

            def fetch(after: str) -> list[PendingDocument]:
                batch = store.queue.shard_documents(conn, shard, shards, settings.batch_size * EMBED_BATCHES, after)
                conn.commit()
                return batch

            for batch, (chunks_by_doc, vectors) in vectors_ahead(db_url, fetch, [version], settings, stats):
                for part in _transactions(batch, chunks_by_doc):
                    with conn.transaction():
                        store.groups.lock_assignment(conn)  # before the row locks (see store.groups)
                        writing = [
                            (doc, chunks_by_doc[doc.doc_id]) for doc in part
                            # one changed meanwhile is left to the index stage, which writes every writable version
                            if store.queue.claim(conn, doc.doc_id, DocumentStatus.INDEXED)
                            # re-chunked and re-indexed since its chunks were read: already in this version
                            and store.chunks.chunk_ids_of(conn, doc.doc_id) == [c.chunk_id for c in chunks_by_doc[doc.doc_id]]
                        ]
                        write_documents(conn, writing, [version], vectors, settings, stats)
                    stats.documents_indexed += len(writing)
                    stats.chunks_indexed += sum(len(chunks) for _, chunks in writing)
                    if reporter.due():
                        reporter.report(stats.documents_indexed, total - stats.documents_indexed,
                                        stats.chunks_indexed)
            reporter.report(stats.documents_indexed, 0, stats.chunks_indexed)
            rebalance_bm25(conn, version, settings)
            with conn.transaction():
                store.versions.refresh_stats(conn, version)
                if mark_ready_if_complete(conn, version):
                    progress(f"{version.label} is complete and ready to promote")
    return stats


# A backfill writes documents together, in transactions of about this many chunks: the rows of each go in one
# statement (BM25's trigger tokenises and counts them in one pass) and one commit, while the lock every index write
# takes (store.groups.lock_assignment) is held for well under a second, so a refresh beside it hardly waits.
BACKFILL_CHUNKS_AT_ONCE = 250


def _transactions(batch: list[PendingDocument], chunks_by_doc: dict[str, list[StoredChunk]]
                  ) -> Iterator[list[PendingDocument]]:
    """`batch` in runs of documents of about BACKFILL_CHUNKS_AT_ONCE chunks (a longer document alone)."""
    part: list[PendingDocument] = []
    chunks = 0
    for doc in batch:
        size = len(chunks_by_doc.get(doc.doc_id, []))
        if part and chunks + size > BACKFILL_CHUNKS_AT_ONCE:
            yield part
            part, chunks = [], 0
        part.append(doc)
        chunks += size
    if part:
        yield part


def mark_ready_if_complete(conn: psycopg.Connection, version: IndexVersion) -> bool:
    """A building version with every chunk group and no deleted document's row becomes ready. Each shard
    asks after its own commit, so the last one to finish always sees every other shard's rows."""
    if version.status != V.BUILDING:
        return False
    gates = check_gates(conn, version)
    return gates.passed and store.versions.mark_ready(conn, version.version_id)


# --- gates and promotion -------------------------------------------------------------------------


@dataclass
class GateReport:
    version: int
    missing_groups: int = 0  # groups of indexed documents without a row in the candidate
    replayed_deletions_left: int = 0  # rows of documents deleted since the build began
    quality: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


def check_gates(
    conn: psycopg.Connection,
    candidate: IndexVersion,
    golden: Path | None = None,
    labels: list[str] | None = None,
    k: int = 10,
    tolerance: float = 0.02,
    options: SearchOptions | None = None,
) -> GateReport:
    report = GateReport(candidate.version_id)
    report.missing_groups = store.versions.groups_without_row(conn, candidate)
    if report.missing_groups:
        report.failures.append(f"incomplete: {report.missing_groups} chunk groups have no row (backfill not done)")
    report.replayed_deletions_left = store.versions.rows_deleted_since_build(conn, candidate)
    if report.replayed_deletions_left:
        report.failures.append(f"deletion replay: {report.replayed_deletions_left} rows of deleted documents")
    active = store.versions.active_version(conn)
    if golden is not None and active is not None and active.version_id != candidate.version_id:
        if not labels:
            raise VersionError("the quality gate needs the labels to evaluate as")
        questions = load_golden(golden)
        before = evaluate(conn, questions, labels, k=k, version=active, options=options)
        after = evaluate(conn, questions, labels, k=k, version=candidate, options=options)
        report.quality = {"active": before.metrics["overall"], "candidate": after.metrics["overall"],
                          "tolerance": tolerance,
                          "differences": [asdict(d) for d in paired_differences(before.results, after.results)]}
        report.failures += [f"quality: {regression}"
                            for regression in regressions(before.results, after.results, tolerance)]
    return report


def promote(conn: psycopg.Connection, version_id: int, gates: GateReport | None, force: bool = False,
            reason: str | None = None) -> None:
    """Make a version the one readers use, atomically; the previous one is kept for rollback. A forced
    promotion (past failed gates) needs a reason, which is recorded with it."""
    if force and not (reason or "").strip():
        raise VersionError("a forced promotion needs a reason (it is recorded with the promotion)")
    candidate = _require(conn, version_id)
    if candidate.status not in (V.BUILDING, V.READY):
        raise VersionError(
            f"{candidate.label} is {candidate.status}: only a building or ready version can be promoted"
        )
    if not force and (gates is None or not gates.passed):
        raise VersionError("promotion refused: " + "; ".join(gates.failures if gates else ["gates not checked"]))
    check_version_transition(candidate.status, V.ACTIVE)
    store.versions.activate(conn, version_id)
    _record(conn, version_id, "promote", forced=force, gates=asdict(gates) if gates else None,
            reason=(reason or "").strip() or None)


class PromotionRefused(VersionError):
    """The candidate's gates failed and the promotion was not forced; `gates` says which."""

    def __init__(self, gates: GateReport):
        super().__init__(f"v{gates.version} not promoted: " + "; ".join(gates.failures))
        self.gates = gates


def promote_with_gates(
    conn: psycopg.Connection, version_id: int, settings: Settings, *, golden: Path | None = None,
    labels: list[str] | None = None, k: int | None = None, tolerance: float | None = None, force: bool = False,
    reason: str | None = None,
) -> GateReport:
    """Check a building or ready version's gates (complete, deletions replayed, golden-set quality against the
    active version; unset arguments from the `checks` configuration) and make it active if they pass, or past
    failed gates when forced with a reason (recorded). Raises PromotionRefused when gates fail unforced, and
    VersionError for anything else not allowed. The CLI and the Dagster op both promote through here."""
    if force and not (reason or "").strip():
        raise VersionError("a forced promotion needs a reason (it is recorded with the promotion)")
    candidate = store.versions.get_version(conn, version_id)
    if candidate is None or candidate.status not in (V.BUILDING, V.READY):
        raise VersionError(f"v{version_id} is not a building or ready version")
    checks = settings.checks
    gates = check_gates(
        conn, candidate, golden or checks.golden_set, labels or list(checks.golden_labels) or None,
        k=k or checks.k, tolerance=checks.quality_tolerance if tolerance is None else tolerance,
        options=SearchOptions.from_settings(settings),
    )
    if gates.failures and not force:
        raise PromotionRefused(gates)
    promote(conn, version_id, gates, force=force, reason=reason)
    return gates


GATE_RESULT_WORDS = {True: "passed", False: "FAILED", None: "not checked"}


def gate_results(gates: GateReport) -> list[dict[str, Any]]:
    """Each promotion gate and its result (passed: True, False, or None where it was not checked), as `index
    promote` prints it and returns it with --json."""
    quality_failures = [f.removeprefix("quality: ") for f in gates.failures if f.startswith("quality: ")]
    results: list[dict[str, Any]] = [
        {"gate": "complete", "passed": not gates.missing_groups,
         "detail": f"{gates.missing_groups} chunk groups have no row (backfill not done)" if gates.missing_groups
         else "every chunk group of the indexed documents has a row"},
        {"gate": "deletions replayed", "passed": not gates.replayed_deletions_left,
         "detail": f"{gates.replayed_deletions_left} rows of documents deleted since the build began"
         if gates.replayed_deletions_left else "no row of a deleted document"},
    ]
    if gates.quality:
        results.append({"gate": "quality", "passed": not quality_failures,
                        "detail": "; ".join(quality_failures) or "the golden set scores within "
                        f"{gates.quality['tolerance']} of the active version's",
                        "active": gates.quality["active"], "candidate": gates.quality["candidate"]})
    else:
        results.append({"gate": "quality", "passed": None, "detail": "no golden set to compare the versions on "
                        "(checks.golden_set, or --golden), or no other version active"})
    return results


def swap_report(conn: psycopg.Connection, settings: Settings, version_id: int,
                gates: GateReport | None) -> dict[str, Any]:
    """What a promotion or rollback did and what it leaves the operator to do: the gates checked, the model now
    served, the embedding settings a refresh needs from now on (empty when the configuration already names the
    model), and the version a rollback would return to."""
    version = _require(conn, version_id)
    embedding = settings.embedding.for_index(version.embedding_model)
    try:
        check_configured_model(conn, settings)
        to_set: dict[str, str] = {}
    except (ModelMismatchError, ModelUnavailableError, OSError):
        # The configured model is not the one now served, or cannot be identified here: the version's own
        # settings are right either way.
        to_set = version_settings(version)
    previous = store.versions.rollback_target(conn, version.version_id)
    return {
        "active": version.label, "version": version.version_id, "embedding_model": version.embedding_model,
        "dimensions": version.dimensions, "gates": gate_results(gates) if gates is not None else [],
        "configured_model": backend_model_name(settings.embedding.model, embedding), "set": to_set,
        "rollback_to": f"v{previous}" if previous is not None else None,
    }


def rollback(conn: psycopg.Connection) -> IndexVersion:
    """Re-activate the version that was active before the current one, older than it, whose table still exists.
    Rollback only goes back: run twice, it goes further back (or is refused), never forward again to the version
    the first rollback left; to return to a newer version, build and promote it."""
    store.versions.lock_registry(conn)
    current = store.versions.active_version(conn)
    if current is None:
        raise VersionError("nothing to roll back: no index version is active")
    target = store.versions.rollback_target(conn, current.version_id)
    if target is None:
        gone = store.versions.reclaimed_target(conn, current.version_id)
        if gone is not None:
            raise VersionError(f"nothing to roll back to: v{gone[0]}, active before {current.label}, was dropped on "
                               f"{gone[1]:%Y-%m-%d %H:%M %Z} (retention.rollback, or `index retire`); build it "
                               "again (`rag-pipeline index build`) and promote it, or pin a version to keep it "
                               "(`rag-pipeline index pin V --reason ...`)")
        raise VersionError(f"nothing to roll back to: no version older than the active {current.label} is kept "
                           "with its table (rollback only goes back; see rag-pipeline index list)")
    store.versions.activate(conn, target)
    _record(conn, target, "rollback", rolled_back=current.version_id)
    return _require(conn, target)


def retire(conn: psycopg.Connection, version_id: int) -> None:
    """Drop a version's table for good. The active version cannot be retired."""
    store.versions.lock_registry(conn)  # index writes re-read the versions under the shared lock: none half-sees it
    version = _require(conn, version_id)
    if version.status == V.ACTIVE:
        raise VersionError(f"{version.label} is active: promote another version (or roll back) first")
    pinned = store.versions.pinned_reason(conn, version_id)
    if pinned is not None:
        raise VersionError(f"{version.label} is pinned ({pinned}): `rag-pipeline index unpin {version_id}` first")
    store.versions.drop(conn, version)
    _record(conn, version_id, "drop")
