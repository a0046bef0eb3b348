"""Near-duplicate groups follow labels (issue 47, case 2), on the real database with the real ingest job: a label
change that comes with a rewrite leaving the text the same (a `touch` plus a sidecar) moved the document's labels
but left its chunks in the group of the old label set. A same-text document of that old label set then joined the
group whose row spoke for the other labels (invisible to its own readers), and the next `index build` regrouped in
the new version only, leaving the active one with rows without a chunk and groups without a vector."""

import json
import os
from pathlib import Path

from dagster import DagsterInstance
from psycopg import sql

from rag_pipeline import store
from rag_pipeline.defs.runs import run_index_build, run_ingest
from rag_pipeline.embedding.locations import resolve_model
from rag_pipeline.lifecycle import blue_green, checks
from rag_pipeline.retrieval.search import search
from rag_pipeline.store.database import connect
from rag_pipeline.text import dedup

NOTICE = ("# Retention notice\n\nPersonnel files of the Okapi works council are kept for seven years after the end "
          "of employment, then shredded by the records office under the supervision of two witnesses.\n")
QUERY = "how long are personnel files of the works council kept"


def _ingest(settings, instance) -> dict:
    summary = run_ingest(settings, instance=instance)
    assert summary["success"], summary.get("errors")
    return summary


def _touch(path: Path) -> None:
    """Rewrite with the same text, one second later (the change is seen whatever the file system's resolution)."""
    path.write_text(path.read_text())
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def _group_keys(db, rel_path: str) -> set[str]:
    """The ACL keys of the groups the document's chunks are in (None: a chunk in no group)."""
    return {r[0] for r in db.execute(
        """SELECT g.acl_key FROM chunks c JOIN documents d USING (doc_id)
           LEFT JOIN chunk_groups g ON g.group_id = c.group_id WHERE d.rel_path = %s""", (rel_path,))}


def _readers_find(db, labels: list[str]) -> set[str]:
    return {hit.path for hit in search(db, QUERY, labels, k=10, mode="hybrid")}


def _integrity(db) -> dict[str, checks.CheckOutcome]:
    return {name: check(db) for name, check in (("index_drift", checks.index_drift),
                                                ("acl_coverage", checks.acl_coverage),
                                                ("deletion_replay", checks.deletion_replay))}


def test_a_relabel_with_a_same_text_rewrite_moves_the_chunks_and_survives_an_index_build(make_settings, tmp_path,
                                                                                         db):
    root = tmp_path / "docs"
    root.mkdir()
    (root / "a.md").write_text(NOTICE)
    settings = make_settings([{"name": "docs", "root": str(root), "acl_labels": ["staff"]}])
    with DagsterInstance.ephemeral() as instance:
        _ingest(settings, instance)
        assert _group_keys(db, "a.md") == {dedup.acl_key(["staff"])}

        # A touch and a sidecar: the bytes changed, the text did not, the labels did.
        _touch(root / "a.md")
        (root / "a.md.meta.json").write_text(json.dumps({"acl_labels": ["hr"]}))
        relabelled = _ingest(settings, instance)
        assert (relabelled["changed"], relabelled["content_unchanged"], relabelled["vectors_embedded"]) == (1, 1, 0)
        assert _group_keys(db, "a.md") == {dedup.acl_key(["hr"])}

        # The same text under the old label set: a group of its own, found by its own readers only.
        (root / "b.md").write_text(NOTICE)
        _ingest(settings, instance)
        assert _group_keys(db, "b.md") == {dedup.acl_key(["staff"])}
        assert _readers_find(db, ["staff"]) == {"b.md"} and _readers_find(db, ["hr"]) == {"a.md"}
        assert all(outcome.passed for outcome in _integrity(db).values()), _integrity(db)

        # Held, then released with other labels and the same text: the chunks follow again.
        (root / "a.md.meta.json").write_text("{broken")
        _ingest(settings, instance)
        _touch(root / "a.md")
        (root / "a.md.meta.json").write_text(json.dumps({"acl_labels": ["board"]}))
        _ingest(settings, instance)
        assert _group_keys(db, "a.md") == {dedup.acl_key(["board"])}

        # An index build (the same weights: every vector from the embedding cache), then the checks.
        v1 = store.versions.active_version(db)
        build = run_index_build(settings, resolve_model("all-MiniLM-L6-v2").location, instance=instance)
        assert build["success"] and build["status"] == "ready", build
        outcomes = _integrity(db)
        assert all(outcome.passed for outcome in outcomes.values()), {n: o.summary for n, o in outcomes.items()}
        assert outcomes["index_drift"].numbers["misgrouped_chunks"] == 0
        v2 = store.versions.get_version(db, build["version"])
        with db.transaction():
            blue_green.promote(db, v2.version_id, blue_green.check_gates(db, v2))
        for version in (v1, v2):  # both versions: each label set's reader finds its own document only
            table = sql.Identifier(version.table_name)
            rows = db.execute(sql.SQL("SELECT d.rel_path, t.acl_labels FROM {} t JOIN documents d USING (doc_id)"
                                      " ORDER BY 1").format(table)).fetchall()
            assert rows == [("a.md", ["board"]), ("b.md", ["staff"])], version.label
        assert _readers_find(db, ["staff"]) == {"b.md"} and _readers_find(db, ["board"]) == {"a.md"}
        assert _readers_find(db, ["hr"]) == set()
        after = _ingest(settings, instance)
        assert all(after["checks"][name]["passed"] for name in ("index_drift", "acl_coverage")), after["checks"]


def _left_by_the_previous_main(db, root: Path, settings, instance, files: dict[str, str] | None = None) -> None:
    """a.md (staff) indexed, then relabelled hr the way the starting code (b988343) left a touch plus a sidecar:
    the document and its rows say hr, its chunk stays in the staff group (`files`: other documents so left)."""
    files = files or {"a.md": NOTICE}
    for name, text in files.items():
        (root / name).write_text(text)
    _ingest(settings, instance)
    for name in files:
        (root / f"{name}.meta.json").write_text(json.dumps({"acl_labels": ["hr"]}))  # the scan agrees: no change
        doc_id = db.execute("UPDATE documents SET acl_labels = '{hr}' WHERE rel_path = %s RETURNING doc_id",
                            (name,)).fetchone()[0]
        for version in store.versions.index_versions(db):
            store.versions.copy_document_labels(db, version, [doc_id])
        assert _group_keys(db, name) == {dedup.acl_key(["staff"])}


def _status(db, rel_path: str) -> str:
    return db.execute("SELECT status FROM documents WHERE rel_path = %s", (rel_path,)).fetchone()[0]


def _fails_once_and_requeues(settings, instance, db, rel_path: str) -> dict:
    """An ingest whose index_drift check finds the drift: the run fails, the check re-queues the document (committed,
    seen from another connection) and says so."""
    summary = run_ingest(settings, instance=instance)
    assert not summary["success"]
    drift = summary["checks"]["index_drift"]
    assert not drift["passed"] and drift["severity"] == "ERROR", drift
    assert "1 indexed documents re-queued: the next ingest writes them again" in drift["summary"], drift
    assert _status(db, rel_path) == "pending_index"
    return summary


def test_index_drift_counts_chunks_in_another_label_sets_group_and_the_next_ingest_repairs_them(make_settings,
                                                                                                 tmp_path, db):
    """No refresh pays for a full-table repair: the ingest's own index_drift check finds the chunk in another label
    set's group, fails and re-queues its document; the next ingest writes it again and the check passes (no hand
    re-queue)."""
    root = tmp_path / "docs"
    root.mkdir()
    settings = make_settings([{"name": "docs", "root": str(root), "acl_labels": ["staff"]}])
    with DagsterInstance.ephemeral() as instance:
        _left_by_the_previous_main(db, root, settings, instance)
        drift = checks.index_drift(db)  # as a script calls it: it only reads
        assert not drift.passed and drift.numbers["misgrouped_chunks"] == 1 and drift.numbers["requeued"] == 0
        assert "1 chunks of indexed documents are in a near-duplicate group of another label set" in drift.summary
        assert _status(db, "a.md") == "indexed"

        # The same text under staff arrives: this run's ingest leaves a.md where it was and its check re-queues it.
        (root / "b.md").write_text(NOTICE)
        failed = _fails_once_and_requeues(settings, instance, db, "a.md")
        assert failed["documents_indexed"] == 1  # b.md only: the routine path regrouped nothing else
        assert _group_keys(db, "a.md") == {dedup.acl_key(["staff"])}
        summary = _ingest(settings, instance)
        assert all(summary["checks"][name]["passed"] for name in ("index_drift", "acl_coverage")), summary["checks"]
        assert (summary["documents_indexed"], summary["vectors_embedded"]) == (1, 0)
        assert _group_keys(db, "a.md") == {dedup.acl_key(["hr"])}
        assert _group_keys(db, "b.md") == {dedup.acl_key(["staff"])}
        assert _readers_find(db, ["staff"]) == {"b.md"} and _readers_find(db, ["hr"]) == {"a.md"}
        assert checks.index_drift(db).numbers["misgrouped_chunks"] == 0


def test_an_index_built_after_the_previous_main_breaks_no_version_and_a_broken_one_is_repaired(make_settings,
                                                                                                tmp_path, db, db_url):
    root = tmp_path / "docs"
    root.mkdir()
    settings = make_settings([{"name": "docs", "root": str(root), "acl_labels": ["staff"]}])
    model = resolve_model("all-MiniLM-L6-v2").location
    with DagsterInstance.ephemeral() as instance:
        _left_by_the_previous_main(db, root, settings, instance)
        # The backfill regroups a.md: every version follows, not only the one being built.
        build = run_index_build(settings, model, instance=instance)
        assert build["success"] and build["status"] == "ready", build
        outcomes = _integrity(db)
        assert all(outcome.passed for outcome in outcomes.values()), {n: o.summary for n, o in outcomes.items()}
        assert _group_keys(db, "a.md") == {dedup.acl_key(["hr"])}

        # What the previous main's build left: the chunk in the hr group in the new version only, the active
        # version with a row no chunk backs and a group without a vector. The check re-queues a.md, the next ingest
        # repairs it.
        v1 = store.versions.active_version(db)
        table = sql.Identifier(v1.table_name)
        a_group = db.execute("SELECT group_id FROM chunks JOIN documents USING (doc_id) WHERE rel_path = 'a.md'"
                             ).fetchone()[0]
        db.execute(sql.SQL("UPDATE {} SET chunk_id = 'old-staff-group' WHERE chunk_id = %s").format(table),
                   (a_group,))
        drift = checks.index_drift(db)
        assert not drift.passed and "1 rows belong to no chunk" in drift.summary
        assert "1 chunk groups of indexed documents have no vector" in drift.summary
        # The registry's run (what each ingest, `rag-pipeline checks` and index_health run) re-queues, committed
        # by the check itself on a connection outside autocommit, as the Dagster check's is.
        index_drift = next(check for check in checks.CHECKS if check.name == "index_drift")
        conn = connect(db_url)
        try:
            outcome = checks.run_check(conn, index_drift, settings)
        finally:
            conn.rollback()
            conn.close()
        assert not outcome.passed and outcome.numbers["requeued"] == 1, outcome.summary
        assert _status(db, "a.md") == "pending_index"
        summary = _ingest(settings, instance)
        assert summary["checks"]["index_drift"]["passed"], summary["checks"]["index_drift"]
        assert summary["vectors_embedded"] == 0
        assert _readers_find(db, ["hr"]) == {"a.md"} and _readers_find(db, ["staff"]) == set()


def test_a_backfill_regroups_every_document_of_a_transaction_in_every_version(make_settings, tmp_path, db,
                                                                              monkeypatch):
    """Two documents left in the old label set's groups, backfilled in one transaction: each is regrouped in the
    active version too, not only the first (the versions a regrouped document reaches are its own, every time)."""
    root = tmp_path / "docs"
    root.mkdir()
    settings = make_settings([{"name": "docs", "root": str(root), "acl_labels": ["staff"]}])
    files = {"a.md": NOTICE, "c.md": "# Canteen\n\nThe canteen on the third floor serves lunch from noon until two "
                                      "o'clock on weekdays, and soup and sandwiches until four.\n"}
    with DagsterInstance.ephemeral() as instance:
        _left_by_the_previous_main(db, root, settings, instance, files)
    v1 = store.versions.active_version(db)
    v2 = blue_green.start_version_build(db.info.dsn, settings, resolve_model("all-MiniLM-L6-v2").location)
    parts: list[int] = []

    def write_documents(conn, documents, *args):
        parts.append(len(documents))
        return write_all(conn, documents, *args)

    write_all = blue_green.write_documents
    monkeypatch.setattr(blue_green, "write_documents", write_documents)
    blue_green.backfill_version(db.info.dsn, settings, v2.version_id, 0, 1)
    assert parts == [2]  # both in one transaction
    for name in files:
        assert _group_keys(db, name) == {dedup.acl_key(["hr"])}
    for version in (v1, v2):
        keys = db.execute(sql.SQL("SELECT d.rel_path, g.acl_key FROM {} t JOIN chunk_groups g ON g.group_id = t.chunk_id"
                                  " JOIN documents d USING (doc_id) ORDER BY 1").format(
                                      sql.Identifier(version.table_name))).fetchall()
        assert keys == [("a.md", dedup.acl_key(["hr"])), ("c.md", dedup.acl_key(["hr"]))], version.label
    outcomes = _integrity(db)
    assert all(outcome.passed for outcome in outcomes.values()), {n: o.summary for n, o in outcomes.items()}


def test_parsing_a_relabelled_rewrite_of_the_same_text_queues_it_for_regrouping(make_settings, tmp_path, db, db_url):
    """The parse stage itself, without the index stage's repair: text unchanged but labels changed is chunked
    again (from its pages, nothing embedded), never waved through to `indexed` in the old label set's groups."""
    from rag_pipeline.stages.discover import discover
    from rag_pipeline.stages.process import process_pending

    root = tmp_path / "docs"
    root.mkdir()
    (root / "a.md").write_text(NOTICE)
    (root / "c.md").write_text(NOTICE.replace("seven years", "ten years"))
    settings = make_settings([{"name": "docs", "root": str(root), "acl_labels": ["staff"]}])
    with DagsterInstance.ephemeral() as instance:
        _ingest(settings, instance)
    _touch(root / "a.md")
    (root / "a.md.meta.json").write_text(json.dumps({"acl_labels": ["hr"]}))
    _touch(root / "c.md")  # the same text and the same labels: straight back to indexed, as before
    assert discover(db_url, settings.sources).changed == 2
    stats = process_pending(db_url, settings, index=False)
    assert (stats.parse.content_unchanged, stats.parse.regrouped, stats.chunk.documents_chunked) == (2, 1, 1)
    status = dict(db.execute("SELECT rel_path, status FROM documents").fetchall())
    assert status == {"a.md": "pending_index", "c.md": "indexed"}


def test_the_check_keys_label_sets_as_the_grouping_does(make_settings, tmp_path, db):
    """index_drift computes a label set's key in SQL: in code point order whatever the database's collation, or a
    correctly grouped document would be counted (and re-queued by every refresh)."""
    labels = ["zeta", "Alpha", "ärzte", "alpha", "Ωmega", "b-2", "b_1", "two words"]
    root = tmp_path / "docs"
    root.mkdir()
    (root / "a.md").write_text(NOTICE)
    (root / "a.md.meta.json").write_text(json.dumps({"acl_labels": labels}))
    settings = make_settings([{"name": "docs", "root": str(root), "acl_labels": ["staff"]}])
    with DagsterInstance.ephemeral() as instance:
        summary = _ingest(settings, instance)
    assert _group_keys(db, "a.md") == {dedup.acl_key(labels)}
    assert summary["checks"]["index_drift"]["passed"]
    assert checks.index_drift(db).numbers["misgrouped_chunks"] == 0
    db.execute("UPDATE chunk_groups SET acl_key = %s", (dedup.acl_key(labels[:-1]),))
    assert checks.index_drift(db).numbers["misgrouped_chunks"] == 1
