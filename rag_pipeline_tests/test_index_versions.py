"""Blue/green index versions: build beside the active one as a sharded Dagster job, deletions during the build,
gated promotion, rollback, retirement."""

import json
from datetime import datetime

import dagster as dg
import pytest
from dagster import DagsterInstance
from psycopg import sql

from rag_pipeline import store
from rag_pipeline.defs.runs import run_index_build, run_ingest
from rag_pipeline.domain import ids
from rag_pipeline.embedding.identity import identity_of
from rag_pipeline.embedding.locations import resolve_model
from rag_pipeline.lifecycle import blue_green
from rag_pipeline.retrieval.search import search
from rag_pipeline_tests.conftest import GOLDEN, MODELS_DIR


def _build_and_promote(conn, settings, model: str) -> int:
    """Build a version for `model` shard by shard, as the build job does, and promote it past its gates."""
    from rag_pipeline.defs.index_versions import SHARDS

    version = blue_green.start_version_build(conn.info.dsn, settings, model)
    for shard in range(SHARDS):
        blue_green.backfill_version(conn.info.dsn, settings, version.version_id, shard, SHARDS)
    with conn.transaction():
        blue_green.promote(conn, version.version_id, blue_green.check_gates(conn, version))
    return version.version_id


def _assert_build_is_a_backfill_of_its_version(instance, settings, label: str, backfill_id: str) -> None:
    """The CLI's build is a finished backfill of the version's eight partitions, each materialized, and only its
    version's partitions are: a version registered next starts with all eight missing."""
    from rag_pipeline.defs.code_location import build_definitions
    from rag_pipeline.defs.index_versions import VERSION_PARTITIONS

    graph = build_definitions(settings).get_repository_def().asset_graph
    backfill = instance.get_backfill(backfill_id)
    assert backfill.status.value == "COMPLETED_SUCCESS" and backfill.tags["rag_pipeline/index_version"] == label
    [status] = backfill.asset_backfill_data.get_backfill_status_per_asset_key(graph)
    counts = {state.value: count for state, count in status.partitions_counts_by_status.items()}
    assert status.num_targeted_partitions == 8 and counts["MATERIALIZED"] == 8 and counts["FAILED"] == 0
    runs = instance.get_runs(filters=dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
    assert len(runs) == 8 and all(run.is_success for run in runs)
    materialized = instance.get_materialized_partitions(dg.AssetKey("index_version_backfill"))
    assert {key.split("|")[1] for key in materialized} >= {label}
    assert len([key for key in materialized if key.endswith(f"|{label}")]) == 8
    assert label in instance.get_dynamic_partitions(VERSION_PARTITIONS)


def _rows(db, version, doc_id=None):
    query = sql.SQL("SELECT count(*) FROM {} WHERE %(all)s OR doc_id = %(doc)s").format(
        sql.Identifier(version.table_name)
    )
    return db.execute(query, {"all": doc_id is None, "doc": doc_id or ""}).fetchone()[0]


def _bm25_counts(db, version) -> dict[str, list[tuple]]:
    """What a version's BM25 triggers count (everything but the weights, which follow the average length)."""
    def rows(query: str, suffix: str) -> list[tuple]:
        return db.execute(sql.SQL(query).format(sql.Identifier(version.table_name + suffix))).fetchall()

    return {"postings": rows("SELECT term_id, lexical_id, tf FROM {} ORDER BY 1, 2", "_postings"),
            "lengths": rows("SELECT lexical_id, len FROM {} ORDER BY 1", "_bm25docs"),
            "df": rows("SELECT term_id, sum(df) FROM {} GROUP BY 1 HAVING sum(df) <> 0 ORDER BY 1", "_bm25_df"),
            "totals": rows("SELECT sum(chunks), sum(total_len) FROM {}", "_bm25_totals")}


def _assert_bm25_as_rebuilt(db, version) -> None:
    """The BM25 structures the triggers wrote, a statement of many rows at a time (a backfill's transactions, a
    deletion's cascade), are what a set-based rebuild writes from the version's rows."""
    written = _bm25_counts(db, version)
    assert len(written["lengths"]) == store.versions.row_count(db, version) > 0
    with db.transaction(force_rollback=True):
        store.versions.rebuild_bm25(db, version)
        rebuilt = _bm25_counts(db, version)
    for name, expected in rebuilt.items():
        assert written[name] == expected, name


def test_build_promote_rollback_retire(make_settings, corpus, db):
    settings = make_settings([{"name": "sample", "root": str(corpus), "acl_labels": ["staff"]}])
    # The same weights named by their folder: the same model identity as v1's.
    candidate_model = resolve_model("all-MiniLM-L6-v2").location
    with DagsterInstance.ephemeral() as instance:
        assert run_ingest(settings, instance=instance)["success"]
        v1 = store.versions.active_version(db)

        # A build that has not run its shards yet is incomplete: promotion refuses.
        with db.transaction():
            draft = blue_green.start_build(db, identity_of(candidate_model, settings.embedding), 384,
                                         v1.chunker_version, v1.parser_version)
        with pytest.raises(blue_green.VersionError, match="already building"):
            with db.transaction():
                blue_green.start_build(db, ids.ModelIdentity("torch", "other", "sha256:0"), 8, "c", "p")
        gates = blue_green.check_gates(db, draft)
        assert gates.missing_groups > 0 and not gates.passed
        with pytest.raises(blue_green.VersionError, match="incomplete"):
            with db.transaction():
                blue_green.promote(db, draft.version_id, gates)
        with db.transaction():
            blue_green.retire(db, draft.version_id)
        assert draft.version_id not in {v.version_id for v in store.versions.index_versions(db)}

        # A deletion while the new version builds reaches it as well.
        summary = run_index_build(settings, candidate_model, instance=instance)
        assert summary["success"] and len(summary["shards"]) == 8 and summary["rows"] == v1.row_count
        (v2,) = store.versions.index_versions(db, ("ready",))  # all shards done and complete
        _assert_build_is_a_backfill_of_its_version(instance, settings, v2.label, summary["backfill"])
        _assert_bm25_as_rebuilt(db, v2)
        (corpus / "products" / "nw200-faq.html").unlink()
        assert run_ingest(settings, instance=instance)["deleted"] == 1
        faq = ids.doc_id("sample", "products/nw200-faq.html")
        assert _rows(db, v2, faq) == 0 and _rows(db, v1, faq) == 0
        edited = corpus / "handbook" / "travel-policy.md"
        edited.write_text(edited.read_text().replace("14 days", "21 days"))
        assert run_ingest(settings, instance=instance)["changed"] == 1
        v2_texts = [t for (t,) in db.execute(sql.SQL("SELECT text FROM {}").format(sql.Identifier(v2.table_name)))]
        assert any("21 days" in t for t in v2_texts) and not any("14 days" in t for t in v2_texts)
        _assert_bm25_as_rebuilt(db, v2)

        gates = blue_green.check_gates(db, v2, GOLDEN, ["staff", "finance"], k=3)
        assert gates.passed, gates.failures
        # The same weights: within one question of the active version (42 here). Not equal: a near-duplicate
        # group's row can hold another occurrence's vector in each version (rows are written per version).
        assert gates.quality["candidate"]["recall@k"] >= gates.quality["active"]["recall@k"] - 1 / 42 - 1e-3
        with db.transaction():
            blue_green.promote(db, v2.version_id, gates)
        assert store.versions.active_version(db).version_id == v2.version_id
        assert db.execute("SELECT count(*) FROM rag.indexed_chunks").fetchone()[0] == _rows(db, v2)
        hits = search(db, "how far ahead should flights be booked", ["staff"], k=1)
        assert "21 days" in hits[0].text

        # The previous version keeps receiving writes, so rolling back is instant and not stale.
        edited.write_text(edited.read_text().replace("21 days", "28 days"))
        run_ingest(settings, instance=instance)
        with db.transaction():
            back = blue_green.rollback(db)
        assert back.version_id == v1.version_id and store.versions.active_version(db).version_id == v1.version_id
        assert "28 days" in search(db, "how far ahead should flights be booked", ["staff"], k=1)[0].text

        with pytest.raises(blue_green.VersionError, match="is active"):
            with db.transaction():
                blue_green.retire(db, v1.version_id)
        with db.transaction():
            blue_green.retire(db, v2.version_id)
        assert db.execute("SELECT to_regclass(%s)", (v2.table_name,)).fetchone()[0] is None
        assert run_ingest(settings, instance=instance)["success"]  # writes go on without the dropped table
        events = [r[0] for r in db.execute("SELECT event FROM index_version_events ORDER BY id").fetchall()]
        assert events == ["build", "drop", "build", "promote", "rollback", "drop"]


def test_swap_minilm_to_mpnet(make_settings, corpus, db, capsys):
    """The real swap: all-MiniLM-L6-v2 (384 dims) -> all-mpnet-base-v2 (768 dims, installed by `make`). The CLI's
    promotion says each gate and what to set next; a refresh under the old setting is refused in one line naming
    the setting and the rollback; the rollback says what to set back."""
    import json

    from rag_pipeline import cli

    settings = make_settings([{"name": "sample", "root": str(corpus), "acl_labels": ["staff"]}])
    with DagsterInstance.ephemeral() as instance:
        assert run_ingest(settings, instance=instance)["success"]
        v1 = store.versions.active_version(db)
        summary = run_index_build(settings, "all-mpnet-base-v2", instance=instance)
        assert summary["success"] and summary["dimensions"] == 768
        (v2,) = store.versions.index_versions(db, ("ready",))
        column = db.execute(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s::regclass"
            " AND attname = 'embedding'", (v2.table_name,)
        ).fetchone()[0]
        assert column == "halfvec(768)"
        (corpus / "handbook" / "onboarding-guide.docx").unlink()  # deleted during the build
        assert run_ingest(settings, instance=instance)["deleted"] == 1
        config = ["--config", str(settings.config_file)]
        capsys.readouterr()
        assert cli.main([*config, "index", "promote", str(v2.version_id), "--golden", str(GOLDEN),
                         "--labels", "staff,finance", "-k", "3", "--json"]) == cli.EXIT_OK
        swap = json.loads(capsys.readouterr().out)
        assert [(g["gate"], g["passed"]) for g in swap["gates"]] == [
            ("complete", True), ("deletions replayed", True), ("quality", True)]
        assert swap["active"] == v2.label and swap["dimensions"] == 768 and swap["rollback_to"] == v1.label
        assert swap["set"] == {"embedding.model": "all-mpnet-base-v2", "embedding.backend": "onnx-int8"}
        hits = search(db, "which extension reaches the security desk", ["staff"], k=3)
        assert hits and all(h.path != "handbook/onboarding-guide.docx" for h in hits)
        assert store.versions.active_version(db).dimensions == 768
        # The configuration still names the old model: a refresh is refused, naming what to set and the rollback
        # to the version the configured model did embed (not a build of it).
        refused = run_ingest(settings, instance=instance)
        assert not refused["success"] and any("index rollback" in e for e in refused["errors"])
        capsys.readouterr()
        assert cli.main([*config, "ingest"]) == cli.EXIT_USAGE
        [said] = capsys.readouterr().err.strip().splitlines()
        assert said.startswith("error: embedding.model") and "embedding.model: all-mpnet-base-v2" in said
        assert "`rag-pipeline index rollback`" in said and "index build" not in said
        # Chunks are sized for the shortest window among written versions: the swap re-chunks nothing.
        settings = make_settings([{"name": "sample", "root": str(corpus), "acl_labels": ["staff"]}],
                                 embedding={"model": "all-mpnet-base-v2", "models_dir": str(MODELS_DIR)})
        after_swap = run_ingest(settings, instance=instance)
        assert after_swap["success"], after_swap.get("errors")
        assert after_swap["documents_chunked"] == 0 and after_swap["vectors_embedded"] == 0
        assert cli.main(["--config", str(settings.config_file), "index", "rollback"]) == cli.EXIT_OK
        said = capsys.readouterr().out
        assert f"{v1.label} is active: onnx-int8:all-MiniLM-L6-v2 (384 dims)" in said
        assert "next: set embedding.model: all-MiniLM-L6-v2, embedding.backend: onnx-int8" in said
        assert store.versions.active_version(db).version_id == v1.version_id
        assert search(db, "which extension reaches the security desk", ["staff"], k=3)


def test_deletions_in_the_middle_of_a_build_reach_both_versions_before_and_after_promotion(
    make_settings, corpus, db
):
    from rag_pipeline.defs.index_versions import SHARDS
    from rag_pipeline.lifecycle import checks
    from rag_pipeline.lifecycle.blue_green import backfill_version, start_version_build

    settings = make_settings([{"name": "sample", "root": str(corpus), "acl_labels": ["staff"]}])
    candidate_model = resolve_model("all-MiniLM-L6-v2").location
    with DagsterInstance.ephemeral() as instance:
        assert run_ingest(settings, instance=instance)["success"]
        v1 = store.versions.active_version(db)
        v2 = start_version_build(db.info.dsn, settings, candidate_model)
        shard_of = dict(db.execute("SELECT doc_id, abs(hashtext(doc_id)) %% %s FROM documents WHERE status = 'indexed'",
                                   (SHARDS,)).fetchall())
        done = sorted(set(shard_of.values()))[: len(set(shard_of.values())) // 2]
        for shard in done:
            backfill_version(db.info.dsn, settings, v2.version_id, shard, SHARDS)
        # One deleted document was already copied into v2, the other not yet.
        copied = next(d for d, s in shard_of.items() if s in done)
        pending = next(d for d, s in shard_of.items() if s not in done)
        paths = dict(db.execute("SELECT doc_id, rel_path FROM documents").fetchall())
        for doc_id in (copied, pending):
            (corpus / paths[doc_id]).unlink()
        assert run_ingest(settings, instance=instance)["deleted"] == 2
        for shard in range(SHARDS):
            if shard not in done:
                backfill_version(db.info.dsn, settings, v2.version_id, shard, SHARDS)

        def rows_of_deleted() -> dict[int, int]:
            return {v.version_id: _rows(db, v, copied) + _rows(db, v, pending) for v in (v1, v2)}

        assert rows_of_deleted() == {v1.version_id: 0, v2.version_id: 0}
        assert checks.deletion_replay(db).passed
        gates = blue_green.check_gates(db, v2)
        assert gates.passed and gates.replayed_deletions_left == 0, gates.failures
        with db.transaction():
            blue_green.promote(db, v2.version_id, gates)
        assert run_ingest(settings, instance=instance)["success"]
        assert rows_of_deleted() == {v1.version_id: 0, v2.version_id: 0}
        assert checks.deletion_replay(db).passed and checks.index_drift(db).passed


def test_rollback_only_goes_back_and_is_refused_with_nothing_older(clone, capsys):
    """`index rollback` run again goes further back, never forward to the version the last rollback left (issue 47,
    case 9); with nothing older it is refused (exit 3) and the active version stays."""
    from rag_pipeline import cli
    from rag_pipeline.defs.index_versions import SHARDS

    conn, settings = clone
    url, rollback = conn.info.dsn, ["--config", str(settings.config_file), "index", "rollback"]
    first = store.versions.active_version(conn)
    v1 = first.version_id

    def build_and_promote() -> int:  # the same weights as v1: every vector comes from the embedding cache
        return _build_and_promote(conn, settings, first.embedding_model)

    def active() -> int:
        return store.versions.active_version(conn).version_id

    v2, v3 = build_and_promote(), build_and_promote()
    assert cli.main(rollback) == cli.EXIT_OK and active() == v2
    # After a rollback and a new promotion, back is the version active before the new one (v2), not the one rolled
    # back from (v3), though both are older.
    v4 = build_and_promote()
    assert cli.main(rollback) == cli.EXIT_OK and active() == v2
    assert cli.main(rollback) == cli.EXIT_OK and active() == v1  # the starting code toggled forward to v4 here
    capsys.readouterr()
    assert cli.main(rollback) == cli.EXIT_REFUSED and active() == v1
    said = capsys.readouterr()
    assert "nothing to roll back to" in said.err and f"v{v1}" in said.err and "rolled back" not in said.out
    events = conn.execute("SELECT version_id, detail->>'rolled_back' FROM index_version_events"
                          " WHERE event = 'rollback' ORDER BY id").fetchall()
    assert events == [(v2, str(v3)), (v2, str(v4)), (v1, str(v2))]

    # The UI's promotion (the promote_index_version job) records each gate (the clone's checks name a golden set),
    # and that nothing needs setting.
    from rag_pipeline.defs.code_location import build_definitions

    v5 = blue_green.start_version_build(url, settings, first.embedding_model).version_id
    for shard in range(SHARDS):
        blue_green.backfill_version(url, settings, v5, shard, SHARDS)
    with DagsterInstance.ephemeral() as instance:
        promoted = build_definitions(settings).resolve_job_def("promote_index_version").execute_in_process(
            instance=instance, run_config={"ops": {"promote_version": {"config": {"version_id": v5}}}})
    assert promoted.success and active() == v5
    [output] = [e for e in promoted.all_events if e.event_type_value == "STEP_OUTPUT"]
    metadata = output.event_specific_data.metadata
    assert [row.data for row in metadata["gates"].value.records] == [
        {"gate": "complete", "result": "passed", "detail": "every chunk group of the indexed documents has a row"},
        {"gate": "deletions replayed", "result": "passed", "detail": "no row of a deleted document"},
        {"gate": "quality", "result": "passed", "detail": "the golden set scores within 0.02 of the active version's"}]
    assert metadata["set_next"].value == {}


def test_index_build_takes_only_a_model_name_or_a_model_folder(clone, tmp_path):
    """`index build --model` with anything but a model name or a folder holding a model is refused up front: exit 2,
    one line, nothing walked, hashed or registered (issue 47, case 9: `--model /etc` hashed /etc, then a traceback)."""
    import os
    import subprocess
    import sys

    from rag_pipeline import cli
    from rag_pipeline.embedding.locations import ModelArgumentError, check_model_argument

    conn, settings = clone
    versions_before = conn.execute("SELECT count(*) FROM index_versions").fetchone()[0]
    # A folder whose walk would block: hashing reads its FIFO, which has no writer.
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    os.mkfifo(not_a_model / "weights.bin")
    (not_a_model / "tokenizer.json").write_text("{}")

    def build(model: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "rag_pipeline.cli", "--config", str(settings.config_file),
                               "index", "build", "--model", model], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})

    for model, reason in (("/etc", "not a model folder"), (str(not_a_model), "not a model folder"),
                          ("onnx-int8:/etc", "not a model folder")):
        refused = build(model)
        assert refused.returncode == cli.EXIT_USAGE, refused.stderr[-2000:]
        assert refused.stderr.strip().splitlines() == [f"error: --model {model.removeprefix('onnx-int8:')}: "
                                                       f"{reason} (it has no modules.json or config.json at its top)"]
    (tmp_path / "weights.bin").write_bytes(b"\0" * 64)
    for model, reason in ((str(tmp_path / "weights.bin"), "not a folder"), ("/no/such/model", "no such folder"),
                          ("../no-such-model-folder", "no such folder"), ("all MiniLM", "not a model name"), ("", "not a model")):
        with pytest.raises(ModelArgumentError, match=reason):
            check_model_argument(model)
        assert cli.main(["--config", str(settings.config_file), "index", "build", "--model", model]) == cli.EXIT_USAGE
    assert conn.execute("SELECT count(*) FROM index_versions").fetchone()[0] == versions_before
    # Names (resolved later: packaged, installed, the hub's cache) and model folders pass.
    model_folder = resolve_model("all-MiniLM-L6-v2").location
    for model in ("all-MiniLM-L6-v2", "sentence-transformers/all-mpnet-base-v2", "onnx-int8:all-MiniLM-L6-v2",
                  model_folder, f"onnx-int8:{model_folder}", "remote:nomic-embed-text:latest"):
        check_model_argument(model)


def test_gate_results_say_what_was_not_checked_and_why_a_gate_failed():
    report = blue_green.GateReport(7, missing_groups=3, failures=["incomplete: 3 chunk groups have no row"])
    results = blue_green.gate_results(report)
    assert [(r["gate"], r["passed"]) for r in results] == [
        ("complete", False), ("deletions replayed", True), ("quality", None)]
    assert results[0]["detail"] == "3 chunk groups have no row (backfill not done)"
    assert blue_green.GATE_RESULT_WORDS[results[2]["passed"]] == "not checked"
    quality = {"active": {"recall@k": 0.9}, "candidate": {"recall@k": 0.8}, "tolerance": 0.02}
    failed = blue_green.gate_results(blue_green.GateReport(7, quality=quality,
                                                           failures=["quality: recall@k fell by 0.10"]))
    assert failed[2] == {"gate": "quality", "passed": False, "detail": "recall@k fell by 0.10",
                         "active": quality["active"], "candidate": quality["candidate"]}


def test_a_previous_version_is_reclaimed_after_the_rollback_window_unless_pinned(clone, capsys):
    """A promotion keeps the version it replaces as `previous` (rollback returns to it); housekeeping warns before
    retention.rollback ends, then drops it and records it; a pin keeps it; rollback after the drop is refused with
    when and why. The clock is the test's: the reclaim is given `now`, or the version's retention clock is moved."""
    from datetime import timedelta

    from rag_pipeline import cli
    from rag_pipeline.defs.code_location import build_definitions
    from rag_pipeline.lifecycle.reclaim import reclaim_previous

    conn, settings = clone
    config = ["--config", str(settings.config_file)]
    first = store.versions.active_version(conn)
    keep, warn = settings.retention.rollback_seconds, settings.retention.rollback_warning_seconds
    assert (keep, warn) == (7 * 86400, 2 * 86400)  # the documented defaults

    def build_and_promote() -> int:  # the same weights as v1: every vector comes from the embedding cache
        return _build_and_promote(conn, settings, first.embedding_model)

    def reclaim(after: timedelta):
        with conn.transaction():
            return reclaim_previous(conn, keep, warn, now=retired_at + after)

    v1, v2 = first.version_id, build_and_promote()
    capsys.readouterr()
    assert cli.main([*config, "index", "list", "--json"]) == cli.EXIT_OK
    listed = {row["version"]: row for row in json.loads(capsys.readouterr().out)}
    assert (listed[v1]["status"], listed[v1]["rollback_target"], listed[v2]["status"]) == ("previous", True, "active")
    retired_at = conn.execute("SELECT retired_at FROM index_versions WHERE version_id = %s", (v1,)).fetchone()[0]
    assert datetime.fromisoformat(listed[v1]["reclaim_at"]) == retired_at + timedelta(seconds=keep)  # not warned

    assert (reclaim(timedelta(days=4)).warned, reclaim(timedelta(days=4)).kept[0]["version"]) == ([], v1)
    warned = reclaim(timedelta(days=5, hours=1))  # within two days of the end: warned once, kept
    assert [v["version"] for v in warned.warned] == [v1] and warned.reclaimable_bytes > 0
    assert [a.state for a in warned.alerts("t")] == ["warning"] and f"index pin {v1}" in warned.alerts("t")[0].summary
    assert reclaim(timedelta(days=6)).warned == []  # edge-triggered: not again

    assert cli.main([*config, "index", "pin", str(v1), "--reason", "audit hold"]) == cli.EXIT_OK
    pinned = reclaim(timedelta(days=30))
    assert pinned.reclaimed == [] and pinned.kept[0]["pinned_reason"] == "audit hold" and pinned.reclaimable_bytes == 0
    assert cli.main([*config, "index", "retire", str(v1)]) == cli.EXIT_REFUSED  # a pin holds against retire too
    assert cli.main([*config, "index", "unpin", str(v1)]) == cli.EXIT_OK
    assert cli.main([*config, "index", "unpin", str(v1)]) == cli.EXIT_USAGE  # not pinned: said, not recorded
    # Unpinned when overdue, it is warned again, and dropped no sooner than a warning period after that.
    again = reclaim(timedelta(days=7, minutes=30))
    assert again.reclaimed == [] and [v["version"] for v in again.warned] == [v1]
    assert reclaim(timedelta(days=9)).reclaimed == []
    dropped = reclaim(timedelta(days=9, minutes=31))
    assert [v["version"] for v in dropped.reclaimed] == [v1] and dropped.kept == []
    assert conn.execute("SELECT to_regclass(%s)", (first.table_name,)).fetchone()[0] is None
    assert conn.execute("SELECT status FROM index_versions WHERE version_id = %s", (v1,)).fetchone()[0] == "retired"
    events = conn.execute("SELECT event, detail->>'reclaimed' FROM index_version_events WHERE version_id = %s"
                          " AND event IN ('reclaim_warning', 'pin', 'unpin', 'drop') ORDER BY id", (v1,)).fetchall()
    assert events == [("reclaim_warning", None), ("pin", None), ("unpin", None), ("reclaim_warning", None),
                      ("drop", "true")]
    capsys.readouterr()
    assert cli.main([*config, "index", "rollback"]) == cli.EXIT_REFUSED
    assert f"v{v1}, active before v{v2}, was dropped on" in capsys.readouterr().err

    # The housekeeping job reclaims on the schedule, with the database's clock. v2 made previous 8 days ago (as a
    # version kept from before this release can be) is overdue but never warned: the first run warns, and keeps it.
    v3 = build_and_promote()
    conn.execute("UPDATE index_versions SET retired_at = now() - interval '8 days' WHERE version_id = %s", (v2,))

    def housekeeping() -> dict:
        with DagsterInstance.ephemeral() as instance:
            result = build_definitions(settings).resolve_job_def("housekeeping_job").execute_in_process(
                instance=instance)
        assert result.success
        [output] = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
        return {name: value.value for name, value in output.event_specific_data.metadata.items()}

    first_run = housekeeping()
    assert first_run["versions_reclaimed"] == 0 and first_run["reclaimable_bytes"] > 0
    assert store.versions.get_version(conn, v2) is not None
    conn.execute("UPDATE index_versions SET reclaim_warned_at = now() - interval '2 days' WHERE version_id = %s",
                 (v2,))  # two days on
    later = housekeeping()
    assert later["versions_reclaimed"] == 1 and later["bytes_reclaimed"] > 0
    assert store.versions.get_version(conn, v2) is None and store.versions.active_version(conn).version_id == v3


def test_a_backfill_writes_many_documents_a_transaction_as_one_at_a_time_would(make_settings, tmp_path, db,
                                                                             monkeypatch):
    """One shard over 24 documents in transactions of a few documents each: near-duplicates of one another within a
    transaction and across them (one row per group), documents of two label sets in one transaction (each row with
    its document's labels), and BM25 counted as a rebuild counts it."""
    root = tmp_path / "many"
    shared = ("Expense reports are filed within thirty days of travel, with every receipt attached, and approved by "
              "the budget holder before the finance team reimburses them. ")
    for i in range(24):
        folder = root / ("team" if i % 3 == 0 else "staff")
        folder.mkdir(parents=True, exist_ok=True)
        own = f"Document {i} describes project {i * 7} and its milestone in quarter {i % 4 + 1} of the plan. " * 3
        (folder / f"doc-{i:02d}.md").write_text(f"# Note {i}\n\n{own}\n\n## Expenses\n\n{shared * 2}\n")
    settings = make_settings([{"name": "staff", "root": str(root / "staff"), "acl_labels": ["staff"]},
                              {"name": "team", "root": str(root / "team"), "acl_labels": ["team"]}])
    with DagsterInstance.ephemeral() as instance:
        assert run_ingest(settings, instance=instance)["success"]
    v1 = store.versions.active_version(db)
    monkeypatch.setattr(blue_green, "BACKFILL_CHUNKS_AT_ONCE", 7)  # a few documents a transaction
    parts: list[int] = []

    def write_documents(conn, documents, *args):
        parts.append(len(documents))
        return write_all(conn, documents, *args)

    write_all = blue_green.write_documents
    monkeypatch.setattr(blue_green, "write_documents", write_documents)
    v2 = blue_green.start_version_build(db.info.dsn, settings, resolve_model("all-MiniLM-L6-v2").location)
    stats = blue_green.backfill_version(db.info.dsn, settings, v2.version_id, 0, 1)
    assert stats.documents_indexed == sum(parts) == 24 and max(parts) > 1 and len(parts) > 1
    # The shared section is one group per label set: every other occurrence, in its transaction or another, is a
    # near-duplicate the backfill wrote no row for.
    assert stats.near_duplicates == 24 - 2
    v2 = store.versions.get_version(db, v2.version_id)
    assert v2.status == "ready"  # every group has its row, no deleted document's row

    def rows_by_group(version) -> dict[str, tuple]:
        return {group: (sorted(labels), source) for group, labels, source in db.execute(sql.SQL(
            "SELECT t.chunk_id, t.acl_labels, d.source FROM {} t JOIN documents d USING (doc_id)").format(
                sql.Identifier(version.table_name))).fetchall()}

    groups = rows_by_group(v2)
    assert set(groups) == set(rows_by_group(v1))  # one row per group, the same groups as the active version's
    assert all(labels == [source] for labels, source in groups.values())
    _assert_bm25_as_rebuilt(db, v2)
