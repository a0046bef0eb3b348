"""The six index checks: each passes on a clean index, fails when its condition is broken on purpose, and
passes again once repaired. One sample-corpus ingest is cloned (CREATE DATABASE ... TEMPLATE) per test."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest
from dagster import AssetCheckKey, AssetKey, DagsterInstance
from psycopg import sql

from rag_pipeline import health, ids
from rag_pipeline.config import ChecksConfig, SourceConfig
from rag_pipeline.defs.checks import CHECK_NAMES
from rag_pipeline.defs.code_location import build_definitions
from rag_pipeline.runs import run_ingest
from rag_pipeline.stages.index import index_pending
from rag_pipeline.store import evaluations, groups
from rag_pipeline.store import versions as version_store


def _table(conn) -> sql.Identifier:
    return sql.Identifier(version_store.active_version(conn).table_name)


def _doc_id(rel_path: str) -> str:
    return ids.doc_id("sample", rel_path)


def test_every_check_passes_on_a_clean_ingest(clone):
    conn, settings = clone
    outcomes = health.run_all(conn, settings)
    assert set(outcomes) == set(CHECK_NAMES)
    for name, outcome in outcomes.items():
        assert outcome.passed, (name, outcome.summary)
    # The held document is listed, and the dead letter counted, without failing anything.
    assert outcomes["acl_coverage"].tables["held_no_labels"].rows == [("sample", "drafts/unreviewed-notes.md")]
    assert outcomes["parse_health"].tables["dead_letters_by_reason"].rows == [("truncated", 1)]
    assert outcomes["retrieval_quality"].numbers["questions"] == 48


def test_staleness_fails_past_the_sla_and_recovers_after_a_scan(clone):
    conn, settings = clone
    conn.execute("UPDATE sources SET last_scan_completed_at = now() - interval '25 hours'")
    outcome = health.staleness(conn, settings.sources)
    assert not outcome.passed and "sample" in outcome.summary
    assert outcome.tables["freshness_per_source"].rows[0][0] == "sample"
    assert outcome.tables["freshness_per_source"].rows[0][-1] == "STALE"
    conn.execute("UPDATE sources SET last_scan_completed_at = now()")
    assert health.staleness(conn, settings.sources).passed

    # A change waiting longer than the SLA is stale even though scans keep running.
    conn.execute("UPDATE documents SET status = 'pending_index', changed_at = now() - interval '2 days' "
                 "WHERE doc_id = %s", (_doc_id("products/nw200-faq.html"),))
    outcome = health.staleness(conn, settings.sources)
    assert not outcome.passed and outcome.tables["freshness_per_source"].rows[0][3] == 1
    index_pending(conn.info.dsn, settings)
    assert health.staleness(conn, settings.sources).passed

    # A configured source that was never scanned is stale.
    never = SourceConfig(name="archive", root=Path("/nonexistent"), acl_labels=("staff",))
    outcome = health.staleness(conn, (*settings.sources, never))
    assert not outcome.passed and "archive" in outcome.summary


def test_deletion_replay_finds_rows_of_deleted_documents(clone):
    conn, settings = clone
    doc_id = _doc_id("products/nw200-faq.html")
    columns = sql.SQL(", ").join(sql.Identifier(c) for c in _columns(conn) if c != "tsv")  # tsv is generated
    conn.execute(sql.SQL("CREATE TABLE saved_rows AS SELECT {} FROM {} WHERE doc_id = %s").format(
        columns, _table(conn)), (doc_id,))
    # The document is deleted at its source: rows go with it (cascade), the log remembers it.
    with conn.transaction():
        conn.execute("INSERT INTO deletion_log (doc_id, source, rel_path) VALUES (%s, 'sample', 'products/nw200-faq.html')",
                     (doc_id,))
        conn.execute("DELETE FROM documents WHERE doc_id = %s", (doc_id,))
        groups.drop_empty(conn, [r[0] for r in conn.execute("SELECT group_id FROM chunk_groups").fetchall()])
    assert health.deletion_replay(conn).passed

    # A restore from an old backup (loaded with foreign keys off) brings its rows back.
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(sql.SQL("INSERT INTO {} ({}) SELECT {} FROM saved_rows").format(_table(conn), columns, columns))
        conn.execute("INSERT INTO prefix_cache (doc_id, doc_content_hash, chunk_hash, prompt_version, prefix) "
                     "VALUES (%s, 'h', 'c', 'v1', 'stale prefix')", (doc_id,))
    outcome = health.deletion_replay(conn)
    assert not outcome.passed and doc_id[:12] in outcome.summary
    places = {row[4] for row in outcome.tables["offenders"].rows}
    assert places == {"prefix_cache", f"{version_store.active_version(conn).table_name} (active)"}
    assert outcome.numbers["offending_documents"] == 1

    with conn.transaction():
        conn.execute(sql.SQL("DELETE FROM {} WHERE doc_id = %s").format(_table(conn)), (doc_id,))
        conn.execute("DELETE FROM prefix_cache WHERE doc_id = %s", (doc_id,))
    assert health.deletion_replay(conn).passed

    # A near-duplicate group left without any occurrence is a leftover too.
    conn.execute("INSERT INTO chunk_groups (group_id, acl_key, lsh_params, signature) VALUES ('g', 'staff', 'p', '{1}')")
    outcome = health.deletion_replay(conn)
    assert not outcome.passed and outcome.numbers["empty_groups"] == 1
    conn.execute("DELETE FROM chunk_groups WHERE group_id = 'g'")
    assert health.deletion_replay(conn).passed


def _columns(conn) -> list[str]:
    return [c.name for c in conn.execute(sql.SQL("SELECT * FROM {} LIMIT 0").format(_table(conn))).description]


def test_acl_coverage_fails_on_stripped_or_stale_labels(clone):
    conn, _ = clone
    table = _table(conn)
    table_name = version_store.active_version(conn).table_name
    chunk_id = conn.execute(sql.SQL("SELECT chunk_id FROM {} LIMIT 1").format(table)).fetchone()[0]
    # The schema refuses an unlabelled row outright...
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(sql.SQL("UPDATE {} SET acl_labels = '{{}}' WHERE chunk_id = %s").format(table), (chunk_id,))
    # ...so stripping labels takes a table that lost its constraint (hand-made, or an old build).
    constraint = conn.execute(
        "SELECT conname FROM pg_constraint WHERE conrelid = to_regclass(%s) AND contype = 'c'", (table_name,)
    ).fetchone()[0]
    conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(table, sql.Identifier(constraint)))
    conn.execute(sql.SQL("UPDATE {} SET acl_labels = '{{}}' WHERE chunk_id = %s").format(table), (chunk_id,))
    outcome = health.acl_coverage(conn)
    assert not outcome.passed
    assert "1 rows without labels" in outcome.summary and "lacks the constraint" in outcome.summary

    conn.execute(sql.SQL("UPDATE {} SET acl_labels = '{{staff}}' WHERE chunk_id = %s").format(table), (chunk_id,))
    conn.execute(sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} CHECK (cardinality(acl_labels) > 0)").format(
        table, sql.Identifier(constraint)))
    assert health.acl_coverage(conn).passed

    # A row still carrying labels its document no longer has is a leak waiting to happen.
    conn.execute(sql.SQL("UPDATE {} SET acl_labels = '{{staff,contractors}}' WHERE chunk_id = %s").format(table),
                 (chunk_id,))
    outcome = health.acl_coverage(conn)
    assert not outcome.passed and "labels differ" in outcome.summary
    conn.execute(sql.SQL("UPDATE {} SET acl_labels = '{{staff}}' WHERE chunk_id = %s").format(table), (chunk_id,))
    assert health.acl_coverage(conn).passed


def test_index_drift_finds_foreign_vectors_missing_rows_and_a_bad_alias(clone):
    conn, settings = clone
    table = _table(conn)
    version = version_store.active_version(conn)
    chunk_id, doc_id = conn.execute(sql.SQL("SELECT chunk_id, doc_id FROM {} ORDER BY chunk_id LIMIT 1").format(table)).fetchone()
    # A vector another model wrote (same dimension, different numbers).
    saved = conn.execute(sql.SQL("SELECT embedding FROM {} WHERE chunk_id = %s").format(table), (chunk_id,)).fetchone()[0]
    conn.execute(sql.SQL("UPDATE {} SET embedding = %s WHERE chunk_id = %s").format(table),
                 ("[" + ",".join(["0.5", "-0.5"] * (version.dimensions // 2)) + "]", chunk_id))
    outcome = health.index_drift(conn)
    assert not outcome.passed and "1 vectors differ" in outcome.summary
    conn.execute(sql.SQL("UPDATE {} SET embedding = %s WHERE chunk_id = %s").format(table), (saved, chunk_id))
    assert health.index_drift(conn).passed

    # A chunk group of an indexed document without its vector.
    conn.execute(sql.SQL("DELETE FROM {} WHERE chunk_id = %s").format(table), (chunk_id,))
    outcome = health.index_drift(conn)
    assert not outcome.passed and "1 chunk groups of indexed documents have no vector" in outcome.summary
    conn.execute("UPDATE documents SET status = 'pending_index' WHERE doc_id = %s", (doc_id,))
    index_pending(conn.info.dsn, settings)
    assert health.index_drift(conn).passed

    # An orphan: a row whose owner chunk does not exist.
    conn.execute(sql.SQL("UPDATE {} SET owner_chunk_id = 'nobody' WHERE chunk_id = %s").format(table), (chunk_id,))
    assert "1 rows belong to no chunk" in health.index_drift(conn).summary
    conn.execute(sql.SQL("UPDATE {} SET owner_chunk_id = %s WHERE chunk_id = %s").format(table),
                 (conn.execute("SELECT chunk_id FROM chunks WHERE group_id = %s ORDER BY doc_id, ordinal LIMIT 1",
                               (chunk_id,)).fetchone()[0], chunk_id))
    assert health.index_drift(conn).passed

    # The alias on a version that is not active.
    conn.execute("UPDATE index_versions SET status = 'retired' WHERE version_id = %s", (version.version_id,))
    outcome = health.index_drift(conn)
    assert not outcome.passed and f"alias points at v{version.version_id}, which is retired" in outcome.summary
    conn.execute("UPDATE index_versions SET status = 'active' WHERE version_id = %s", (version.version_id,))
    assert health.index_drift(conn).passed


def test_parse_health_fails_on_empty_pages_and_dead_letters(clone):
    conn, settings = clone
    doc_id = _doc_id("finance/q3-report.pdf")
    saved = conn.execute("SELECT page, markdown FROM document_pages WHERE doc_id = %s", (doc_id,)).fetchall()
    conn.execute("UPDATE document_pages SET markdown = '' WHERE doc_id = %s", (doc_id,))
    outcome = health.parse_health(conn, settings.checks)
    assert not outcome.passed
    assert outcome.tables["zero_text_documents"].rows == [("sample", "finance/q3-report.pdf", len(saved))]
    assert "near-empty" in outcome.summary and "have no text" in outcome.summary
    for page, markdown in saved:
        conn.execute("UPDATE document_pages SET markdown = %s WHERE doc_id = %s AND page = %s", (markdown, doc_id, page))
    assert health.parse_health(conn, settings.checks).passed

    # One dead letter among six live documents is over a 10% limit.
    strict = ChecksConfig(max_dead_letter_share=0.1)
    outcome = health.parse_health(conn, strict)
    assert not outcome.passed and "dead letters" in outcome.summary
    assert outcome.numbers["dead_letter_share"] == round(1 / 6, 4)


def test_retrieval_quality_fails_against_the_baseline_and_recovers(clone):
    conn, settings = clone
    first = health.retrieval_quality(conn, settings.checks)
    assert first.passed and first.numbers["evaluations_reused"] == 0
    baseline = evaluations.baseline(conn, version_store.active_version(conn).version_id, health.golden_fingerprint(settings.checks))
    assert baseline["overall"]["recall@k"] > 0.5
    # Nothing changed: the stored evaluation is reused, no question is asked again.
    assert health.retrieval_quality(conn, settings.checks).numbers["evaluations_reused"] == 1

    # Half the index disappears (here: a botched manual cleanup): recall falls below the baseline.
    table = _table(conn)
    lost = [_doc_id("products/nw200-faq.html"), _doc_id("handbook/security-policy.pdf")]
    conn.execute(sql.SQL("DELETE FROM {} WHERE doc_id = ANY(%s)").format(table), (lost,))
    outcome = health.retrieval_quality(conn, settings.checks)
    assert not outcome.passed and "recall@k" in outcome.summary
    assert any(row[-1] == "REGRESSED" for row in outcome.tables["against_baseline"].rows)

    conn.execute("UPDATE documents SET status = 'pending_index' WHERE doc_id = ANY(%s)", (lost,))
    index_pending(conn.info.dsn, settings)
    assert health.retrieval_quality(conn, settings.checks).passed


def test_check_results_in_dagster_and_blocking_failures_fail_the_run(clone):
    conn, settings = clone
    defs = build_definitions(settings)
    checks = {key.name: key for key in defs.resolve_job_def("ingest").asset_layer.asset_graph.asset_check_keys}
    assert set(checks) == set(CHECK_NAMES)
    with DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def("index_health").execute_in_process(instance=instance)
        assert result.success
        evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
        assert set(evaluations) == set(CHECK_NAMES) and all(e.passed for e in evaluations.values())
        assert "| sample |" in evaluations["staleness"].metadata["freshness_per_source"].value
        assert "| recall@k |" in evaluations["retrieval_quality"].metadata["against_baseline"].value

        # Labels out of step with the document: acl_coverage fails with ERROR and, being blocking, fails the run.
        table = _table(conn)
        conn.execute(sql.SQL("UPDATE {} SET acl_labels = '{{public}}' WHERE ordinal = 0").format(table))
        summary = run_ingest(settings, instance=instance)
        assert not summary["success"]
        assert not summary["checks"]["acl_coverage"]["passed"] and summary["checks"]["index_drift"]["passed"]
        assert "labels differ" in summary["checks"]["acl_coverage"]["summary"]
        record = instance.event_log_storage.get_latest_asset_check_execution_by_key(
            [AssetCheckKey(AssetKey("search_index"), "acl_coverage")])
        evaluation = next(iter(record.values())).event.dagster_event.event_specific_data
        assert not evaluation.passed and evaluation.severity.value == "ERROR"


def test_checks_from_the_cli(clone, capsys):
    conn, settings = clone
    from rag_pipeline.cli import main

    assert main(["--config", str(settings.config_file), "checks", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == set(CHECK_NAMES) and all(r["passed"] for r in report.values())

    conn.execute(sql.SQL("UPDATE {} SET acl_labels = '{{public}}' WHERE ordinal = 0").format(_table(conn)))
    assert main(["--config", str(settings.config_file), "checks"]) == 1
    assert "FAIL acl_coverage" in capsys.readouterr().out

    # Re-baselining records the current result as the active version's baseline.
    golden_sha = health.golden_fingerprint(settings.checks)
    version_id = version_store.active_version(conn).version_id
    # A baseline from an earlier, better index state (recall 1.0).
    conn.execute("UPDATE retrieval_evaluations SET metrics = jsonb_set(metrics, '{overall,recall@k}', '1.0'), "
                 "index_state = 'earlier' WHERE is_baseline")
    assert not health.retrieval_quality(conn, settings.checks).passed
    assert main(["--config", str(settings.config_file), "checks", "--set-baseline"]) == 0
    assert "baseline recorded" in capsys.readouterr().out
    assert evaluations.baseline(conn, version_id, golden_sha)["overall"]["recall@k"] < 1.0
    assert health.retrieval_quality(conn, settings.checks).passed
