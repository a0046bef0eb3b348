"""What a refresh would do, without doing it (`rag-pipeline ingest --dry-run`, the `preview_refresh` job).

Each source is scanned and reconciled by the discover stage's own code (stages.discover: the same listing, staging,
deletion guard and classification, store.scans.classify_scan), inside a transaction that is always rolled back and
that writes nothing but its temporary tables: no document, source, scan record or index row is inserted, updated or
deleted, and no sequence moves. The guarantee is tested with a dump of the index database before and after.

What it cannot know: how a changed file's text changed (that is known once it is parsed; unchanged text reuses its
chunks' vectors through content_hash and the embedding cache), so the work is stated as documents, bytes and the
pages those documents had, not as vectors to embed. A file written between the preview and the refresh changes
what the refresh does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from rag_pipeline import store
from rag_pipeline.config import SourceConfig
from rag_pipeline.domain.refs import document_name, without_path
from rag_pipeline.domain.status import DocumentStatus
from rag_pipeline.endpoints.redaction import redact_credentials
from rag_pipeline.parsing.pages import REPARSE_PDFS_BELOW
from rag_pipeline.sources import kinds
from rag_pipeline.sources.folders import ScanReport
from rag_pipeline.sources.object_stores import StoreCounters
from rag_pipeline.stages import discover as scan
from rag_pipeline.stages.erased import NOT_CHECKED_REASON
from rag_pipeline.store.database import connect
from rag_pipeline.store.scans import ClassifiedDocument

D = DocumentStatus
# The work a refresh implies, in the order it is reported.
WORK = ("documents_to_parse", "bytes_to_parse", "pages_they_had", "documents_to_chunk", "chunks_relabelled_in_place",
        "chunks_removed", "pdfs_for_the_new_parser")


@dataclass(frozen=True)
class PlannedChange:
    """One document a refresh would change, and how."""

    change: str  # one of stages.discover.CHANGE_CLASSES
    source: str
    rel_path: str
    ref: int | None  # None for a document the refresh would add
    detail: str = ""

    def as_dict(self, paths: bool) -> dict[str, Any]:
        """With `paths` (a terminal), its path; without (what Dagster keeps), its ref only, and no path or sidecar
        name of it in the detail (a held document's reason names its sidecar)."""
        named = {"path": self.rel_path} if paths else {}
        detail = redact_credentials(self.detail if paths else without_path(self.detail, self.rel_path, self.name))
        return {"change": self.change, "source": self.source, "document": self.name, **named, "detail": detail}

    @property
    def name(self) -> str:
        return document_name(self.ref) if self.ref is not None else "(new)"


@dataclass
class SourcePreview:
    source: str
    counts: Counter[str] = field(default_factory=Counter)  # as the refresh's summary counts them
    work: Counter[str] = field(default_factory=Counter)
    changes: list[PlannedChange] = field(default_factory=list)
    guards: list[str] = field(default_factory=list)  # what would stop or hold part of the refresh
    problems: list[tuple[str, int | None, str]] = field(default_factory=list)  # (path, ref, problem)
    named: Counter[str] = field(default_factory=Counter)

    def name(self, change: PlannedChange) -> None:
        """Keep the first scan.MAX_NAMED documents of each change (every one is counted)."""
        if self.named[change.change] < scan.MAX_NAMED:
            self.named[change.change] += 1
            self.changes.append(change)


@dataclass
class RefreshPreview:
    sources: list[SourcePreview] = field(default_factory=list)
    pdfs_for_the_new_parser: int = 0  # indexed PDFs and decks a newer parser sends back to parsing once (stages.process)

    def counts(self) -> Counter[str]:
        return sum((s.counts for s in self.sources), Counter())

    def work(self) -> Counter[str]:
        return sum((s.work for s in self.sources), Counter({"pdfs_for_the_new_parser": self.pdfs_for_the_new_parser}))

    def as_dict(self, paths: bool = True) -> dict[str, Any]:
        """JSON-ready. Without `paths` (what Dagster keeps), documents are named by ref only (domain.refs)."""
        totals = self.counts()
        return {
            "writes_nothing": True,
            "counts": {name: totals[name] for name in ("seen", "unchanged", *scan.CHANGE_CLASSES)},
            "work": {name: self.work()[name] for name in WORK},
            "sources": [{
                "source": s.source,
                "counts": dict(s.counts), "work": dict(s.work), "guards": [redact_credentials(g) for g in s.guards],
                "changes": [c.as_dict(paths) for c in s.changes],
                "problems": [_problem(path, ref, problem, paths) for path, ref, problem in s.problems],
            } for s in self.sources],
        }


def _problem(rel_path: str, ref: int | None, problem: str, paths: bool) -> dict[str, str]:
    if paths or ref is None:
        return {"path": rel_path, "problem": problem}
    name = document_name(ref)
    return {"path": name, "problem": without_path(problem, rel_path, name)}


def preview(db_url: str, sources: Sequence[SourceConfig], confirm_deletions: Collection[str] = (),
            removed: Sequence[str] = ()) -> RefreshPreview:
    """What `discover` followed by the document stages would do with these sources (and with `removed` ones, no
    longer configured), changing nothing. A source that cannot be scanned is reported as the refresh would fail it;
    the others are previewed all the same."""
    result = RefreshPreview()
    for source in sources:
        try:
            result.sources.append(_preview_source(db_url, source, source.name in confirm_deletions))
        except psycopg.OperationalError:
            raise  # the database is gone: nothing else can be previewed either
        except Exception as exc:  # as discover: one source's failure never stops the others
            failed = SourcePreview(source.name)
            failed.guards.append(f"the scan would fail, and nothing of this source change: {type(exc).__name__}: "
                                 f"{redact_credentials(str(exc))}")
            result.sources.append(failed)
    with connect(db_url) as conn:
        for name in removed:
            result.sources.append(_preview_removed(conn, name, name in confirm_deletions))
        result.pdfs_for_the_new_parser = store.queue.count_for_parser(conn, REPARSE_PDFS_BELOW)
    return result


def _preview_removed(conn: psycopg.Connection, name: str, confirmed: bool) -> SourcePreview:
    found = SourcePreview(name)
    served = store.sources.documents_to_hold(conn, name)
    if not served:
        return found
    if not confirmed:
        found.counts["deletions_held"] = served
        found.guards.append(f"not in the configuration: its {served} documents would NOT be held (still served) "
                            f"without --confirm-deletions {name}")
        return found
    found.counts["held"] = served
    found.work["chunks_removed"] += store.sources.chunks_of_source(conn, name)
    for document in store.scans.documents_to_hold(conn, name, scan.MAX_NAMED):
        found.name(PlannedChange("held", name, document.rel_path, document.ref,
                                 "its source was removed from the configuration"))
    return found


def _preview_source(db_url: str, source: SourceConfig, confirmed: bool) -> SourcePreview:
    found = SourcePreview(source.name)
    missing_root = kinds.root_problem(source)
    if missing_root:
        found.guards.append(f"{missing_root}: the refresh would skip this source and fail; nothing of it changes")
        return found
    report, counters = ScanReport(), StoreCounters()
    # Rolled back whatever happens: the staging tables are temporary, and nothing else is written.
    with connect(db_url) as conn, conn.transaction(force_rollback=True):
        # As a refresh, not beside another scan of the source; never waiting for one (nor making it wait long).
        if not store.sources.try_lock_source_scan(conn, source.name):
            found.guards.append("a scan of this source is running now: preview it again once that has finished")
            return found
        racy = scan.racy_window(conn, source)
        with connect(db_url, autocommit=True) as lookup:
            files, held_if_erased = scan.listing(lookup, source, report, counters, racy,
                                                 store.sources.same_labelling(conn, source))
            counts = scan.stage(conn, files, report)
        unreadable, missing, judged = scan.judge(conn, source.name, report)
        adopting = source.store_scheme in scan.ADOPTING_SCHEMES
        if adopting:
            store.scans.stage_twins(conn, source.name)
        guard = scan.DeletionGuard(source.max_deletion_share, confirmed)
        guard_reason = scan.deletion_hold_reason(guard, counts.seen, missing, judged)
        store.scans.classify_scan(conn, source.name, racy if source.store_scheme is None else None)
        for document in store.scans.iter_classified(conn, twins=adopting):
            _plan(found, document)
        deleted = "deletions_held" if guard_reason else "deleted"
        for stored in store.scans.gone_documents(conn, source.name, unreadable) if missing else ():
            found.counts[deleted] += 1
            found.name(PlannedChange(deleted, source.name, stored.rel_path, stored.ref,
                                     guard_reason or "not at its source any more"))
            if not guard_reason:
                found.work["chunks_removed"] += stored.chunks
        queued = store.scans.queued(conn, source.name)
        if held_if_erased.not_checked:
            report.problem(".", f"{held_if_erased.not_checked} documents would be held, not served: "
                           + NOT_CHECKED_REASON.format(len(held_if_erased.erased)))
        listed = report.problems[:scan.MAX_PROBLEMS_SHOWN]
        refs = store.documents.refs_of(conn, [(source.name, p.rel_path) for p in listed])
    found.counts["seen"] = counts.seen
    if guard_reason:
        found.guards.append(f"{missing} deletions would be held: {guard_reason}; `ingest --confirm-deletions "
                            f"{source.name}` carries them out")
    found.counts["unchanged"] = (counts.seen - found.counts["new"] - found.counts["changed"]
                                 - found.counts["released"] - found.counts["retitled"])
    for status, documents, size, pages in queued:
        if status == D.PENDING_PARSE:
            found.work["documents_to_parse"] += documents
            found.work["bytes_to_parse"] += size
            found.work["pages_they_had"] += pages
        elif status == D.PENDING_CHUNK:
            found.work["documents_to_chunk"] += documents
        found.counts[f"queued_before_{status}"] += documents
    found.problems = [(p.rel_path, refs.get((source.name, p.rel_path)), redact_credentials(p.problem))
                      for p in listed]
    if len(report.problems) > len(listed):
        found.problems.append((".", None, f"and {len(report.problems) - len(listed)} more problems not listed"))
    return found


def _plan(found: SourcePreview, document: ClassifiedDocument) -> None:
    """Count one classified document (store.scans.ClassifiedDocument) as the refresh would, name it (the first
    MAX_NAMED of each change), and add its work."""
    before, size = document.stored, document.size_bytes
    ref = before.ref if before else None

    def add(kind: str, detail: str) -> None:
        found.counts[kind] += 1
        found.name(PlannedChange(kind, found.source, document.rel_path, ref, detail))

    def to_parse(pages_before: int = 0) -> None:
        found.work["documents_to_parse"] += 1
        found.work["bytes_to_parse"] += size
        found.work["pages_they_had"] += pages_before

    change = document.change
    if change == "new":
        if document.hold_reason:
            add("new", f"held: {document.hold_reason}")
        elif document.twin_ref is not None:
            twin = document_name(document.twin_ref)
            add("new", f"moved or copied from {twin}: its pages are taken, nothing is downloaded or parsed")
            add("adopted", f"the pages of {twin}")
            found.work["documents_to_chunk"] += 1
        else:
            add("new", "parsed")
            to_parse()
    elif change == "changed" and before:
        add("changed", "its file changed: parsed again; unchanged text keeps its vectors")
        to_parse(before.page_count or 0)
    elif change == "released" and before:
        if before.has_pages:
            add("released", "admissible again: chunked from the pages it kept, vectors from the cache")
            found.work["documents_to_chunk"] += 1
        else:
            add("released", "admissible again: parsed")
            to_parse()
    elif change == "retitled" and before:
        add("retitled", "what its sidecar says it is changed: chunked again (its prefixes name it)")
        if before.status in (D.INDEXED, D.PENDING_INDEX):
            found.work["documents_to_chunk"] += 1
    if document.newly_held:
        chunks = before.chunks if before else 0
        add("held", f"held back: {document.hold_reason}" + (f"; its {chunks} chunks leave the index" if chunks else ""))
        found.work["chunks_removed"] += chunks
    if document.relabelled and before:
        add("relabelled", f"labels changed on its {before.chunks} chunks in every version at once, nothing embedded"
            if before.chunks else "labels changed (nothing of it is in the index yet)")
        found.work["chunks_relabelled_in_place"] += before.chunks
