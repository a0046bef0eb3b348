"""The invariants that keep the index true, each as a plain function over the database.

Every check returns a `CheckOutcome`: whether it passed, one line saying why, numbers, and tables of the
worst offenders. Dagster runs them as asset checks (rag_pipeline.defs.checks); they are equally callable
from a script or a test. All of them only read, except `retrieval_quality`, which records its evaluations
(and the first one as the baseline), and `index_drift` as the registry runs it, which re-queues the documents whose
rows or groups drifted; `record` keeps each outcome as the check's latest (the search service's readiness report
shows them).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from rag_pipeline import store
from rag_pipeline.config import ChecksConfig, Settings, SourceConfig
from rag_pipeline.domain.status import DOCUMENT_HELD, VersionStatus
from rag_pipeline.retrieval.evaluation import (
    GATED_METRICS,
    evaluate,
    load_golden,
    paired_differences,
    results_from_json,
)
from rag_pipeline.retrieval.search import SearchOptions
from rag_pipeline.store.versions import IndexVersion

OFFENDERS_SHOWN = 20  # rows per table in check metadata: enough to act on, small enough to read


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: list[tuple[Any, ...]]


@dataclass
class CheckOutcome:
    passed: bool
    summary: str
    numbers: dict[str, int | float | str] = field(default_factory=dict)
    tables: dict[str, Table] = field(default_factory=dict)
    error: bool = False  # fails with severity ERROR whatever the check's own (staleness: a scan that failed)


def _hours(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds / 3600:.1f} h"


# --- staleness ---------------------------------------------------------------------------------------


def staleness(
    conn: psycopg.Connection, configured: Sequence[SourceConfig], now: datetime | None = None
) -> CheckOutcome:
    """Per source: time since the last completed scan and age of the oldest change not yet indexed,
    against the source's freshness SLA. A configured source that was never scanned is stale. A source whose latest
    scan failed fails at once, with severity ERROR (the run that scanned it fails: the check is blocking)."""
    rows = store.health.source_freshness(conn, now or datetime.now(UTC))
    report = {name: rest for name, *rest in rows}
    for source in configured:
        report.setdefault(source.name, [source.freshness_sla_seconds, None, None, 0, 0, None, None])
    stale: list[tuple[float, tuple[Any, ...]]] = []
    table_rows: list[tuple[float, tuple[Any, ...]]] = []
    held_deletions: list[str] = []
    failed: list[str] = []
    for name, (sla, scan_age, pending_age, pending, deletions_held, held_reason, failure) in sorted(report.items()):
        ages = [float(a) for a in (scan_age, pending_age) if a is not None]
        # Never scanned counts as infinitely late; a scan that held deletions back leaves the source not true.
        lateness = (max(ages) / max(1, sla)) if scan_age is not None else float("inf")
        if failure:  # what it serves is as old as its last completed scan, whatever the SLA says
            lateness = float("inf")
            failed.append(f"{name}: its latest scan failed ({failure}); it serves what it held before")
        if deletions_held:
            lateness = float("inf")
            held_deletions.append(f"{name}: {deletions_held} deletions held ({held_reason}); confirm with "
                                  f"`rag-pipeline ingest --confirm-deletions {name}` if they are meant")
        row = (name, _hours(sla), _hours(scan_age), pending, _hours(pending_age) if pending else "-",
               deletions_held, "SCAN FAILED" if failure else "STALE" if lateness > 1 else "ok")
        table_rows.append((lateness, row))
        if lateness > 1:
            stale.append((lateness, row))
    table_rows.sort(key=lambda item: -item[0])
    worst = [row for _, row in table_rows[:OFFENDERS_SHOWN]]
    header = ("source", "SLA", "since last scan", "changes waiting", "oldest waiting", "deletions held", "state")
    summary = (
        f"{len(stale)} of {len(report)} sources past their freshness SLA or holding deletions: "
        + ", ".join(row[0] for _, row in sorted(stale, key=lambda item: -item[0])[:5])
        if stale else f"all {len(report)} sources within their freshness SLA"
    )
    if held_deletions or failed:
        summary += "; " + "; ".join(failed + held_deletions)
    return CheckOutcome(
        passed=not stale,
        summary=summary,
        numbers={"sources": len(report), "stale_sources": len(stale), "failed_scans": len(failed),
                 "deletions_held": sum(int(values[4]) for values in report.values())},
        tables={"freshness_per_source": Table(header, worst)},
        error=bool(failed),
    )


# --- deletion replay ---------------------------------------------------------------------------------

def deletion_replay(conn: psycopg.Connection) -> CheckOutcome:
    """Every document in the deletion log (and not back at its source since) has no row anywhere:
    in every index version (active, building, ready, retained), in chunks, pages, the prefix cache
    and dead letters; and no near-duplicate group is left without occurrences."""
    offenders = store.health.rows_of_deleted_documents(conn)
    deleted_total = store.health.deleted_document_count(conn)
    empty_groups = store.health.empty_group_count(conn)
    documents = sorted({row[0] for row in offenders})
    rows = sum(row[5] for row in offenders)
    problems = []
    if documents:
        problems.append(f"{len(documents)} deleted documents still have {rows} rows: "
                        + ", ".join(d[:12] for d in documents[:5]))
    if empty_groups:
        problems.append(f"{empty_groups} near-duplicate groups have no occurrence left")
    erased, survivors, note = _erasures_replayed(conn)
    if survivors:
        problems.append(f"{len(survivors)} erased documents have rows again (back at their source before they could be "
                        "held?): " + ", ".join(survivors[:5]) + "; the next ingest holds them (held_erased) until "
                        "`rag-pipeline erase --undo` re-admits them, or `erase` erases them again")
    summary = "; ".join(problems) or f"none of the {deleted_total} deleted documents has a row left anywhere"
    return CheckOutcome(
        passed=not problems,
        summary=summary + note,
        numbers={"deleted_documents": deleted_total, "offending_documents": len(documents),
                 "offending_rows": rows, "empty_groups": empty_groups, "erased_documents": erased,
                 "erased_with_rows": len(survivors), "erased_held": store.erasure.held_erased_count(conn)},
        tables={"offenders": Table(
            ("doc_id", "source", "path", "deleted at", "where", "rows"),
            [(r[0], r[1], r[2], r[3].isoformat(timespec="seconds"), r[4], r[5]) for r in offenders[:OFFENDERS_SHOWN]],
        )},
    )


def _erasures_replayed(conn: psycopg.Connection) -> tuple[int, list[str], str]:
    """(erasures recorded and not re-admitted, the erased documents with a row anywhere, a note). Erasure records
    name documents by an HMAC under RAG_PIPELINE_ERASURE_KEY: without the key they cannot be checked (said). A
    document held as erased (back at its source, not re-admitted) is not a survivor: holding it is the point. A
    survivor is named by its ref and the start of its HMAC, never by path."""
    from rag_pipeline.lifecycle.erasure import ErasureError, erasure_key, surviving_erased

    subjects = store.erasure.erased_subjects(conn)
    if not subjects:
        return 0, [], ""
    try:
        key = erasure_key()
    except ErasureError:
        return len(subjects), [], (f"; {len(subjects)} erasures not checked: set RAG_PIPELINE_ERASURE_KEY where "
                                   "checks run")
    survivors = surviving_erased(store.erasure.ids_anywhere(conn), subjects, key)
    refs = store.erasure.refs_of_ids(conn, list(survivors))
    named = sorted((f"#{refs[d]} " if d in refs else "") + f"(erasure {s[:12]})" for d, s in survivors.items())
    return len(subjects), named, ""


# --- ACL coverage ------------------------------------------------------------------------------------


def acl_coverage(conn: psycopg.Connection) -> CheckOutcome:
    """No row in any version without labels, none whose labels differ from its document's, none of a
    document held back for missing labels; every version table refuses unlabelled rows in its schema."""
    per_version: list[tuple[Any, ...]] = []
    problems: list[str] = []
    total_bad = 0
    for version in store.versions.index_versions(conn):
        if not store.health.table_exists(conn, version.table_name):
            continue
        counts = store.health.label_counts(conn, version)
        unlabelled, mismatched, held, guarded = counts.unlabelled, counts.mismatched, counts.held, counts.guarded
        per_version.append((f"v{version.version_id}", version.status, unlabelled, mismatched, held,
                            "yes" if guarded else "NO"))
        total_bad += unlabelled + mismatched + held
        label = version.label
        if unlabelled:
            problems.append(f"{label}: {unlabelled} rows without labels")
        if mismatched:
            problems.append(f"{label}: {mismatched} rows whose labels differ from their document's")
        if held:
            problems.append(f"{label}: {held} rows of documents held back for missing labels")
        if not guarded:
            problems.append(f"{label}: the table lacks the constraint that refuses unlabelled rows")
    unlabelled_docs = store.health.unlabelled_documents_queued(conn)
    if unlabelled_docs:
        problems.append(f"{unlabelled_docs} documents without labels are queued for indexing")
    held = store.documents.held_documents(conn)
    by_status = {status: sum(1 for h in held if h[2] == status) for status in DOCUMENT_HELD}
    summary = "; ".join(problems) or f"every row in {len(per_version)} versions carries its document's labels"
    if held:  # listed, not failed: held documents have nothing in the index, which is what holding means
        summary += "; held back: " + ", ".join(f"{n} {status}" for status, n in by_status.items() if n)
    return CheckOutcome(
        passed=not problems,
        summary=summary,
        numbers={"bad_rows": total_bad, "unlabelled_documents_queued": unlabelled_docs,
                 **{f"documents_{status}": n for status, n in by_status.items()}},
        tables={
            "per_version": Table(("version", "status", "unlabelled rows", "labels differ", "held documents' rows",
                                  "schema refuses unlabelled"), per_version),
            "held_documents": Table(("source", "path", "status", "reason"), held[:OFFENDERS_SHOWN]),
        },
    )


# --- index drift -------------------------------------------------------------------------------------


def index_drift(conn: psycopg.Connection, *, requeue: bool = False, rollback_seconds: float | None = None
                ) -> CheckOutcome:
    """One model and dimension per version, every chunk group with exactly one vector, no orphan rows, BM25
    structures in step with their table, every chunk of an indexed document in a group of its document's label set,
    and the active alias on an active, existing version.

    With `requeue` (the registry's run: each ingest's, `rag-pipeline checks`, index_health), drift the pipeline can
    repair (a misgrouped chunk, a row no chunk backs, a group without a vector) re-queues the indexed documents
    concerned, committed: the check still fails, the next ingest writes them again and it passes. The full-table
    repair runs only here, when drift was found, never on a refresh's routine path.

    It also reports the previous versions kept for rollback and the storage their reclaim frees
    (`reclaimable_bytes`; when, with `rollback_seconds`: retention.rollback)."""
    problems: list[str] = []
    per_version: list[tuple[Any, ...]] = []
    repairable = 0
    # A chunk in another label set's group: that group's row speaks for other labels than its readers'.
    misgrouped = store.groups.misgrouped_chunks(conn)
    if misgrouped:
        problems.append(f"{misgrouped} chunks of indexed documents are in a near-duplicate group of another label "
                        "set")
    for version in store.versions.index_versions(conn):
        label = version.label
        if not store.health.table_exists(conn, version.table_name):
            problems.append(f"{label}: table {version.table_name} is missing")
            per_version.append((label, version.status, version.embedding_model, "missing", "", "", "", ""))
            continue
        column_type = store.health.vector_column_type(conn, version)
        expected_type = f"halfvec({version.dimensions})"
        if column_type != expected_type:
            problems.append(f"{label}: embedding column is {column_type}, expected {expected_type}")
        # A vector that differs from the one this version's model gave for the same input came from another model.
        foreign = store.health.foreign_vectors(conn, version)
        orphans = store.health.orphan_rows(conn, version)
        # A version being built is incomplete by definition; all others receive every write.
        missing = 0 if version.status == VersionStatus.BUILDING else store.versions.groups_without_row(conn, version)
        # BM25 follows every insert and deletion by trigger: its rows and counters must match the table.
        rows = store.versions.row_count(conn, version)
        bm25 = store.versions.bm25_state(conn, version)
        if bm25.rows_weighted != rows or bm25.rows_counted != rows:
            problems.append(f"{label}: BM25 weighs {bm25.rows_weighted} and counts {bm25.rows_counted} of {rows} rows")
        if foreign:
            problems.append(f"{label}: {foreign} vectors differ from what {version.embedding_model} gives")
        if orphans:
            problems.append(f"{label}: {orphans} rows belong to no chunk")
        if missing:
            problems.append(f"{label}: {missing} chunk groups of indexed documents have no vector")
        repairable += orphans + missing
        per_version.append((label, version.status, version.embedding_model, column_type,
                            version.row_count, foreign, orphans, missing))
    alias = store.health.alias_target(conn)
    if alias is None:
        if store.versions.index_versions(conn):
            problems.append("the active alias is not set")
    elif alias.status != VersionStatus.ACTIVE or alias.dropped or not store.health.table_exists(conn, alias.table_name):
        problems.append(f"the active alias points at v{alias.version_id}, which is "
                        f"{'dropped' if alias.dropped else alias.status}")
    previous = store.versions.previous_versions(conn)
    requeued = _requeue_misindexed(conn) if requeue and (misgrouped or repairable) else 0
    repair = (f"; {requeued} indexed documents re-queued: the next ingest writes them again in every version"
              if requeued else "")
    return CheckOutcome(
        passed=not problems,
        summary=("; ".join(problems) + repair)
        or f"{len(per_version)} versions consistent; alias on v{alias.version_id if alias else '-'}",
        numbers={"versions": len(per_version), "problems": len(problems), "misgrouped_chunks": misgrouped,
                 "requeued": requeued, "active_version": alias.version_id if alias else "none",
                 "previous_versions": len(previous),
                 "reclaimable_bytes": sum(p.table_bytes for p in previous if p.pinned_reason is None)},
        tables={"per_version": Table(("version", "status", "model", "vector type", "rows", "foreign vectors",
                                      "orphan rows", "groups without vector"), per_version),
                "previous_versions": Table(("version", "model", "bytes", "previous since", "reclaim due",
                                            "pinned because"), [
                    (p.version.label, p.version.embedding_model, p.table_bytes, f"{p.retired_at:%Y-%m-%d %H:%M}",
                     "never (pinned)" if p.pinned_reason else
                     f"{p.retired_at + timedelta(seconds=rollback_seconds):%Y-%m-%d %H:%M}"
                     if rollback_seconds is not None else "", p.pinned_reason) for p in previous])},
    )


def _requeue_misindexed(conn: psycopg.Connection) -> int:
    """Send the indexed documents whose groups or rows drifted back to indexing (store.groups.requeue_misindexed),
    in a transaction of its own that commits whatever the caller does next: the check's reads are ended first, so
    the assignment lock is held only for the update. Returns how many."""
    conn.commit()  # as `record` does: the caller is a check run, never inside a transaction block
    with conn.transaction():
        store.groups.lock_assignment(conn)  # before the row locks (see store.groups)
        versions = store.versions.writable_versions(conn)
        return store.groups.requeue_misindexed(
            conn, [v.table_name for v in versions],
            [v.table_name for v in versions if v.status != VersionStatus.BUILDING])


# --- parse health ------------------------------------------------------------------------------------


def parse_health(conn: psycopg.Connection, config: ChecksConfig) -> CheckOutcome:
    """Near-empty pages, documents with no text, tier mix and dead letters against thresholds."""
    counts = store.health.parse_counts(conn, config.near_empty_page_chars)
    pages, near_empty, zero_text = counts.pages, counts.near_empty_pages, counts.zero_text_documents
    tiers, dead, live = counts.tiers, counts.dead_letters, counts.live_documents
    # Counted, not failed: a document may discuss prompt injection; the application decides what to do.
    flagged = counts.flagged_chunks
    dead_total = sum(n for _, n in dead)
    near_empty_share = near_empty / pages if pages else 0.0
    dead_share = dead_total / live if live else 0.0
    problems = []
    if near_empty_share > config.max_near_empty_page_share:
        problems.append(f"{near_empty_share:.1%} of pages are near-empty (max {config.max_near_empty_page_share:.0%})")
    if len(zero_text) > config.max_zero_text_documents:
        problems.append(f"{len(zero_text)} documents have no text (max {config.max_zero_text_documents})")
    if dead_share > config.max_dead_letter_share:
        problems.append(f"{dead_share:.1%} of documents are dead letters (max {config.max_dead_letter_share:.0%})")
    return CheckOutcome(
        passed=not problems,
        summary="; ".join(problems) or f"{pages} pages, {near_empty_share:.1%} near-empty, {dead_total} dead letters",
        numbers={"pages": pages, "near_empty_pages": near_empty, "near_empty_share": round(near_empty_share, 4),
                 "zero_text_documents": len(zero_text), "dead_letters": dead_total,
                 "dead_letter_share": round(dead_share, 4), "chunks_flagged_prompt_injection": len(flagged),
                 # counted, not failed: their words were read whole (rag_pipeline.parsing.word_gaps)
                 "pages_words_spaced_by_gaps": counts.spaced_pages, "pages_overprinted": counts.overprinted_pages},
        tables={
            "tier_mix": Table(("tier", "pages"), tiers),
            "dead_letters_by_reason": Table(("reason", "documents"), dead),
            "zero_text_documents": Table(("source", "path", "pages"), zero_text[:OFFENDERS_SHOWN]),
            "prompt_injection_flags": Table(("source", "path", "chunk", "patterns"), flagged[:OFFENDERS_SHOWN]),
        },
    )


# --- retrieval quality -------------------------------------------------------------------------------


def golden_fingerprint(config: ChecksConfig) -> str:
    assert config.golden_set is not None
    digest = hashlib.sha256(config.golden_set.read_bytes())
    digest.update(f"|{','.join(sorted(config.golden_labels))}|{config.k}".encode())
    return digest.hexdigest()


def _evaluate_version(
    conn: psycopg.Connection, version: IndexVersion, config: ChecksConfig, golden_sha: str, options: SearchOptions
) -> tuple[store.evaluations.Evaluation, bool]:
    """A version's evaluation, re-using the last one when the index has not changed since."""
    state = store.evaluations.index_state(conn, version)
    cached = store.evaluations.cached(conn, version.version_id, golden_sha, state)
    if cached is not None and cached.per_question is not None:
        return cached, True
    report = evaluate(conn, load_golden(config.golden_set), list(config.golden_labels), k=config.k,
                      version=version, options=options)
    evaluation = store.evaluations.Evaluation(report.metrics, [asdict(r) for r in report.results])
    store.evaluations.record(conn, version.version_id, golden_sha, config.k, state, evaluation)
    return evaluation, False


def rebaseline(conn: psycopg.Connection, config: ChecksConfig, options: SearchOptions) -> store.evaluations.Metrics:
    """Evaluate the active version now and make the result its baseline (after an intended change)."""
    if config.golden_set is None:
        raise ValueError("no golden set configured (checks.golden_set)")
    active = store.versions.active_version(conn)
    if active is None:
        raise ValueError("there is no active index version")
    golden_sha = golden_fingerprint(config)
    evaluation, _ = _evaluate_version(conn, active, config, golden_sha, options)
    store.evaluations.set_baseline(conn, active.version_id, golden_sha)
    return evaluation.metrics


def record(conn: psycopg.Connection, name: str, outcome: CheckOutcome) -> CheckOutcome:
    """Keep `outcome` as the latest of check `name` (the search service's readiness report shows it)."""
    conn.commit()  # whatever the check read is done; the record is a transaction of its own
    with conn.transaction():
        store.health.record_check(conn, name, outcome.passed, outcome.summary)
    return outcome


def retrieval_quality(
    conn: psycopg.Connection, config: ChecksConfig, options: SearchOptions | None = None
) -> CheckOutcome:
    """Golden-set metrics of the active version, and of any version being built or ready, against the
    active version's baseline (recorded by its first evaluation). Falls by more than the tolerance fail."""
    options = options or SearchOptions()
    if config.golden_set is None:
        return CheckOutcome(True, "no golden set configured (checks.golden_set): retrieval quality is not measured",
                            numbers={"configured": "no"})
    active = store.versions.active_version(conn)
    if active is None:
        return CheckOutcome(True, "no active index version yet", numbers={"configured": "yes"})
    golden_sha = golden_fingerprint(config)
    candidates = [active, *store.versions.index_versions(conn, (VersionStatus.BUILDING, VersionStatus.READY))]
    problems: list[str] = []
    rows: list[tuple[Any, ...]] = []
    reference = store.evaluations.baseline(conn, active.version_id, golden_sha)
    if reference is not None and reference.per_question is None:
        problems.append("the baseline predates per-question results: re-baseline (rag-pipeline checks "
                        "--set-baseline) so differences can be tested")
    reused = 0
    current: dict[str, float] = {}
    for version in candidates:
        evaluation, cached = _evaluate_version(conn, version, config, golden_sha, options)
        reused += cached
        overall = evaluation.metrics.get("overall", {})
        if version.version_id == active.version_id:  # numbers the UI plots over time
            current = {name.replace("@k", "_at_k"): float(overall[name])
                       for name in ("recall@k", "ndcg@k", "hit@k", "mrr") if overall.get(name) is not None}
        if "recall@k" in overall and overall["recall@k"] == 0:
            # Nothing found for any answerable question: a failure whatever the baseline says (a baseline
            # taken on an empty index is 0 too, and "no fall from 0" must not pass).
            problems.append(f"{version.label} recall@{config.k} is 0: no answerable golden question finds its "
                            "pages")
        if reference is None and version.version_id == active.version_id:
            store.evaluations.set_baseline(conn, active.version_id, golden_sha)
            reference = evaluation
        if reference.per_question is None:
            continue
        # A fall fails the check only when it is larger than the tolerance and the paired test calls it real.
        for difference in paired_differences(results_from_json(reference.per_question),
                                             results_from_json(evaluation.per_question)):
            if difference.metric not in GATED_METRICS:
                continue
            regressed = difference.difference < -config.quality_tolerance and difference.significant
            rows.append((version.label, version.status, difference.metric, difference.reference,
                         difference.candidate, difference.difference,
                         f"{difference.ci_low:+.3f}..{difference.ci_high:+.3f}", difference.p_value,
                         "REGRESSED" if regressed else "ok"))
            if regressed:
                problems.append(f"{version.label} {difference.describe()}: below the baseline by more than "
                                f"{config.quality_tolerance}, significantly")
    headline = reference.metrics["overall"] if reference else {}
    return CheckOutcome(
        passed=not problems,
        summary="; ".join(problems) or
        f"{active.label} recall@{config.k} {headline.get('recall@k')} ndcg@{config.k} {headline.get('ndcg@k')}; "
        "no significant fall beyond the tolerance",
        numbers={"configured": "yes", "versions_evaluated": len(candidates), "evaluations_reused": reused,
                 "questions": int(headline.get("questions", 0)), "tolerance": config.quality_tolerance, **current},
        tables={"against_baseline": Table(("version", "status", "metric", "baseline", "now", "delta", "95% CI",
                                           "p", "state"), rows)},
    )


# --- the registry: what the Dagster asset checks, `rag-pipeline checks` and the index_health job loop over ---------


@dataclass(frozen=True)
class IndexCheck:
    name: str
    asset: str  # the asset it checks
    blocking: bool  # protects what readers see: fails with severity ERROR and stops what is downstream in a run
    error: bool  # severity ERROR when it fails (else WARN)
    description: str
    run: Callable[[psycopg.Connection, Settings], CheckOutcome]


CHECKS: tuple[IndexCheck, ...] = (
    # Blocking with severity ERROR only when a source's latest scan failed: that fails the run that scanned it.
    IndexCheck("staleness", "search_index", True, False,
               "Per source: time since the last completed scan and age of the oldest change not yet indexed, "
               "against the source's freshness SLA (freshness_sla in the source's configuration); a source whose "
               "latest scan failed fails at once, with severity ERROR.",
               lambda conn, settings: staleness(conn, settings.sources)),
    IndexCheck("deletion_replay", "search_index", True, True,
               "Every deleted document has zero rows in every index version and every derived table.",
               lambda conn, settings: deletion_replay(conn)),
    IndexCheck("acl_coverage", "search_index", True, True,
               "No row without labels, none whose labels differ from its document's, none of a held document.",
               lambda conn, settings: acl_coverage(conn)),
    IndexCheck("index_drift", "search_index", True, True,
               "One model and dimension per version, one vector per chunk group, no orphan rows, every chunk in a "
               "group of its document's label set, and the active alias on an active version. Documents whose "
               "groups or rows drifted are re-queued (`requeued`): the next ingest writes them again.",
               lambda conn, settings: index_drift(conn, requeue=True,
                                                  rollback_seconds=settings.retention.rollback_seconds)),
    IndexCheck("parse_health", "parsed_documents", False, False,
               "Near-empty pages, documents without text, tier mix and dead letters against the thresholds in the "
               "`checks` configuration.",
               lambda conn, settings: parse_health(conn, settings.checks)),
    # ERROR but not blocking: a version swap has its own promotion gates.
    IndexCheck("retrieval_quality", "search_index", False, True,
               "Golden-set recall@k and nDCG@k of the active version (and of a version being built) against the "
               "active version's stored baseline; re-evaluated only when the index changed.",
               lambda conn, settings: retrieval_quality(conn, settings.checks, SearchOptions.from_settings(settings))),
)
CHECK_NAMES = tuple(check.name for check in CHECKS)


def run_check(conn: psycopg.Connection, check: IndexCheck, settings: Settings) -> CheckOutcome:
    """Run one check and keep its outcome as the check's latest."""
    return record(conn, check.name, check.run(conn, settings))


def run_all(conn: psycopg.Connection, settings: Settings) -> dict[str, CheckOutcome]:
    """All six checks, in the order a person reads them, each outcome recorded."""
    return {check.name: run_check(conn, check, settings) for check in CHECKS}
