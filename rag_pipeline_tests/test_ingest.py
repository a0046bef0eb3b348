"""End to end through Dagster on the real database and model: incremental by construction."""

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from dagster import DagsterInstance
from psycopg import sql

from rag_pipeline import store
from rag_pipeline.config import SourceConfig
from rag_pipeline.defs.runs import run_ingest
from rag_pipeline.domain import ids
from rag_pipeline.stages.discover import discover
from rag_pipeline.text.chunking import chunker_version
from rag_pipeline_tests.conftest import TORTURE


@pytest.fixture
def ingest_torture(make_settings, tmp_path, instance):
    """Ingest copies of torture documents (name -> copy name, optional sidecar) as one labelled source."""

    def run(copies: list[tuple[str, str]], labels: list[str], sidecars: dict[str, dict] | None = None) -> dict:
        folder = tmp_path / "torture_copies"
        folder.mkdir(exist_ok=True)
        for original, copy_name in copies:
            shutil.copy(TORTURE / "docs" / original, folder / copy_name)
        for copy_name, sidecar in (sidecars or {}).items():
            (folder / f"{copy_name}.meta.json").write_text(json.dumps(sidecar))
        settings = make_settings([{"name": "torture", "root": str(folder), "acl_labels": labels}])
        summary = run_ingest(settings, instance=instance)
        assert summary["success"], summary.get("errors")
        return summary

    return run


@pytest.fixture(scope="module")
def instance():
    with DagsterInstance.ephemeral() as ephemeral:
        yield ephemeral


@pytest.fixture
def ingest(make_settings, corpus, instance):
    settings = make_settings([{"name": "sample", "root": str(corpus), "acl_labels": ["staff"]}])

    def run() -> dict:
        summary = run_ingest(settings, instance=instance)
        assert summary["success"], summary.get("errors")
        return summary

    return run


def _active_table(db) -> sql.Identifier:
    return sql.Identifier(store.versions.active_version(db).table_name)


def _index_rows(db, rel_path: str | None = None, columns: str = "doc_id, chunk_id, acl_labels, embedding_input_sha"):
    query = sql.SQL("SELECT {} FROM {} WHERE %(all)s OR doc_id = %(doc_id)s ORDER BY ordinal").format(
        sql.SQL(columns), _active_table(db)
    )
    doc_id = ids.doc_id("sample", rel_path) if rel_path else ""
    return db.execute(query, {"all": rel_path is None, "doc_id": doc_id}).fetchall()


def _doc(db, rel_path: str) -> dict:
    row = db.execute(
        "SELECT status, content_hash, indexed_at, parsed_at, ref FROM documents WHERE doc_id = %s",
        (ids.doc_id("sample", rel_path),),
    ).fetchone()
    return dict(zip(("status", "content_hash", "indexed_at", "parsed_at", "ref"), row, strict=True)) if row else {}


def test_first_ingest_then_noop(ingest, db):
    first = ingest()
    assert first["documents_seen"] == 7
    assert first["new"] == 7
    assert first["held"] == 1  # drafts/unreviewed-notes.md: its sidecar gives it no labels
    assert first["parsed"] == 5
    assert first["dead_lettered"] == 1 and first["dead_letter_reasons"] == {"truncated": 1}
    assert first["chunks_written"] > 5
    assert first["vectors_embedded"] == first["chunks_written"]
    assert first["vectors_reused"] == 0

    rows = _index_rows(db)
    # The internal-use notice closes three staff documents: it is stored once.
    assert first["near_duplicates"] == 2 and len(rows) == first["chunks_written"] - 2
    assert all(labels for _, _, labels, _ in rows)
    assert {tuple(r[2]) for r in _index_rows(db, "finance/q3-report.pdf")} == {("finance",)}
    assert _index_rows(db, "drafts/unreviewed-notes.md") == []
    assert _doc(db, "drafts/unreviewed-notes.md")["status"] == "held_no_labels"
    assert db.execute("SELECT count(*) FROM chunks c JOIN documents d USING (doc_id) WHERE d.status <> 'indexed'"
                      ).fetchone()[0] == 0
    dead = store.pages.dead_letter_summary(db)
    assert [(d["rel_path"], d["reason"]) for d in dead] == [("legacy/scanned-contract.pdf", "truncated")]

    second = ingest()
    assert second["documents_seen"] == 7 and second["unchanged"] == 7
    for key in ("new", "changed", "deleted", "parsed", "dead_lettered", "chunks_written", "vectors_embedded",
                "vectors_reused", "content_unchanged"):
        assert second[key] == 0, key


def test_touch_without_content_change_skips_chunking_and_embedding(ingest, db, corpus):
    ingest()
    before = _doc(db, "handbook/security-policy.pdf")
    path = corpus / "handbook" / "security-policy.pdf"
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5 * 10**9))
    summary = ingest()
    assert summary["changed"] == 1
    assert summary["content_unchanged"] == 1 and summary["parsed"] == 0
    assert summary["chunks_written"] == 0 and summary["vectors_embedded"] == 0
    after = _doc(db, "handbook/security-policy.pdf")
    assert after["status"] == "indexed" and after["content_hash"] == before["content_hash"]
    assert after["indexed_at"] == before["indexed_at"]


def test_editing_one_file_reprocesses_only_it(ingest, db, corpus):
    ingest()
    untouched = {p: _doc(db, p) for p in ("handbook/security-policy.pdf", "products/nw200-faq.html")}
    rows_before = _index_rows(db, "handbook/travel-policy.md")
    path = corpus / "handbook" / "travel-policy.md"
    path.write_text(path.read_text().replace("within 30 days", "within 45 days"))
    summary = ingest()
    assert summary["changed"] == 1 and summary["parsed"] == 1
    # Only chunks whose embedding input changed are embedded; the rest come from the cache.
    assert 1 <= summary["vectors_embedded"] < len(rows_before)
    assert summary["vectors_reused"] >= 1
    rows_after = _index_rows(db, "handbook/travel-policy.md")
    assert len(rows_after) == len(rows_before)
    texts = [r[0] for r in _index_rows(db, "handbook/travel-policy.md", columns="text")]
    assert any("within 45 days" in t for t in texts) and not any("within 30 days" in t for t in texts)
    for rel_path, before in untouched.items():
        assert _doc(db, rel_path)["parsed_at"] == before["parsed_at"]
        assert _doc(db, rel_path)["indexed_at"] == before["indexed_at"]


def test_deleting_a_file_removes_its_rows_everywhere(ingest, db, corpus):
    ingest()
    doc_id = ids.doc_id("sample", "products/nw200-faq.html")
    assert _index_rows(db, "products/nw200-faq.html")
    (corpus / "products" / "nw200-faq.html").unlink()
    summary = ingest()
    assert summary["deleted"] == 1 and summary["documents_seen"] == 6
    for table in ("documents", "document_pages", "chunks", store.versions.active_version(db).table_name):
        query = sql.SQL("SELECT count(*) FROM {} WHERE doc_id = %s").format(sql.Identifier(table))
        assert db.execute(query, (doc_id,)).fetchone()[0] == 0, table
    logged = db.execute("SELECT source, rel_path FROM deletion_log WHERE doc_id = %s", (doc_id,)).fetchall()
    assert logged == [("sample", "products/nw200-faq.html")]


def test_acl_changes_update_labels_without_reembedding(ingest, db, corpus):
    ingest()
    sidecar = corpus / "handbook" / "travel-policy.md.meta.json"
    sidecar.write_text(json.dumps({"acl_labels": ["staff", "contractors"]}))
    summary = ingest()
    assert summary["relabelled"] == 1
    assert summary["parsed"] == 0 and summary["vectors_embedded"] == 0
    assert {tuple(r[2]) for r in _index_rows(db, "handbook/travel-policy.md")} == {("staff", "contractors")}

    sidecar.write_text(json.dumps({"acl_labels": []}))  # nobody may read it now: held back, rows gone
    summary = ingest()
    assert summary["held"] == 1
    assert _index_rows(db, "handbook/travel-policy.md") == []
    assert _doc(db, "handbook/travel-policy.md")["status"] == "held_no_labels"

    sidecar.unlink()  # back to the source's default labels: indexed again, vectors from the cache
    summary = ingest()
    # Released: re-chunked from the pages it kept while held (never served), not parsed again.
    assert (summary["released"], summary["changed"], summary["parsed"]) == (1, 0, 0) and summary["chunks_written"] > 0
    assert summary["documents"]["released"] == [f"#{_doc(db, 'handbook/travel-policy.md')['ref']}"]
    assert summary["vectors_embedded"] == 0 and summary["vectors_reused"] > 0
    assert {tuple(r[2]) for r in _index_rows(db, "handbook/travel-policy.md")} == {("staff",)}


def test_dead_letter_is_retried_when_the_file_changes(ingest, db, corpus):
    ingest()
    broken = corpus / "legacy" / "scanned-contract.pdf"
    assert _doc(db, "legacy/scanned-contract.pdf")["status"] == "dead_letter"
    assert ingest()["dead_lettered"] == 0  # unchanged: not retried
    shutil.copy(corpus / "finance" / "q3-report.pdf", broken)
    summary = ingest()
    assert summary["parsed"] == 1 and summary["dead_lettered"] == 0
    assert _doc(db, "legacy/scanned-contract.pdf")["status"] == "indexed"
    assert store.pages.dead_letter_summary(db) == []


def test_a_missing_source_root_deletes_nothing(make_settings, corpus, instance, db):
    settings = make_settings([{"name": "sample", "root": str(corpus), "acl_labels": ["staff"]}])
    run_ingest(settings, instance=instance)
    count = db.execute("SELECT count(*) FROM documents").fetchone()[0]
    moved = Path(str(corpus) + "-unmounted")
    corpus.rename(moved)
    summary = run_ingest(settings, instance=instance)
    # Nothing deleted, and loud: the run fails through staleness, which names the missing root (issue 47, case 5).
    assert not summary["success"] and summary["deleted"] == 0 and summary["scans_failed"] == ["sample"]
    assert summary["problems"] and "missing" in summary["problems"][0]["problem"]
    assert "sample: its latest scan failed (root folder" in summary["checks"]["staleness"]["summary"]
    assert db.execute("SELECT count(*) FROM documents").fetchone()[0] == count


def test_cli_style_sources_and_labels(make_settings, tmp_path, instance, db):
    folder = tmp_path / "adhoc"
    folder.mkdir()
    (folder / "note.md").write_text("# Note\nThe quarterly offsite is in Annecy this year.")
    settings = make_settings()
    summary = run_ingest(settings, sources=[f"adhoc={folder}"], labels=["ops"], instance=instance)
    assert summary["success"] and summary["parsed"] == 1
    labels = db.execute(sql.SQL("SELECT DISTINCT acl_labels FROM {}").format(_active_table(db))).fetchall()
    assert labels == [(["ops"],)]


def _long_document(paragraph_count: int = 50) -> str:
    sections = []
    for i in range(paragraph_count):
        words = " ".join(f"term{i}x{j}" for j in range(12))
        sections.append(f"## Clause {i}\n\nClause {i} of the supply agreement sets the obligations numbered {i}: {words}.")
    return "# Supply agreement\n\n" + "\n\n".join(sections) + "\n"


def test_editing_one_paragraph_of_a_50_chunk_document_reembeds_one_chunk(make_settings, tmp_path, instance):
    folder = tmp_path / "contracts"
    folder.mkdir()
    path = folder / "agreement.md"
    path.write_text(_long_document())
    settings = make_settings([{"name": "contracts", "root": str(folder), "acl_labels": ["legal"]}])
    first = run_ingest(settings, instance=instance)
    assert first["chunks_written"] == 50 and first["vectors_embedded"] == 50
    path.write_text(path.read_text().replace("obligations numbered 17:", "duties numbered 17:"))
    second = run_ingest(settings, instance=instance)
    assert second["parsed"] == 1 and second["chunks_written"] == 50
    assert second["vectors_embedded"] == 1 and second["vectors_reused"] == 49


def test_changing_only_the_chunker_reembeds_nothing_that_stayed_the_same(make_settings, tmp_path, instance, db):
    folder = tmp_path / "contracts"
    folder.mkdir()
    (folder / "agreement.md").write_text(_long_document(20))
    source = [{"name": "contracts", "root": str(folder), "acl_labels": ["legal"]}]
    first = run_ingest(make_settings(source, chunking={"max_tokens": 200}), instance=instance)
    assert first["vectors_embedded"] == 20
    second = run_ingest(make_settings(source, chunking={"max_tokens": 180}), instance=instance)
    assert second["documents_chunked"] == 1 and second["chunks_written"] == 20  # re-chunked: new chunker version
    assert second["vectors_embedded"] == 0 and second["vectors_reused"] == 20
    versions = {r[0] for r in db.execute("SELECT DISTINCT chunker_version FROM chunks").fetchall()}
    assert versions == {chunker_version(180, 0)} == {"structure+recursive-tokens/10;max=180;overlap=0"}


@pytest.mark.torture
def test_three_column_document_chunks_have_no_furniture_and_read_in_order(ingest_torture, db):
    summary = ingest_torture([("fedreg_2020-17221_3col.pdf", "fedreg.pdf")], ["public"])
    assert summary["parsed"] == 1 and summary["chunks_written"] > 30
    texts = [" ".join(t.split()) for (t,) in db.execute("SELECT text FROM chunks ORDER BY ordinal").fetchall()]
    assert not [t for t in texts if re.search(r"Federal Register\s*/\s*Vol\. 85", t)]
    assert not [t for t in texts if re.search(r"\b4770\d\b|\b4771\d\b", t) and len(t) < 12]  # no bare page numbers
    whole = " ".join(texts)
    assert "Investigation of the accident has been completed by the Indonesian authorities" in whole
    cleaning = db.execute("SELECT cleaning FROM documents").fetchone()[0]
    assert cleaning["running_header_footer"] > 1000
    assert {r[0] for r in db.execute("SELECT DISTINCT parser_version FROM chunks").fetchall()} != {None}


@pytest.mark.torture
def test_a_scanned_page_is_escalated_to_ocr_and_becomes_searchable(ingest_torture, db):
    from rag_pipeline.retrieval.search import search

    summary = ingest_torture([("docling_ocr_test_scanned.pdf", "scan.pdf")], ["ops"])
    assert summary["parsed"] == 1 and summary["chunks_written"] == 1
    tier, signals = db.execute("SELECT tier, signals FROM document_pages").fetchone()
    assert tier == "ocr" and signals["escalation"] == "image_only"
    hits = search(db, "which package converts PDF documents to JSON and Markdown", ["ops"], k=1)
    assert hits and "Docling bundles PDF document conversion" in hits[0].text


@pytest.mark.torture
def test_encrypted_pdf_opens_with_the_sidecar_password(ingest_torture, db):
    encrypted = "camelot_health_protected_encrypted.pdf"
    summary = ingest_torture(
        [(encrypted, "locked.pdf"), (encrypted, "opened.pdf")], ["hr"], {"opened.pdf": {"password": "userpass"}}
    )
    assert summary["parsed"] == 1 and summary["dead_letter_reasons"] == {"encrypted": 1}
    statuses = dict(db.execute("SELECT rel_path, status FROM documents").fetchall())
    assert statuses == {"locked.pdf": "dead_letter", "opened.pdf": "indexed"}
    stored = db.execute("SELECT metadata::text FROM documents WHERE rel_path = 'opened.pdf'").fetchone()[0]
    assert "userpass" not in stored  # the password is used, never stored


def test_narrowed_labels_apply_at_once_even_when_the_file_also_changed(ingest, db, corpus):
    ingest()
    path = corpus / "handbook" / "travel-policy.md"
    (corpus / "handbook" / "travel-policy.md.meta.json").write_text(json.dumps({"acl_labels": ["travel-desk"]}))
    path.write_text(path.read_text() + "\nA new paragraph.\n")
    # Reconcile alone (no parsing yet): the rows already carry only the new label.
    discover(db.info.dsn, [SourceConfig(name="sample", root=corpus, acl_labels=("staff",))])
    assert {tuple(r[2]) for r in _index_rows(db, "handbook/travel-policy.md")} == {("travel-desk",)}
    assert _doc(db, "handbook/travel-policy.md")["status"] == "pending_parse"


def test_a_churned_version_is_vacuumed_and_a_quiet_one_is_not(clone):
    """Deleted rows stay in the HNSW graph and the BM25 postings until a vacuum: a version whose tables hold more
    dead rows than execution.vacuum_dead_share of their live ones is vacuumed after the index writes."""
    conn, settings = clone
    (version,) = store.versions.writable_versions(conn)
    assert store.versions.vacuum_churned(conn, version, 0.1) == []  # a fresh build has nothing to collect
    with conn.transaction():
        conn.execute(sql.SQL("DELETE FROM {} WHERE chunk_id IN (SELECT chunk_id FROM {} ORDER BY chunk_id LIMIT 5)")
                     .format(sql.Identifier(version.table_name), sql.Identifier(version.table_name)))
        conn.execute("SELECT pg_stat_force_next_flush()")  # the counts pg_stat_user_tables reads, at commit
    vacuumed = store.versions.vacuum_churned(conn, version, 0.1)
    # Five rows are under the floor of 50 dead rows; their few hundred postings are not.
    assert f"{version.table_name}_postings" in vacuumed and version.table_name not in vacuumed
    conn.execute("SELECT pg_stat_clear_snapshot()")
    last = conn.execute("SELECT last_vacuum FROM pg_stat_user_tables WHERE relname = %s",
                        (f"{version.table_name}_postings",)).fetchone()[0]
    assert last is not None
    assert store.versions.vacuum_churned(conn, version, 0.1) == []  # collected: nothing left to do


def test_run_statistics_count_each_document_once_with_two_writable_versions(ingest, db, make_settings, corpus):
    """With a version being built beside the active one, every write reaches both; the run's near-duplicates and
    dedup_rate are per document (at most 1), and only rows_written counts the rows of every version."""
    from rag_pipeline.lifecycle import blue_green

    first = ingest()
    settings = make_settings([{"name": "sample", "root": str(corpus), "acl_labels": ["staff"]}])
    blue_green.start_version_build(db.info.dsn, settings, store.versions.active_version(db).embedding_model)
    assert len(store.versions.writable_versions(db)) == 2
    db.execute("UPDATE documents SET status = 'pending_index' WHERE status = 'indexed'")  # written again, in both
    again = ingest()
    assert (again["documents_indexed"], again["near_duplicates"]) == (first["documents_indexed"], 2)
    assert again["dedup_rate"] == first["dedup_rate"] <= 1
    assert again["rows_written"] == 2 * (first["chunks_written"] - 2)
