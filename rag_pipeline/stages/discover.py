"""Stage 1: scan every source and reconcile it with the documents table (new, changed, moved, relabelled,
deleted), one transaction per source, without reading any document's bytes."""

from __future__ import annotations

import functools
import logging
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import psycopg

from rag_pipeline import store
from rag_pipeline.config import SourceConfig
from rag_pipeline.domain.refs import document_name, without_path
from rag_pipeline.endpoints.redaction import redact_credentials
from rag_pipeline.sources import kinds
from rag_pipeline.sources.folders import DiscoveredFile, ScanProblem, ScanReport
from rag_pipeline.sources.object_stores import StoreCounters
from rag_pipeline.stages.common import Progress, StageStats, locked_stage, log_progress
from rag_pipeline.stages.erased import NOT_CHECKED_REASON, ErasedGate
from rag_pipeline.store.database import connect
from rag_pipeline.store.scans import ReconcileCounts

log = logging.getLogger(__name__)
MAX_PROBLEMS_SHOWN = 200  # per source and run
MAX_NAMED = 200  # documents a run names per change class (every one is counted)
# The change classes a refresh names, in the order it reports them.
CHANGE_CLASSES = ("new", "changed", "released", "retitled", "relabelled", "held", "deleted", "deletions_held",
                  "adopted")


@dataclass
class DiscoverStats(StageStats):
    sources: int = 0
    documents_seen: int = 0
    new: int = 0
    changed: int = 0
    unchanged: int = 0
    relabelled: int = 0
    deleted: int = 0
    released: int = 0  # held before, admissible now: back from the pages they kept, or parsed again
    retitled: int = 0  # what a sidecar says the document is changed: chunked again (its prefixes), not parsed
    adopted: int = 0  # new objects that took the pages of a moved one (counted among new)
    held: int = 0  # newly held back: no labels, a bad sidecar, hard links
    deletions_held: int = 0  # deletions a guarded scan refused (see DeletionGuard), holds of removed sources too
    scans_failed: list[str] = field(default_factory=list)  # sources whose scan raised (each kept as it was)
    problems: list[dict[str, str]] = field(default_factory=list)
    per_source: dict[str, dict[str, int]] = field(default_factory=dict)
    # The documents of each change class, by name (#ref: a run's records keep no path), at most MAX_NAMED a class.
    documents: dict[str, list[str]] = field(default_factory=dict)
    SUMMARY = ("documents_seen", "new", "changed", "released", "retitled", "unchanged", "deleted", "relabelled",
               "held", "deletions_held", "adopted", "scans_failed", "problems", "per_source", "documents")

    def name(self, change: str, names: Sequence[str]) -> None:
        named = self.documents.setdefault(change, [])
        room = MAX_NAMED - len(named)
        if names and room > 0:
            named.extend(names[:room])


# Why the documents of a source that left the configuration were not held: recorded as held deletions.
REMOVED_HOLD_REASON = ("the source is not in the configuration any more; holding its documents (no longer served) "
                       "waits for confirmation")
# A file or object modified between the start and the end of the scan that stored it, give or take this margin,
# may have been written again within the same tick of its clock after the scan listed it: an object store lists
# times to the second (and a metadata copy keeps an object's ETag), a file system stamps times from a clock that
# moves in ticks of a few milliseconds (or whole seconds: see store.scans.apply_scan). Such a one is judged again,
# not taken from its fingerprint (git's "racily clean" rule). An object store's margin also covers a second of skew
# between its clock and this host's, which times the scans. A file's margin is two ticks of Linux's coarse clock at
# its slowest (HZ=100): wider, and a file written just before a scan (as tools and tests do) is parsed again at the
# next one for nothing.
RACY_MARGIN = timedelta(seconds=2)
FILE_CLOCK_TICK = timedelta(milliseconds=20)


@dataclass(frozen=True)
class DeletionGuard:
    """When a scan may not delete on its own: a source found empty (an unmounted mount point reads as an empty
    folder), or more than `max_share` of its documents gone. `confirmed` lets one scan through."""

    max_share: float = 0.5
    confirmed: bool = False


def refreshed_sources(conn: psycopg.Connection, configured: Sequence[SourceConfig]
                      ) -> tuple[dict[str, SourceConfig], list[str]]:
    """What a refresh scans ({name: source}: the configured sources, and those an earlier command line registered,
    which keep being refreshed with what it gave them) and the configured sources that left the configuration."""
    by_name = {s.name: s for s in configured}
    registered = {s.name: s for s in store.sources.registered_sources(conn, "command_line") if s.name not in by_name}
    return {**registered, **by_name}, store.sources.configured_sources_removed(conn, list(by_name))


def deletion_hold_reason(guard: DeletionGuard, seen: int, missing: int, judged: int) -> str | None:
    """Why a scan that saw `seen` files and missed `missing` of the `judged` documents must not delete, or None.
    The share is of what the scan could judge: documents kept under unreadable paths are not in it."""
    if not missing or guard.confirmed:
        return None
    if seen == 0:
        return f"the root holds no files but {judged} documents are indexed from it (an unmounted or emptied folder?)"
    if missing > 1 and missing > guard.max_share * judged:
        return f"would delete {missing} of {judged} documents, more than max_deletion_share {guard.max_share:g}"
    return None


def stage(conn: psycopg.Connection, files: Iterable[DiscoveredFile], report: ScanReport) -> ReconcileCounts:
    """Stage one scan of a source (see store.scans.stage_scan); a name listed twice is a problem of the report."""
    seen, duplicates = store.scans.stage_scan(conn, files)
    for name in duplicates:
        report.problem(name, "listed twice under this name (keys the store's client lists alike, such as 'a.md' "
                       "and 'a.md/'); kept as it was", unreadable=True)
    return ReconcileCounts(seen=seen)


def judge(conn: psycopg.Connection, source: str, report: ScanReport) -> tuple[list[str], int, int]:
    """Once the listing is done: (paths the scan could not read, documents gone, documents the scan could judge).
    What was staged under an unreadable path is unstaged: kept as it was."""
    unreadable = list(report.unreadable)  # read after the scan has run, not before
    store.scans.drop_unreadable(conn, unreadable)
    missing, judged = store.scans.count_gone(conn, source, unreadable)
    return unreadable, missing, judged


def racy_window(conn: psycopg.Connection, source: SourceConfig) -> tuple[datetime, datetime] | None:
    """Racily clean: modified while the previous scan ran, give or take the margin. A time past its end (a clock
    ahead, `touch -d`, an unpacked archive) is no write that scan could have missed: judged once, not forever."""
    previous = store.sources.last_scan_window(conn, source.name)
    margin = RACY_MARGIN if source.store_scheme else FILE_CLOCK_TICK
    return (previous[0] - margin, previous[1] + margin) if previous else None


def listing(lookup: psycopg.Connection, source: SourceConfig, report: ScanReport, counters: StoreCounters,
            racy: tuple[datetime, datetime] | None, same_labelling: bool) -> tuple[Iterator[DiscoveredFile], ErasedGate]:
    """The files of one scan of the source, as reconciliation takes them, and the gate that holds erased ones.
    `lookup` is a connection of its own (the scan's streams the listing into the staging table), in autocommit:
    reads between network requests must not sit idle in a transaction for the whole listing."""
    # Labels stored with unchanged objects stand only while what decides labels is as the last scan left it.
    # Racily clean objects (see RACY_MARGIN) are left out of them: their metadata is read again.
    known = functools.partial(store.scans.stored_labels, lookup, source.name, racy=racy) if same_labelling else None
    # An erased document back at its source is held, not indexed again, until it is re-admitted.
    held_if_erased = ErasedGate(lookup, source.name)
    return held_if_erased(kinds.scan(source, report, known, counters)), held_if_erased


ADOPTING_SCHEMES = ("s3", "gs")  # stores whose ETag names the bytes: a moved object keeps its parsed pages


def reconcile(conn: psycopg.Connection, source: str, files: Iterable[DiscoveredFile], report: ScanReport,
              guard: DeletionGuard, adopt: bool = False,
              racy: tuple[datetime, datetime] | None = None) -> ReconcileCounts:
    """Compare one scan of a source with the documents table, in this transaction: the store stages the scan and
    counts what is gone, the guard decides whether it may be deleted, then new, changed, relabelled and held
    documents are applied. Documents under paths the scan could not read (`report.unreadable`, complete once
    `files` is consumed) are kept as they were. Files modified within `racy` (since, until) count as changed."""
    counts = stage(conn, files, report)
    # Writers take turns with the scan (see store.groups): a scan that narrows labels or deletes is never half-seen
    # by an index write. Taken once the scan is staged, so a long listing never stalls the index writers.
    store.groups.lock_assignment(conn)
    unreadable, missing, judged = judge(conn, source, report)
    # An object at a new key with the ETag and size of one already parsed (a move, a copy) takes that one's pages
    # instead of being downloaded and parsed again: after the guard's count (a move of everything is still held
    # for confirmation), before anything is deleted.
    adopted, adopted_named = store.scans.adopt_moved(conn, source, MAX_NAMED) if adopt else (0, [])
    reason = deletion_hold_reason(guard, counts.seen, missing, judged)
    if missing:  # named before they go: a deleted document's ref goes with it
        gone = list(store.scans.gone_documents(conn, source, unreadable, MAX_NAMED))
        counts.documents["deletions_held" if reason else "deleted"] = [d.doc_id for d in gone]
        counts.refs.update({d.doc_id: d.ref for d in gone})
    if reason:
        counts.deletions_held, counts.deletions_held_reason = missing, reason
    elif missing:
        counts.deleted = store.scans.delete_gone(conn, source, unreadable)
    store.scans.apply_scan(conn, source, counts, racy, named=MAX_NAMED)
    counts.adopted = adopted
    counts.documents["adopted"] = adopted_named
    counts.documents["new"] = sorted(counts.documents.get("new", []) + adopted_named)[:MAX_NAMED]
    counts.new += counts.adopted
    counts.refs.update(store.documents.refs_by_id(
        conn, [doc_id for change, ids in counts.documents.items() if change not in ("deleted", "deletions_held")
               for doc_id in ids]))
    return counts


def discover(
    db_url: str, sources: Sequence[SourceConfig], progress: Progress = log_progress, lock_timeout_seconds: float = 3600,
    confirm_deletions: Collection[str] = (), origin: str = "config", removed: Sequence[str] = (),
) -> DiscoverStats:
    """Scan and reconcile each source (registered as coming from `origin`). A scan that would empty a source or
    delete more than its max_deletion_share deletes nothing unless the source is named in `confirm_deletions`.
    The documents of `removed` sources (configured once, no longer) are held: not served, kept for their return."""
    stats = DiscoverStats(sources=len(sources))
    # Shared: discovery never waits for parse or index work (each document's write re-checks its state), so
    # deletions and label changes reach the index while a slow document is still being parsed.
    with locked_stage(db_url, "discover", stats, shared=True, timeout_seconds=lock_timeout_seconds,
                      progress=progress):
        for source in sources:
            try:
                _discover_source(db_url, source, stats, progress, source.name in confirm_deletions, origin)
            except psycopg.OperationalError:
                raise  # the database is gone: no other source can be scanned either
            except Exception as exc:  # one source's failure (its transaction rolled back) never stops the others
                log.exception("discovery of source %s failed", source.name)
                stats.problems.append({"source": source.name, "path": ".", "problem": (
                    f"scan failed, nothing of this source changed: {type(exc).__name__}: {redact_credentials(str(exc))}")})
                progress(f"source {source.name}: scan failed ({type(exc).__name__}: {redact_credentials(str(exc))}); "
                         "nothing changed")
                # Kept on the source's row (its own transaction is gone): staleness fails it at once, and the run
                # fails through that check once the other sources are done.
                with connect(db_url) as conn, conn.transaction():
                    store.sources.record_scan_failure(
                        conn, source, f"{type(exc).__name__}: {redact_credentials(str(exc))}"[:2000], origin)
                stats.scans_failed.append(source.name)
        for name in removed:
            with connect(db_url) as conn, conn.transaction():
                store.sources.lock_source_scan(conn, name)
                if store.sources.forget_never_scanned(conn, name):
                    continue  # registered by failed scans only: nothing to hold, no failure to keep reporting
                served = store.sources.documents_to_hold(conn, name)
                if served and name not in confirm_deletions:
                    # As an emptied root: a wrong configuration file or a misspelt name must not take a source's
                    # documents out of search without a word. Nothing is held until someone confirms it.
                    store.sources.record_hold_refused(conn, name, served, REMOVED_HOLD_REASON)
                    stats.deletions_held += served
                    stats.problems.append({"source": name, "path": ".", "problem": (
                        f"not in the configuration: its {served} documents were NOT held, they are still served. "
                        f"If the source was removed on purpose, run `rag-pipeline ingest --confirm-deletions {name}`; "
                        "else check the configuration file (RAG_CONFIG) and the sources' names")})
                    progress(f"source {name}: not in the configuration; holding its {served} documents needs "
                             f"--confirm-deletions {name}; nothing held")
                    continue
                held = store.sources.hold_source(conn, name) if served else 0
                if held:
                    store.sources.record_hold_confirmed(conn, name)
            stats.held += held
            if held:
                stats.problems.append({"source": name, "path": ".", "problem": (
                    f"removed from the configuration: not scanned, {held} documents held (no longer served); "
                    f"`rag-pipeline erase --source {name}` erases them, adding the source back serves them again")})
                progress(f"source {name}: removed from the configuration; {held} documents held, no longer served")
    return stats


def named_by_ref(problem: ScanProblem, ref: int | None) -> ScanProblem:
    """The problem as a run reports it: a document named by its ref (see rag_pipeline.domain.refs), no credential
    (an object store's error names its endpoint URL)."""
    if ref is None:
        return ScanProblem(problem.rel_path, redact_credentials(problem.problem))
    name = document_name(ref)
    return ScanProblem(name, redact_credentials(without_path(problem.problem, problem.rel_path, name)))


def _discover_source(db_url: str, source: SourceConfig, stats: DiscoverStats, progress: Progress,
                     confirmed: bool, origin: str) -> None:
    scan_started = datetime.now(UTC)
    report = ScanReport()
    missing = kinds.root_problem(source)
    if missing:
        # A missing (unmounted, mistyped) root must never read as "every document was deleted".
        stats.problems.append({"source": source.name, "path": str(source.root),
                               "problem": f"{missing}; nothing changed"})
        progress(f"source {source.name}: {missing}; skipped, nothing deleted")
        with connect(db_url) as conn, conn.transaction():  # a scan that could not run: as loud as a failed one
            store.sources.record_scan_failure(conn, source, missing, origin)
        stats.scans_failed.append(source.name)
        return
    counters = StoreCounters()
    with connect(db_url) as conn, conn.transaction():
        store.sources.lock_source_scan(conn, source.name)  # two scans of one source at once would race
        racy = racy_window(conn, source)
        same_labelling = store.sources.upsert_source(conn, source, origin)
        # One transaction per source: a scan interrupted half-way changes nothing.
        guard = DeletionGuard(source.max_deletion_share, confirmed)
        with connect(db_url, autocommit=True) as lookup:
            files, held_if_erased = listing(lookup, source, report, counters, racy, same_labelling)
            # A racily clean file may hold other bytes under the same size, time and inode: it is parsed again
            # (content_hash spares the embedding). An object's new bytes have a new ETag.
            counts = reconcile(conn, source.name, files, report, guard,
                               adopt=source.store_scheme in ADOPTING_SCHEMES,
                               racy=racy if source.store_scheme is None else None)
        store.sources.record_scan(conn, source.name, scan_started, counts)
        if held_if_erased.not_checked:
            report.problem(".", f"{held_if_erased.not_checked} documents held, not served: "
                           + NOT_CHECKED_REASON.format(len(held_if_erased.erased)))
        listed = report.problems[:MAX_PROBLEMS_SHOWN]
        refs = store.documents.refs_of(conn, [(source.name, p.rel_path) for p in listed])
    shown = [named_by_ref(p, refs.get((source.name, p.rel_path))) for p in listed]
    stats.documents_seen += counts.seen
    stats.new += counts.new
    stats.changed += counts.changed
    stats.released += counts.released
    stats.retitled += counts.retitled
    stats.adopted += counts.adopted
    for change in CHANGE_CLASSES:
        stats.name(change, [document_name(counts.refs.get(doc_id)) for doc_id in counts.documents.get(change, [])])
    stats.unchanged += counts.unchanged
    stats.relabelled += counts.relabelled
    stats.deleted += counts.deleted
    stats.held += counts.held
    stats.deletions_held += counts.deletions_held
    # At most MAX_PROBLEMS_SHOWN: a folder of a million bad entries must not flood the run log.
    stats.problems += [{"source": source.name, "path": p.rel_path, "problem": p.problem} for p in shown]
    if len(report.problems) > len(shown):
        stats.problems.append({"source": source.name, "path": ".",
                               "problem": f"and {len(report.problems) - len(shown)} more problems not listed"})
    if counts.deletions_held_reason:
        stats.problems.append({"source": source.name, "path": ".", "problem": (
            f"{counts.deletions_held} deletions held: {counts.deletions_held_reason}; nothing was deleted. If they "
            f"are meant, run `rag-pipeline ingest --confirm-deletions {source.name}`")})
    stats.per_source[source.name] = {
        "seen": counts.seen, "new": counts.new, "changed": counts.changed, "released": counts.released,
        "retitled": counts.retitled, "deleted": counts.deleted,
        "relabelled": counts.relabelled, "held": counts.held, "deletions_held": counts.deletions_held,
        "adopted": counts.adopted,  # object-store requests below: 0 for a folder
        "list_requests": counters.list_requests, "sidecar_reads": counters.sidecar_reads,
        "metadata_reads": counters.metadata_reads,
    }
    progress(
        f"source {source.name}: {counts.seen} files, {counts.new} new, {counts.changed} changed, "
        + (f"{counts.released} released, " if counts.released else "")
        + (f"{counts.retitled} retitled, " if counts.retitled else "")
        + f"{counts.deleted} deleted, {counts.relabelled} relabelled, {counts.held} newly held back"
        + (f", {counts.deletions_held} deletions held ({counts.deletions_held_reason})" if counts.deletions_held
           else "")
    )
    for problem in shown:
        progress(f"source {source.name}: {problem.rel_path}: {problem.problem}")

