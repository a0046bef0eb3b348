"""The invariants that keep the index true, each as a plain function over the database.

Every check returns a `CheckOutcome`: whether it passed, one line saying why, numbers, and tables of the
worst offenders. Dagster runs them as asset checks (rag_pipeline.defs.checks); they are equally callable
from a script or a test. All of them are read-only, except `retrieval_quality`, which records its
evaluations (and the first one as the baseline).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from rag_pipeline import store
from rag_pipeline.config import ChecksConfig, Settings, SourceConfig

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


def _table_exists(conn: psycopg.Connection, table_name: str) -> bool:
    return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table_name,)).fetchone()[0]


def _hours(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds / 3600:.1f} h"


# --- staleness ---------------------------------------------------------------------------------------


def staleness(
    conn: psycopg.Connection, configured: Sequence[SourceConfig], now: datetime | None = None
) -> CheckOutcome:
    """Per source: time since the last completed scan and age of the oldest change not yet indexed,
    against the source's freshness SLA. A configured source that was never scanned is stale."""
    now = now or datetime.now(UTC)
    rows = conn.execute(
        """SELECT s.name, s.freshness_sla_seconds,
                  extract(epoch FROM %(now)s - s.last_scan_completed_at),
                  extract(epoch FROM %(now)s - min(d.changed_at)),
                  count(d.doc_id)
           FROM sources s
           LEFT JOIN documents d ON d.source = s.name
                AND d.status IN ('pending_parse', 'pending_chunk', 'pending_index')
           GROUP BY s.name ORDER BY s.name""",
        {"now": now},
    ).fetchall()
    report = {name: (sla, scan_age, pending_age, pending) for name, sla, scan_age, pending_age, pending in rows}
    for source in configured:
        report.setdefault(source.name, (source.freshness_sla_seconds, None, None, 0))
    stale: list[tuple[float, tuple[Any, ...]]] = []
    table_rows: list[tuple[float, tuple[Any, ...]]] = []
    for name, (sla, scan_age, pending_age, pending) in sorted(report.items()):
        ages = [float(a) for a in (scan_age, pending_age) if a is not None]
        # Never scanned counts as infinitely late.
        lateness = (max(ages) / max(1, sla)) if scan_age is not None else float("inf")
        row = (name, _hours(sla), _hours(scan_age), pending, _hours(pending_age) if pending else "-",
               "STALE" if lateness > 1 else "ok")
        table_rows.append((lateness, row))
        if lateness > 1:
            stale.append((lateness, row))
    table_rows.sort(key=lambda item: -item[0])
    worst = [row for _, row in table_rows[:OFFENDERS_SHOWN]]
    header = ("source", "SLA", "since last scan", "changes waiting", "oldest waiting", "state")
    summary = (
        f"{len(stale)} of {len(report)} sources past their freshness SLA: "
        + ", ".join(row[0] for _, row in sorted(stale, key=lambda item: -item[0])[:5])
        if stale else f"all {len(report)} sources within their freshness SLA"
    )
    return CheckOutcome(
        passed=not stale,
        summary=summary,
        numbers={"sources": len(report), "stale_sources": len(stale)},
        tables={"freshness_per_source": Table(header, worst)},
    )


# --- deletion replay ---------------------------------------------------------------------------------

# Tables keyed by document, besides the per-version index tables. Groups emptied by a deletion are
# checked separately: their occurrences are gone, so they no longer name a document.
_DOCUMENT_TABLES = ("chunks", "document_pages", "prefix_cache", "dead_letters")
# A document that came back to its source (same source and path) is live again, not deleted.
_DELETED_DOCUMENTS = sql.SQL(
    """SELECT DISTINCT ON (l.doc_id) l.doc_id, l.source, l.rel_path, l.deleted_at
       FROM deletion_log l WHERE NOT EXISTS (SELECT 1 FROM documents d WHERE d.doc_id = l.doc_id)
       ORDER BY l.doc_id, l.deleted_at DESC"""
)


def deletion_replay(conn: psycopg.Connection) -> CheckOutcome:
    """Every document in the deletion log (and not back at its source since) has no row anywhere:
    in every index version (active, building, ready, retained), in chunks, pages, the prefix cache
    and dead letters; and no near-duplicate group is left without occurrences."""
    places = [sql.SQL("SELECT {label} AS place, doc_id FROM {table}").format(
        label=sql.Literal(name), table=sql.Identifier(name)) for name in _DOCUMENT_TABLES]
    for version in store.index_versions(conn):
        if _table_exists(conn, version.table_name):
            places.append(sql.SQL("SELECT {label} AS place, doc_id FROM {table}").format(
                label=sql.Literal(f"{version.table_name} ({version.status})"),
                table=sql.Identifier(version.table_name)))
    offenders = conn.execute(
        sql.SQL(
            """WITH deleted AS ({deleted})
               SELECT x.doc_id, g.source, g.rel_path, g.deleted_at, x.place, count(*)
               FROM ({places}) x JOIN deleted g USING (doc_id)
               GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 5"""
        ).format(deleted=_DELETED_DOCUMENTS, places=sql.SQL(" UNION ALL ").join(places))
    ).fetchall()
    deleted_total = conn.execute(
        sql.SQL("SELECT count(*) FROM ({}) g").format(_DELETED_DOCUMENTS)
    ).fetchone()[0]
    empty_groups = conn.execute(
        "SELECT count(*) FROM chunk_groups g WHERE NOT EXISTS (SELECT 1 FROM chunks c WHERE c.group_id = g.group_id)"
    ).fetchone()[0]
    documents = sorted({row[0] for row in offenders})
    rows = sum(row[5] for row in offenders)
    problems = []
    if documents:
        problems.append(f"{len(documents)} deleted documents still have {rows} rows: "
                        + ", ".join(d[:12] for d in documents[:5]))
    if empty_groups:
        problems.append(f"{empty_groups} near-duplicate groups have no occurrence left")
    return CheckOutcome(
        passed=not problems,
        summary="; ".join(problems) or f"none of the {deleted_total} deleted documents has a row left anywhere",
        numbers={"deleted_documents": deleted_total, "offending_documents": len(documents),
                 "offending_rows": rows, "empty_groups": empty_groups},
        tables={"offenders": Table(
            ("doc_id", "source", "path", "deleted at", "where", "rows"),
            [(r[0], r[1], r[2], r[3].isoformat(timespec="seconds"), r[4], r[5]) for r in offenders[:OFFENDERS_SHOWN]],
        )},
    )


# --- ACL coverage ------------------------------------------------------------------------------------


def acl_coverage(conn: psycopg.Connection) -> CheckOutcome:
    """No row in any version without labels, none whose labels differ from its document's, none of a
    document held back for missing labels; every version table refuses unlabelled rows in its schema."""
    per_version: list[tuple[Any, ...]] = []
    problems: list[str] = []
    total_bad = 0
    for version in store.index_versions(conn):
        if not _table_exists(conn, version.table_name):
            continue
        table = sql.Identifier(version.table_name)
        unlabelled, mismatched, held = conn.execute(
            sql.SQL(
                """SELECT count(*) FILTER (WHERE cardinality(t.acl_labels) = 0),
                          count(*) FILTER (WHERE d.acl_labels IS DISTINCT FROM t.acl_labels),
                          count(*) FILTER (WHERE d.status = 'held_no_labels')
                   FROM {} t LEFT JOIN documents d USING (doc_id)"""
            ).format(table)
        ).fetchone()
        guarded = conn.execute(
            """SELECT count(*) > 0 FROM pg_constraint
               WHERE conrelid = to_regclass(%s) AND contype = 'c'
                 AND pg_get_constraintdef(oid) LIKE '%%cardinality(acl_labels) > 0%%'""",
            (version.table_name,),
        ).fetchone()[0]
        per_version.append((f"v{version.version_id}", version.status, unlabelled, mismatched, held,
                            "yes" if guarded else "NO"))
        total_bad += unlabelled + mismatched + held
        label = f"v{version.version_id}"
        if unlabelled:
            problems.append(f"{label}: {unlabelled} rows without labels")
        if mismatched:
            problems.append(f"{label}: {mismatched} rows whose labels differ from their document's")
        if held:
            problems.append(f"{label}: {held} rows of documents held back for missing labels")
        if not guarded:
            problems.append(f"{label}: the table lacks the constraint that refuses unlabelled rows")
    unlabelled_docs = conn.execute(
        "SELECT count(*) FROM documents WHERE cardinality(acl_labels) = 0 AND status <> 'held_no_labels'"
    ).fetchone()[0]
    if unlabelled_docs:
        problems.append(f"{unlabelled_docs} documents without labels are queued for indexing")
    held = store.held_documents(conn)
    return CheckOutcome(
        passed=not problems,
        summary="; ".join(problems) or f"every row in {len(per_version)} versions carries its document's labels",
        numbers={"bad_rows": total_bad, "unlabelled_documents_queued": unlabelled_docs,
                 "documents_held_no_labels": len(held)},
        tables={
            "per_version": Table(("version", "status", "unlabelled rows", "labels differ", "held documents' rows",
                                  "schema refuses unlabelled"), per_version),
            "held_no_labels": Table(("source", "path"), held[:OFFENDERS_SHOWN]),
        },
    )


# --- index drift -------------------------------------------------------------------------------------


def index_drift(conn: psycopg.Connection) -> CheckOutcome:
    """One model and dimension per version, every chunk group with exactly one vector, no orphan rows,
    and the active alias on an active, existing version."""
    problems: list[str] = []
    per_version: list[tuple[Any, ...]] = []
    for version in store.index_versions(conn):
        label = f"v{version.version_id}"
        if not _table_exists(conn, version.table_name):
            problems.append(f"{label}: table {version.table_name} is missing")
            per_version.append((label, version.status, version.embedding_model, "missing", "", "", "", ""))
            continue
        table = sql.Identifier(version.table_name)
        column_type = conn.execute(
            """SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
               WHERE a.attrelid = to_regclass(%s) AND a.attname = 'embedding' AND NOT a.attisdropped""",
            (version.table_name,),
        ).fetchone()
        expected_type = f"halfvec({version.dimensions})"
        if column_type is None or column_type[0] != expected_type:
            problems.append(f"{label}: embedding column is {column_type and column_type[0]}, expected {expected_type}")
        # A vector that differs from the one this version's model gave for the same input came from another model.
        foreign = conn.execute(
            sql.SQL(
                """SELECT count(*) FROM {} t JOIN embedding_cache c
                       ON c.model = %s AND c.input_sha = t.embedding_input_sha
                   WHERE (t.embedding <=> c.embedding) > 0.001"""
            ).format(table),
            (version.embedding_model,),
        ).fetchone()[0]
        orphans = conn.execute(
            sql.SQL(
                """SELECT count(*) FROM {} t
                   WHERE NOT EXISTS (SELECT 1 FROM chunks c
                                     WHERE c.chunk_id = t.owner_chunk_id AND c.doc_id = t.doc_id
                                       AND coalesce(c.group_id, c.chunk_id) = t.chunk_id)"""
            ).format(table)
        ).fetchone()[0]
        # A version being built is incomplete by definition; all others receive every write.
        missing = 0 if version.status == "building" else store.groups_without_row(conn, version)
        if foreign:
            problems.append(f"{label}: {foreign} vectors differ from what {version.embedding_model} gives")
        if orphans:
            problems.append(f"{label}: {orphans} rows belong to no chunk")
        if missing:
            problems.append(f"{label}: {missing} chunk groups of indexed documents have no vector")
        per_version.append((label, version.status, version.embedding_model, column_type and column_type[0],
                            version.row_count, foreign, orphans, missing))
    alias = conn.execute(
        """SELECT a.version_id, v.status, v.dropped_at IS NOT NULL, v.table_name
           FROM index_alias a JOIN index_versions v USING (version_id) WHERE a.alias = %s""",
        (store.ACTIVE_ALIAS,),
    ).fetchone()
    if alias is None:
        if store.index_versions(conn):
            problems.append("the active alias is not set")
    elif alias[1] != "active" or alias[2] or not _table_exists(conn, alias[3]):
        problems.append(f"the active alias points at v{alias[0]}, which is {'dropped' if alias[2] else alias[1]}")
    return CheckOutcome(
        passed=not problems,
        summary="; ".join(problems) or f"{len(per_version)} versions consistent; alias on v{alias[0] if alias else '-'}",
        numbers={"versions": len(per_version), "problems": len(problems),
                 "active_version": alias[0] if alias else "none"},
        tables={"per_version": Table(("version", "status", "model", "vector type", "rows", "foreign vectors",
                                      "orphan rows", "groups without vector"), per_version)},
    )


# --- parse health ------------------------------------------------------------------------------------


def parse_health(conn: psycopg.Connection, config: ChecksConfig) -> CheckOutcome:
    """Near-empty pages, documents with no text, tier mix and dead letters against thresholds."""
    pages, near_empty = conn.execute(
        """SELECT count(*), count(*) FILTER (WHERE length(btrim(p.markdown)) < %s)
           FROM document_pages p JOIN documents d USING (doc_id) WHERE d.status <> 'dead_letter'""",
        (config.near_empty_page_chars,),
    ).fetchone()
    zero_text = conn.execute(
        """SELECT d.source, d.rel_path, count(*) FROM documents d JOIN document_pages p USING (doc_id)
           WHERE d.status <> 'dead_letter'
           GROUP BY d.doc_id HAVING sum(length(btrim(p.markdown))) = 0 ORDER BY 1, 2"""
    ).fetchall()
    tiers = conn.execute(
        "SELECT tier, count(*) FROM document_pages GROUP BY tier ORDER BY count(*) DESC"
    ).fetchall()
    dead = conn.execute(
        "SELECT reason, count(*) FROM dead_letters GROUP BY reason ORDER BY count(*) DESC, reason"
    ).fetchall()
    live = conn.execute("SELECT count(*) FROM documents WHERE status <> 'held_no_labels'").fetchone()[0]
    # Counted, not failed: a document may discuss prompt injection; the application decides what to do.
    flagged = conn.execute(
        """SELECT d.source, d.rel_path, c.ordinal, array_to_string(c.flags, ', ')
           FROM chunks c JOIN documents d USING (doc_id) WHERE cardinality(c.flags) > 0
           ORDER BY d.source, d.rel_path, c.ordinal"""
    ).fetchall()
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
                 "dead_letter_share": round(dead_share, 4), "chunks_flagged_prompt_injection": len(flagged)},
        tables={
            "tier_mix": Table(("tier", "pages"), tiers),
            "dead_letters_by_reason": Table(("reason", "documents"), dead),
            "zero_text_documents": Table(("source", "path", "pages"), zero_text[:OFFENDERS_SHOWN]),
            "prompt_injection_flags": Table(("source", "path", "chunk", "patterns"), flagged[:OFFENDERS_SHOWN]),
        },
    )


# --- retrieval quality -------------------------------------------------------------------------------

QUALITY_METRICS = ("recall@k", "ndcg@k")


def golden_fingerprint(config: ChecksConfig) -> str:
    assert config.golden_set is not None
    digest = hashlib.sha256(config.golden_set.read_bytes())
    digest.update(f"|{','.join(sorted(config.golden_labels))}|{config.k}".encode())
    return digest.hexdigest()


def index_state(conn: psycopg.Connection, version: store.IndexVersion) -> str:
    """Changes whenever what a search could return changes: rows, indexing, deletions, labels."""
    rows = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(version.table_name))).fetchone()[0]
    indexed, seen, deleted = conn.execute(
        """SELECT (SELECT max(indexed_at) FROM documents), (SELECT max(last_seen) FROM documents),
                  (SELECT max(id) FROM deletion_log)"""
    ).fetchone()
    return f"v{version.version_id}|{rows}|{indexed}|{seen}|{deleted}"


def _evaluate_version(
    conn: psycopg.Connection, version: store.IndexVersion, config: ChecksConfig, golden_sha: str, device: str
) -> tuple[dict[str, dict[str, float]], bool]:
    """Metrics of a version, re-using the last evaluation when the index has not changed since."""
    from rag_pipeline.evaluation import evaluate, load_golden

    state = index_state(conn, version)
    cached = conn.execute(
        """SELECT metrics FROM retrieval_evaluations WHERE version_id = %s AND golden_sha = %s AND index_state = %s
           ORDER BY id DESC LIMIT 1""",
        (version.version_id, golden_sha, state),
    ).fetchone()
    if cached:
        return cached[0], True
    report = evaluate(conn, load_golden(config.golden_set), list(config.golden_labels), k=config.k,
                      version=version, device=device)
    conn.execute(
        """INSERT INTO retrieval_evaluations (version_id, golden_sha, k, index_state, metrics)
           VALUES (%s, %s, %s, %s, %s)""",
        (version.version_id, golden_sha, config.k, state, Jsonb(report.metrics)),
    )
    return report.metrics, False


def baseline(conn: psycopg.Connection, version_id: int, golden_sha: str) -> dict[str, dict[str, float]] | None:
    row = conn.execute(
        "SELECT metrics FROM retrieval_evaluations WHERE version_id = %s AND golden_sha = %s AND is_baseline",
        (version_id, golden_sha),
    ).fetchone()
    return row[0] if row else None


def set_baseline(conn: psycopg.Connection, version_id: int, golden_sha: str) -> bool:
    """Make the latest evaluation of a version its baseline (after an intended change). False: none yet."""
    latest = conn.execute(
        "SELECT id FROM retrieval_evaluations WHERE version_id = %s AND golden_sha = %s ORDER BY id DESC LIMIT 1",
        (version_id, golden_sha),
    ).fetchone()
    if latest is None:
        return False
    conn.execute(
        "UPDATE retrieval_evaluations SET is_baseline = false WHERE version_id = %s AND golden_sha = %s AND is_baseline",
        (version_id, golden_sha),
    )
    conn.execute("UPDATE retrieval_evaluations SET is_baseline = true WHERE id = %s", (latest[0],))
    return True


def rebaseline(conn: psycopg.Connection, config: ChecksConfig, device: str = "cpu") -> dict[str, dict[str, float]]:
    """Evaluate the active version now and make the result its baseline (after an intended change)."""
    if config.golden_set is None:
        raise ValueError("no golden set configured (checks.golden_set)")
    active = store.active_version(conn)
    if active is None:
        raise ValueError("there is no active index version")
    golden_sha = golden_fingerprint(config)
    metrics, _ = _evaluate_version(conn, active, config, golden_sha, device)
    set_baseline(conn, active.version_id, golden_sha)
    return metrics


def run_all(conn: psycopg.Connection, settings: Settings) -> dict[str, CheckOutcome]:
    """All six checks, in the order a person reads them."""
    return {
        "staleness": staleness(conn, settings.sources),
        "deletion_replay": deletion_replay(conn),
        "acl_coverage": acl_coverage(conn),
        "index_drift": index_drift(conn),
        "parse_health": parse_health(conn, settings.checks),
        "retrieval_quality": retrieval_quality(conn, settings.checks, device=settings.embedding.device),
    }


def retrieval_quality(conn: psycopg.Connection, config: ChecksConfig, device: str = "cpu") -> CheckOutcome:
    """Golden-set metrics of the active version, and of any version being built or ready, against the
    active version's baseline (recorded by its first evaluation). Falls by more than the tolerance fail."""
    if config.golden_set is None:
        return CheckOutcome(True, "no golden set configured (checks.golden_set): retrieval quality is not measured",
                            numbers={"configured": "no"})
    active = store.active_version(conn)
    if active is None:
        return CheckOutcome(True, "no active index version yet", numbers={"configured": "yes"})
    golden_sha = golden_fingerprint(config)
    candidates = [active, *store.index_versions(conn, ("building", "ready"))]
    problems: list[str] = []
    rows: list[tuple[Any, ...]] = []
    reference = baseline(conn, active.version_id, golden_sha)
    reused = 0
    for version in candidates:
        metrics, cached = _evaluate_version(conn, version, config, golden_sha, device)
        reused += cached
        overall = metrics["overall"]
        if reference is None and version.version_id == active.version_id:
            set_baseline(conn, active.version_id, golden_sha)
            reference = metrics
        base = reference["overall"]
        for metric in QUALITY_METRICS:
            value, before = overall.get(metric, 0.0), base.get(metric, 0.0)
            regressed = value < before - config.quality_tolerance
            rows.append((f"v{version.version_id}", version.status, metric, before, value, round(value - before, 4),
                         "REGRESSED" if regressed else "ok"))
            if regressed:
                problems.append(f"v{version.version_id} {metric} {value} < baseline {before} - {config.quality_tolerance}")
    headline = reference["overall"] if reference else {}
    return CheckOutcome(
        passed=not problems,
        summary="; ".join(problems) or
        f"v{active.version_id} recall@{config.k} {headline.get('recall@k')} ndcg@{config.k} {headline.get('ndcg@k')}"
        " within tolerance of the baseline",
        numbers={"configured": "yes", "versions_evaluated": len(candidates), "evaluations_reused": reused,
                 "questions": int(headline.get("questions", 0)), "tolerance": config.quality_tolerance},
        tables={"against_baseline": Table(("version", "status", "metric", "baseline", "now", "delta", "state"), rows)},
    )
