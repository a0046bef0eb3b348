"""Near-duplicate groups on the real database: stored once, remembered everywhere, never across labels."""

import json

import pytest
from dagster import DagsterInstance
from psycopg import sql

from rag_pipeline import store
from rag_pipeline.defs.runs import run_ingest
from rag_pipeline.retrieval.search import search
from rag_pipeline.text import dedup

BOILERPLATE = (
    "This document is the property of Northwind Robotics. It may not be copied, forwarded or disclosed to third "
    "parties without the written consent of the legal department, and it must be destroyed when no longer needed."
)


def test_signatures_estimate_jaccard():
    a = dedup.signature(BOILERPLATE)
    b = dedup.signature(BOILERPLATE.replace("forwarded", "sent on"))
    c = dedup.signature("Completely unrelated text about warehouse robots and their batteries.")
    assert dedup.similarity(a, a) == 1.0
    assert dedup.similarity(a, b) >= 0.6
    assert dedup.similarity(a, c) < 0.2
    params = dedup.lsh_params(0.8)
    assert params.bands * params.rows <= dedup.NUM_PERM
    assert dedup.band_buckets(a, params, "staff") != dedup.band_buckets(a, params, "hr")
    assert dedup.acl_key(["b", "a", "a"]) == dedup.acl_key(["a", "b"])


def test_texts_that_state_other_figures_are_never_near_duplicates():
    this_year = ("Total revenue for the fiscal year was $1204 million, up from the prior year on higher volumes in "
                 "both segments. Operating margin improved on lower input costs and a better product mix, while "
                 "selling, general and administrative expenses grew with the sales force. Capital expenditures went "
                 "mostly to the new plant, and the company returned cash to shareholders through dividends.")
    last_year = this_year.replace("1204", "1102")
    params = dedup.lsh_params(0.8)
    a, b = dedup.signature(this_year), dedup.signature(last_year)
    assert dedup.similarity(a, b) >= 0.8  # by their words alone they would be grouped
    assert dedup.figures_key(this_year) != dedup.figures_key(last_year)
    assert dedup.figures_key(this_year) == dedup.figures_key(this_year.replace("higher", "larger"))
    shared = set(dedup.band_buckets(a, params, "staff", dedup.figures_key(this_year)))
    assert not shared & set(dedup.band_buckets(b, params, "staff", dedup.figures_key(last_year)))


@pytest.fixture
def boilerplate_corpus(tmp_path):
    folder = tmp_path / "policies"
    folder.mkdir()
    for i in range(5):
        legal = BOILERPLATE if i != 2 else BOILERPLATE.replace("and it must be", "and must be")  # near-duplicate
        (folder / f"policy-{i}.md").write_text(
            f"# Policy {i}\n\nPolicy {i} covers topic number {i}: " + f"specific rule {i} " * 20 + f"\n\n## Legal notice\n\n{legal}\n"
        )
    (folder / "hr-policy.md").write_text(f"# HR policy\n\nSalary bands are reviewed yearly.\n\n## Legal notice\n\n{BOILERPLATE}\n")
    (folder / "hr-policy.md.meta.json").write_text(json.dumps({"acl_labels": ["hr"]}))
    return folder


def _boilerplate_rows(db):
    table = sql.Identifier(store.versions.active_version(db).table_name)
    return db.execute(
        sql.SQL("SELECT chunk_id, doc_id, acl_labels FROM {} WHERE text LIKE %s ORDER BY acl_labels").format(table),
        ("%property of Northwind%",),
    ).fetchall()


def _occurrences(db, group_id):
    return db.execute("SELECT count(*) FROM chunks WHERE group_id = %s", (group_id,)).fetchone()[0]


def test_boilerplate_is_stored_once_per_label_set_and_survives_partial_deletion(make_settings, boilerplate_corpus, db):
    settings = make_settings([{"name": "policies", "root": str(boilerplate_corpus), "acl_labels": ["staff"]}])
    with DagsterInstance.ephemeral() as instance:
        first = run_ingest(settings, instance=instance)
        assert first["success"], first.get("errors")
        rows = _boilerplate_rows(db)
        assert [r[2] for r in rows] == [["hr"], ["staff"]]  # same paragraph, different labels: separate
        (hr_group, _, _), (staff_group, _, _) = rows
        assert _occurrences(db, staff_group) == 5 and _occurrences(db, hr_group) == 1

        hits = search(db, "may this document be disclosed to third parties", ["staff", "hr"], k=10)
        legal_hits = [h for h in hits if "property of Northwind" in h.text]
        assert len(legal_hits) == 2 and {h.occurrences for h in legal_hits} == {5, 1}

        for i in (0, 1, 2, 3):  # delete four of the five: the group lives on, owned by the survivor
            (boilerplate_corpus / f"policy-{i}.md").unlink()
        summary = run_ingest(settings, instance=instance, confirm_deletions=["policies"])  # 4 of 6: confirmed
        assert summary["deleted"] == 4 and summary["vectors_embedded"] == 0
        rows = _boilerplate_rows(db)
        assert len(rows) == 2
        staff_row = [r for r in rows if r[2] == ["staff"]][0]
        assert staff_row[0] == staff_group and _occurrences(db, staff_group) == 1
        survivor = db.execute("SELECT doc_id FROM documents WHERE rel_path = 'policy-4.md'").fetchone()[0]
        assert staff_row[1] == survivor

        (boilerplate_corpus / "policy-4.md").unlink()  # the last occurrence goes: so does the group
        run_ingest(settings, instance=instance)
        assert [r[2] for r in _boilerplate_rows(db)] == [["hr"]]
        assert db.execute("SELECT count(*) FROM chunk_groups WHERE group_id = %s", (staff_group,)).fetchone()[0] == 0
        assert db.execute("SELECT count(*) FROM chunk_group_bands WHERE group_id = %s", (staff_group,)
                          ).fetchone()[0] == 0


def test_relabelling_a_document_moves_its_chunks_out_of_shared_groups(make_settings, boilerplate_corpus, db):
    settings = make_settings([{"name": "policies", "root": str(boilerplate_corpus), "acl_labels": ["staff"]}])
    with DagsterInstance.ephemeral() as instance:
        run_ingest(settings, instance=instance)
        owner = _boilerplate_rows(db)[1][1]
        owner_path = db.execute("SELECT rel_path FROM documents WHERE doc_id = %s", (owner,)).fetchone()[0]
        (boilerplate_corpus / f"{owner_path}.meta.json").write_text(json.dumps({"acl_labels": ["board"]}))
        summary = run_ingest(settings, instance=instance)
        assert summary["relabelled"] == 1 and summary["vectors_embedded"] == 0
    rows = _boilerplate_rows(db)
    assert sorted(r[2] for r in rows) == [["board"], ["hr"], ["staff"]]
    by_labels = {tuple(r[2]): r for r in rows}
    assert by_labels[("board",)][1] == owner
    assert _occurrences(db, by_labels[("staff",)][0]) == 4
    # No group mixes label sets.
    mixed = db.execute(
        """SELECT c.group_id FROM chunks c JOIN documents d USING (doc_id) GROUP BY c.group_id
           HAVING count(DISTINCT d.acl_labels) > 1"""
    ).fetchall()
    assert mixed == []
    # The staff user sees the staff copy only; the board copy stays with the board.
    staff_hits = search(db, "disclosed to third parties", ["staff"], k=10)
    assert all(owner != h.doc_id for h in staff_hits)


REWORDED_NOTICE = ("Confidential material of Northwind Robotics: keep it inside the company, share it only with "
                   "colleagues who need it for their work, and shred paper copies once the project they served has "
                   "closed.")


def test_rechunked_documents_leave_no_empty_group_whatever_the_order(make_settings, boilerplate_corpus, db, db_url):
    from rag_pipeline.domain.status import DocumentStatus as D
    from rag_pipeline.embedding.locations import load_tokenizer
    from rag_pipeline.lifecycle import checks
    from rag_pipeline.stages.chunk import ChunkStats, chunk_one, chunk_size, sizing_model_location
    from rag_pipeline.stages.index import IndexStats, index_document
    from rag_pipeline.store.database import connect
    from rag_pipeline.text.chunking import Chunker

    settings = make_settings([{"name": "policies", "root": str(boilerplate_corpus), "acl_labels": ["staff"]}])
    with DagsterInstance.ephemeral() as instance:
        assert run_ingest(settings, instance=instance)["success"]
    staff_group, owner = next((r[0], r[1]) for r in _boilerplate_rows(db) if r[2] == ["staff"])
    others = [r[0] for r in db.execute(
        "SELECT DISTINCT doc_id FROM chunks WHERE group_id = %s AND doc_id <> %s ORDER BY 1", (staff_group, owner))]
    assert len(others) == 4

    # A parser bump rewords the notice in every staff document and queues them all for chunking again.
    db.execute("""UPDATE document_pages SET markdown = regexp_replace(markdown, 'This document is the property[^\n]*',
                                                                      %s)
                  WHERE doc_id = ANY(%s)""", (REWORDED_NOTICE, [owner, *others]))
    db.execute("UPDATE documents SET status = %s WHERE doc_id = ANY(%s)", (D.PENDING_CHUNK, [owner, *others]))

    with connect(db_url) as conn:
        location = sizing_model_location(conn, settings)
        chunker = Chunker(load_tokenizer(location), chunk_size(settings, location), settings.chunking.overlap_tokens)
        conn.commit()
        # The order a parse worker and the index thread can take: the row's owner is chunked and indexed while the
        # other occurrences still wait for their worker (so no occurrence takes the row over), then the others.
        for doc_id in (owner, *others):
            chunk_one(conn, store.queue.pending_document(conn, doc_id, D.PENDING_CHUNK), chunker, None, settings,
                      ChunkStats())
            index_document(conn, store.queue.pending_document(conn, doc_id, D.PENDING_INDEX), settings, IndexStats())

    assert db.execute("SELECT count(*) FROM documents WHERE status <> 'indexed'").fetchone()[0] == 0
    assert [r[2] for r in _boilerplate_rows(db)] == [["hr"]]  # the staff notice reads differently now
    assert _occurrences(db, staff_group) == 0
    assert db.execute("SELECT count(*) FROM chunk_groups WHERE group_id = %s", (staff_group,)).fetchone()[0] == 0
    assert store.health.empty_group_count(db) == 0
    assert checks.deletion_replay(db).passed


def test_the_migration_drops_groups_left_without_chunks_and_keeps_the_others(make_settings, boilerplate_corpus, db):
    from rag_pipeline.store.database import SQL_DIR

    settings = make_settings([{"name": "policies", "root": str(boilerplate_corpus), "acl_labels": ["staff"]}])
    with DagsterInstance.ephemeral() as instance:
        assert run_ingest(settings, instance=instance)["success"]
    groups = db.execute("SELECT count(*) FROM chunk_groups").fetchone()[0]
    db.execute("INSERT INTO chunk_groups (group_id, acl_key, lsh_params, signature) "
               "SELECT 'orphan', acl_key, lsh_params, signature FROM chunk_groups LIMIT 1")
    assert store.health.empty_group_count(db) == 1
    db.execute((SQL_DIR / "migrations" / "003_drop_orphan_groups.sql").read_text())
    assert store.health.empty_group_count(db) == 0
    assert db.execute("SELECT count(*) FROM chunk_groups").fetchone()[0] == groups


def test_a_documents_chunks_are_grouped_in_one_pass_as_one_at_a_time(db):
    """assign_groups looks up the candidates of all of a document's chunks at once: a chunk still meets a group an
    earlier chunk of the same document opened (in no stored band yet when the lookup ran), and one stored by another
    document."""
    from rag_pipeline.stages.index import assign_groups
    from rag_pipeline.store.chunks import StoredChunk

    db.execute("INSERT INTO sources (name, root, include_patterns, freshness_sla_seconds) VALUES ('s', '/x', '{}', 1)")
    for doc_id in ("a", "b"):
        db.execute("""INSERT INTO documents (doc_id, source, rel_path, fingerprint, size_bytes, modified_at, acl_labels,
                                             status) VALUES (%s, 's', %s, 'f', 1, now(), '{staff}', 'pending_index')""",
                   (doc_id, f"{doc_id}.md"))
    policy = ("Travel must be booked through the company portal at least fourteen days before departure, and any "
              "exception needs the written approval of a department head before the tickets are bought.")
    other = ("The quarterly board meeting reviews the audit committee's findings, approves the budget for the next "
             "fiscal year and elects the chair of each standing committee from among the directors.")

    def chunks(doc_id: str, texts: list[str]) -> list[StoredChunk]:
        for ordinal, text in enumerate(texts):
            db.execute("""INSERT INTO chunks (chunk_id, doc_id, ordinal, text, page_start, page_end, token_count,
                                              content_hash, chunker_version) VALUES (%s, %s, %s, %s, 1, 1, 1, 'h', 'c')""",
                       (f"{doc_id}{ordinal}", doc_id, ordinal, text))
        return [StoredChunk(f"{doc_id}{o}", doc_id, o, t, "", "", 1, 1, "prose") for o, t in enumerate(texts)]

    params = dedup.lsh_params(0.8)
    with db.transaction():
        [board] = assign_groups(db, chunks("b", [other]), ["staff"], params)
    with db.transaction():
        grouped = assign_groups(db, chunks("a", [policy, policy + " Thank you.", other + " Thanks.", "Short note."]),
                                ["staff"], params)
    first, again, board_again, note = (c.group_id for c in grouped)
    assert again == first and board_again == board.group_id and note not in (first, board.group_id)
    stored = dict(db.execute("SELECT chunk_id, group_id FROM chunks").fetchall())
    assert stored == {"b0": board.group_id, "a0": first, "a1": first, "a2": board.group_id, "a3": note}
