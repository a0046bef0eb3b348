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
from rag_pipeline.store.scans import StoredDocument

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
        named = {"path": self.rel_path} if paths else {}
        detail = self.detail if paths or not self.rel_path else self.detail.replace(self.rel_path, self.name)
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


@dataclass
class RefreshPreview:
    sources: list[SourcePreview] = field(default_factory=list)
    pdfs_for_the_new_parser: int = 0  # indexed PDFs a newer parser sends back to parsing once (stages.process)

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
                "counts": dict(s.counts), "work": dict(s.work), "guards": s.guards,
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
    longer configured), changing nothing."""
    result = RefreshPreview()
    for source in sources:
        result.sources.append(_preview_source(db_url, source, source.name in confirm_deletions))
    with connect(db_url) as conn:
        for name in removed:
            result.sources.append(_preview_removed(conn, name, name in confirm_deletions))
        result.pdfs_for_the_new_parser = store.queue.count_for_parser(conn, REPARSE_PDFS_BELOW)
    return result


def _preview_removed(conn: Any, name: str, confirmed: bool) -> SourcePreview:
    found = SourcePreview(name)
    served = store.sources.documents_to_hold(conn, name)
    if not served:
        return found
    if not confirmed:
        found.counts["deletions_held"] = served
        found.guards.append(f"not in the configuration: its {served} documents would NOT be held (still served) "
                            f"without --confirm-deletions {name}")
        return found
    documents = store.scans.stored_documents(conn, store.sources.documents_served_by(conn, name))
    found.counts["held"] = len(documents)
    found.changes += [PlannedChange("held", name, d.rel_path, d.ref, scan.REMOVED_HOLD_REASON.split(";")[0])
                      for d in sorted(documents.values(), key=lambda d: d.rel_path)]
    found.work["chunks_removed"] += sum(d.chunks for d in documents.values())
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
        store.sources.lock_source_scan(conn, source.name)  # as a refresh: not beside another scan of the source
        racy = scan.racy_window(conn, source)
        with connect(db_url, autocommit=True) as lookup:
            files, held_if_erased = scan.listing(lookup, source, report, counters, racy,
                                            store.sources.same_labelling(conn, source))
            counts = scan.stage(conn, files, report)
        unreadable, missing, judged = scan.judge(conn, source.name, report)
        twins: dict[str, str] = {}
        if source.store_scheme in scan.ADOPTING_SCHEMES:
            store.scans.stage_twins(conn, source.name)
            twins = store.scans.twins_staged(conn)
        guard = scan.DeletionGuard(source.max_deletion_share, confirmed)
        guard_reason = scan.deletion_hold_reason(guard, counts.seen, missing, judged)
        gone = store.scans.gone_documents(conn, source.name, unreadable) if missing else []
        changes = store.scans.classify_scan(conn, source.name, racy if source.store_scheme is None else None)
        staged = store.scans.staged_files(conn, [c.doc_id for c in changes])
        stored = store.scans.stored_documents(conn, [c.doc_id for c in changes] + gone + list(twins.values()))
        queued = store.scans.queued(conn, source.name, [c.doc_id for c in changes] + gone)
        if held_if_erased.not_checked:
            report.problem(".", f"{held_if_erased.not_checked} documents would be held, not served: "
                           + NOT_CHECKED_REASON.format(len(held_if_erased.erased)))
        listed = report.problems[:scan.MAX_PROBLEMS_SHOWN]
        refs = store.documents.refs_of(conn, [(source.name, p.rel_path) for p in listed])
    found.counts["seen"] = counts.seen
    for change in changes:
        _plan(found, change, staged[change.doc_id], stored.get(change.doc_id), twins, stored)
    deleted = "deletions_held" if guard_reason else "deleted"
    for doc_id in gone:
        document = stored[doc_id]
        found.counts[deleted] += 1
        found.changes.append(PlannedChange(deleted, source.name, document.rel_path, document.ref,
                                           guard_reason or "not at its source any more"))
        if not guard_reason:
            found.work["chunks_removed"] += document.chunks
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
    found.changes.sort(key=lambda c: (scan.CHANGE_CLASSES.index(c.change), c.rel_path))
    found.problems = [(p.rel_path, refs.get((source.name, p.rel_path)), redact_credentials(p.problem))
                      for p in listed]
    return found


def _plan(found: SourcePreview, change: Any, staged: tuple[str, int, str | None], before: StoredDocument | None,
          twins: dict[str, str], stored: dict[str, StoredDocument]) -> None:
    """Count and name one classified document (store.scans.StagedChange) as the refresh would, with its work."""
    rel_path, size, hold_reason = staged
    ref = before.ref if before else None

    def add(kind: str, detail: str) -> None:
        found.counts[kind] += 1
        found.changes.append(PlannedChange(kind, found.source, rel_path, ref, detail))

    def to_parse(pages_before: int = 0) -> None:
        found.work["documents_to_parse"] += 1
        found.work["bytes_to_parse"] += size
        found.work["pages_they_had"] += pages_before

    if change.change == "new":
        twin = stored.get(twins.get(change.doc_id, ""))
        if hold_reason:
            add("new", f"held: {hold_reason}")
        elif twin:
            add("new", f"moved or copied from {twin.rel_path}: its pages are taken, nothing is downloaded or parsed")
            add("adopted", f"the pages of {document_name(twin.ref)}")
            found.work["documents_to_chunk"] += 1
        else:
            add("new", "parsed")
            to_parse()
    elif change.change == "changed" and before:
        add("changed", "its file changed: parsed again; unchanged text keeps its vectors")
        to_parse(before.page_count or 0)
    elif change.change == "released" and before:
        if before.has_pages:
            add("released", "admissible again: chunked from the pages it kept, vectors from the cache")
            found.work["documents_to_chunk"] += 1
        else:
            add("released", "admissible again: parsed")
            to_parse()
    elif change.change == "retitled" and before:
        add("retitled", "what its sidecar says it is changed: chunked again (its prefixes name it)")
        if before.status in (D.INDEXED, D.PENDING_INDEX):
            found.work["documents_to_chunk"] += 1
    if change.newly_held:
        chunks = before.chunks if before else 0
        add("held", f"held back: {hold_reason}" + (f"; its {chunks} chunks leave the index" if chunks else ""))
        found.work["chunks_removed"] += chunks
    if change.relabelled and before:
        add("relabelled", f"labels changed on its {before.chunks} chunks in every version at once, nothing embedded"
            if before.chunks else "labels changed (nothing of it is in the index yet)")
        found.work["chunks_relabelled_in_place"] += before.chunks
