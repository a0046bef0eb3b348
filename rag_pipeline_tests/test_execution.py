"""Per-document execution: worker processes with time and memory budgets, leases that let any number of workers
share one queue, discovery that never waits for parse work, and a crash that loses one document at most."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import psycopg
import pytest

from rag_pipeline.domain import ids
from rag_pipeline.stages.discover import discover
from rag_pipeline.stages.index import IndexStats, index_documents
from rag_pipeline.stages.process import leases_kept, process_pending
from rag_pipeline.stages.progress import Reporter, Snapshot, listening
from rag_pipeline.store.chunks import chunks_of
from rag_pipeline.workers.pool import Failed, Finished, Limits, WorkerPool
from rag_pipeline.workers.threads import ThreadBudget, thread_budget
from rag_pipeline_tests.conftest import port_note
from rag_pipeline_tests.hanging_worker import HangingRunner
from rag_pipeline_tests.scripted_worker import ScriptedRunner

WORDS = ("harbour ledger cargo tariff vessel manifest customs berth crane tonnage pilot tide dredging quay "
         "warehouse freight insurance broker charter voyage").split()


def _collect(pool: WorkerPool, count: int, timeout: float = 60) -> dict[str, Finished | Failed]:
    events: dict[str, Finished | Failed] = {}
    deadline = time.monotonic() + timeout
    while len(events) < count:
        assert time.monotonic() < deadline, f"only {sorted(events)} came back"
        events.update((e.key, e) for e in pool.collect(0.2))
    return events


# --- the worker pool ------------------------------------------------------------------------------------


def test_a_worker_over_its_time_is_replaced_while_the_other_goes_on():
    limits = Limits(seconds=2, seconds_per_page=0, memory_bytes=2 * 2**30)
    started = time.monotonic()
    with WorkerPool(2, ScriptedRunner(), ("m",), limits) as pool:
        pool.submit("stuck", ("sleep", 60))
        pool.submit("quick", ("sleep", 0.1))
        events = _collect(pool, 2)
        assert isinstance(events["quick"], Finished)
        stuck = events["stuck"]
        assert isinstance(stuck, Failed) and stuck.reason == "timeout"
        assert "execution.document_timeout" in stuck.detail
        assert pool.replaced == 1
        pool.submit("after", ("sleep", 0))  # a fresh worker takes the slot
        assert isinstance(_collect(pool, 1)["after"], Finished)
    assert time.monotonic() - started < 40


def test_a_worker_over_its_memory_is_killed_and_named():
    limits = Limits(seconds=60, seconds_per_page=0, memory_bytes=300 * 2**20)
    with WorkerPool(1, ScriptedRunner(), ("m",), limits) as pool:
        pool.submit("big", ("allocate", 1200))
        event = _collect(pool, 1)["big"]
        assert isinstance(event, Failed) and event.reason == "memory", event
        assert "execution.worker_memory_mb is 300" in event.detail


def test_a_dead_worker_and_a_raising_item_are_reported_and_the_pool_goes_on():
    limits = Limits(seconds=30, seconds_per_page=0, memory_bytes=2 * 2**30)
    with WorkerPool(1, ScriptedRunner(), ("m",), limits) as pool:
        pool.submit("killed", ("die", 0))
        event = _collect(pool, 1)["killed"]
        assert isinstance(event, Failed) and event.reason == "crashed" and "signal 9" in event.detail
        pool.submit("bug", ("raise", 0))
        event = _collect(pool, 1)["bug"]
        assert isinstance(event, Failed) and event.reason == "error" and "a parser bug" in event.detail
        pool.submit("fine", ("sleep", 0))
        assert isinstance(_collect(pool, 1)["fine"], Finished)
        assert pool.replaced == 1  # the raising item did not cost its worker


def test_waiting_on_an_endpoint_is_not_counted_and_pages_extend_the_budget():
    limits = Limits(seconds=1, seconds_per_page=0.4, memory_bytes=2 * 2**30)
    with WorkerPool(2, ScriptedRunner(), ("m",), limits) as pool:
        pool.submit("slow endpoint", ("endpoint", 4))
        pool.submit("long document", ("pages", 3))  # 10 pages: 1 + 4 seconds allowed
        events = _collect(pool, 2)
        assert all(isinstance(e, Finished) for e in events.values()), events


def test_progress_reports_totals_rates_and_an_eta():
    lines: list[str] = []
    seen: list[Snapshot] = []
    reporter = Reporter("parse", "pages", 1, lines.append)
    reporter.started -= 10  # ten seconds in
    with listening(seen.append):
        snapshot = reporter.report(done=5, left=15, units=50)
    assert seen == [snapshot] and snapshot.total == 20
    assert abs(snapshot.rate - 5.0) < 0.1 and abs(snapshot.eta_seconds - 30) < 1
    assert lines[0].startswith("parse: 5/20 documents, 50 pages (5.0 pages/s), ETA 30s")


# --- documents ------------------------------------------------------------------------------------------


def _index_rows(conn: psycopg.Connection) -> list[tuple[str, list[str]]]:
    return conn.execute(
        """SELECT d.rel_path, a.acl_labels FROM rag.indexed_chunks a JOIN documents d USING (doc_id)
           ORDER BY d.rel_path""").fetchall()


def test_hostile_documents_are_dead_lettered_and_the_rest_is_indexed(make_settings, db, db_url, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for index in range(6):
        (corpus / f"note-{index}.md").write_text(port_note(index))
    (corpus / "hang.md").write_text(port_note(90))
    (corpus / "bloat.md").write_text(port_note(91))
    # The crafted lines that once froze every refresh (super-linear patterns): now ordinary text, though Docling
    # takes seconds over them (and a fresh worker seconds more to import it): the budget leaves room for both.
    (corpus / "crafted.md").write_text("# a" + "\u2028" * 20000 + "b\n\n" + "x" + ". " * 40000 + "z\n")
    settings = make_settings(
        sources=[{"name": "port", "root": str(corpus), "acl_labels": ["staff"]}],
        execution={"workers": 2, "document_timeout": 30, "page_timeout": 0, "worker_memory_mb": 1500,
                   "progress_seconds": 1},
    )
    discover(db_url, settings.sources)
    lines: list[str] = []
    started = time.monotonic()
    stats = process_pending(db_url, settings, lines.append, runner=HangingRunner())
    assert time.monotonic() - started < 150
    dead = dict(db.execute("SELECT d.rel_path, l.reason FROM dead_letters l JOIN documents d USING (doc_id)"))
    assert dead == {"hang.md": "timeout", "bloat.md": "memory"}
    detail = db.execute("SELECT detail FROM dead_letters l JOIN documents d USING (doc_id) "
                        "WHERE rel_path = 'hang.md'").fetchone()[0]
    assert "execution.document_timeout 30 s" in detail
    statuses = dict(db.execute("SELECT rel_path, status FROM documents"))
    assert {name for name, status in statuses.items() if status == "indexed"} == {
        *(f"note-{i}.md" for i in range(6)), "crafted.md"}
    assert {name for name, _ in _index_rows(db)} == {*(f"note-{i}.md" for i in range(6)), "crafted.md"}
    assert stats.workers == 2 and stats.workers_replaced == 3  # bloat.md had a second, fresh worker
    assert stats.parse.dead_letter_reasons == {"timeout": 1, "memory": 1}
    assert any(line.startswith("parse and chunk: 9/9 documents") for line in lines), lines
    assert any(line.startswith("index: 7/7 documents") for line in lines), lines
    # The index's total counts what is still being parsed: it never grows, so its ETA is never 0 s early.
    totals = [int(m.group(1)) for m in (re.match(r"index: \d+/(\d+) documents", line) for line in lines) if m]
    assert totals and totals == sorted(totals, reverse=True), lines


def test_deletions_and_label_changes_reach_the_index_while_a_document_hangs(make_settings, db, db_url, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for index in range(4):
        (corpus / f"note-{index}.md").write_text(port_note(index))
    source = {"name": "port", "root": str(corpus), "acl_labels": ["staff"]}
    settings = make_settings(sources=[source], execution={"workers": 1, "document_timeout": 15, "page_timeout": 0})
    discover(db_url, settings.sources)
    process_pending(db_url, settings)
    (corpus / "hang.md").write_text(port_note(90))
    discover(db_url, settings.sources)
    refresh = threading.Thread(target=process_pending, args=(db_url, settings),
                               kwargs={"runner": HangingRunner()})
    refresh.start()
    try:
        deadline = time.monotonic() + 60
        while not db.execute("SELECT count(*) FROM documents WHERE lease_owner IS NOT NULL "
                             "AND rel_path = 'hang.md'").fetchone()[0]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        (corpus / "note-0.md").unlink()
        relabelled = make_settings(sources=[{**source, "acl_labels": ["staff", "legal"]}])
        started = time.monotonic()
        stats = discover(db_url, relabelled.sources, lock_timeout_seconds=5)
        assert time.monotonic() - started < 10  # did not wait for the hanging parse
        assert stats.deleted == 1 and stats.relabelled == 4  # hang.md too
        rows = _index_rows(db)
        assert rows and "note-0.md" not in {name for name, _ in rows}
        assert all(sorted(labels) == ["legal", "staff"] for _, labels in rows)
        assert refresh.is_alive()  # still waiting on the hanging document
    finally:
        refresh.join(120)
    reason = db.execute("SELECT reason FROM dead_letters").fetchone()[0]
    assert reason == "timeout"


def test_two_runs_share_one_queue_without_doing_a_document_twice(make_settings, db, db_url, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for index in range(10):
        (corpus / f"note-{index}.md").write_text(port_note(index))
    settings = make_settings(sources=[{"name": "port", "root": str(corpus), "acl_labels": ["staff"]}],
                             execution={"isolation": False})
    discover(db_url, settings.sources)
    results = []
    runs = [threading.Thread(target=lambda: results.append(process_pending(db_url, settings, index=False)))
            for _ in range(2)]
    for run in runs:
        run.start()
    for run in runs:
        run.join(300)
    assert len(results) == 2
    assert sum(r.parse.parsed for r in results) == 10
    assert sum(r.chunk.documents_chunked for r in results) == 10
    assert db.execute("SELECT count(*) FROM documents WHERE status = 'pending_index'").fetchone()[0] == 10
    assert db.execute("SELECT count(*) FROM documents WHERE lease_owner IS NOT NULL").fetchone()[0] == 0


def test_parallel_index_writers_put_near_duplicates_in_one_group(make_settings, db, db_url, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for index in range(6):  # six copies of one note under one name: their embedding inputs are the same too
        (corpus / f"team-{index}").mkdir()
        (corpus / f"team-{index}" / "note.md").write_text(port_note(1))
    settings = make_settings(sources=[{"name": "port", "root": str(corpus), "acl_labels": ["staff"]}])
    discover(db_url, settings.sources)
    process_pending(db_url, settings, index=False)
    stats = [IndexStats(), IndexStats()]

    def writer(own: IndexStats) -> None:
        with leases_kept(db_url, 60) as lease:
            index_documents(db_url, settings, lease, own)

    writers = [threading.Thread(target=writer, args=(own,)) for own in stats]
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join(300)
    assert sum(s.documents_indexed for s in stats) == 6
    chunks_per_copy = db.execute("SELECT count(*) FROM chunks WHERE doc_id = (SELECT min(doc_id) FROM chunks)"
                                 ).fetchone()[0]
    assert db.execute("SELECT count(*) FROM chunk_groups").fetchone()[0] == chunks_per_copy
    assert db.execute("SELECT count(*) FROM rag.indexed_chunks").fetchone()[0] == chunks_per_copy
    # The copies share their embedding inputs: each was embedded by one writer only (the other waited for it).
    assert db.execute("SELECT count(*) FROM embedding_cache").fetchone()[0] == chunks_per_copy
    assert sum(s.vectors_embedded for s in stats) == chunks_per_copy
    assert sum(s.vectors_embedded + s.vectors_reused for s in stats) == 6 * chunks_per_copy


KILL_SCRIPT = """
import sys
from rag_pipeline.config import load_settings
from rag_pipeline.stages.process import process_pending
process_pending(sys.argv[1], load_settings(sys.argv[2]), parse=False, chunk=False)
"""


def test_sigkill_mid_embedding_of_a_large_document_loses_only_its_unwritten_work(make_settings, db, db_url,
                                                                               tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    small_names = [f"a-{index}.md" for index in range(3)]
    # Documents are leased in doc_id order: a name for the large one that comes after the small ones.
    large_name = next(name for n in range(1000) if ids.doc_id("port", name := f"z-large-{n}.md")
                      > max(ids.doc_id("port", s) for s in small_names))
    for index, name in enumerate(small_names):
        (corpus / name).write_text(port_note(index, paragraphs=2))
    (corpus / large_name).write_text("# Annual report\n\n" + "\n\n".join(
        f"## Part {p}\n\n" + " ".join(f"{WORDS[(p + w) % len(WORDS)]}{p}" for w in range(120)) + "."
        for p in range(60)))
    settings = make_settings(sources=[{"name": "port", "root": str(corpus), "acl_labels": ["staff"]}],
                             execution={"embed_batch": 4})
    discover(db_url, settings.sources)
    process_pending(db_url, settings, index=False)
    small_ids = [ids.doc_id("port", name) for name in small_names]
    small = len({ids.embedding_input_sha(c.embedding_input)
                 for chunks in chunks_of(db, small_ids).values() for c in chunks})
    large_id = ids.doc_id("port", large_name)
    large = len({ids.embedding_input_sha(c.embedding_input) for c in chunks_of(db, [large_id])[large_id]})
    assert large >= 40
    process = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, db_url, str(settings.config_file)],
                               env=dict(os.environ, HF_HUB_OFFLINE="1"), start_new_session=True)
    deadline = time.monotonic() + 240
    while True:
        assert process.poll() is None, "indexing finished before the point to kill it at"
        assert time.monotonic() < deadline
        indexed = db.execute("SELECT count(*) FROM documents WHERE status = 'indexed'").fetchone()[0]
        cached = db.execute("SELECT count(*) FROM embedding_cache").fetchone()[0]
        if indexed == 3 and cached >= small + 8:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
            break
        time.sleep(0.02)
    cached = db.execute("SELECT count(*) FROM embedding_cache").fetchone()[0]
    statuses = dict(db.execute("SELECT rel_path, status FROM documents"))
    assert statuses == {**dict.fromkeys(small_names, "indexed"), large_name: "pending_index"}
    kept_of_large = cached - small
    assert 8 <= kept_of_large < large  # the calls finished before the kill are kept
    assert db.execute("SELECT lease_owner IS NOT NULL FROM documents WHERE doc_id = %s", (large_id,)).fetchone()[0]
    stats = process_pending(db_url, settings)  # the dead run's lease died with its session: taken at once
    assert stats.index.documents_indexed == 1
    assert stats.index.vectors_embedded == large - kept_of_large
    assert db.execute("SELECT count(*) FROM documents WHERE status = 'indexed'").fetchone()[0] == 4


@pytest.mark.parametrize("workers", [0, 3])
def test_worker_count_defaults_to_the_cores_the_memory_allows(workers):
    from rag_pipeline.workers.pool import auto_workers

    chosen = auto_workers(workers, 256 * 2**20)
    if workers:
        assert chosen == workers
    else:
        assert 1 <= chosen <= len(os.sched_getaffinity(0))
        assert auto_workers(0, 2**50) == 1  # no machine holds two petabyte workers


def test_a_writer_planned_before_a_scan_narrowed_the_labels_writes_the_narrowed_labels(make_settings, db, db_url,
                                                                                    tmp_path):
    from rag_pipeline import store
    from rag_pipeline.domain.status import DocumentStatus
    from rag_pipeline.stages.index import ensure_first_version, index_document
    from rag_pipeline.store.database import connect

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "memo.md").write_text(port_note(3))
    # Written well before the scan: a file the next scan finds racily clean would be parsed again (its planned
    # write then finds it claimed back), which is not the race this test is about.
    an_hour_ago = time.time() - 3600
    os.utime(corpus / "memo.md", (an_hour_ago, an_hour_ago))
    source = {"name": "port", "root": str(corpus), "acl_labels": ["staff", "legal"]}
    settings = make_settings(sources=[source])
    discover(db_url, settings.sources)
    process_pending(db_url, settings, index=False)
    ensure_first_version(db_url, settings)
    with leases_kept(db_url, 60) as lease, connect(db_url) as conn:
        _, planned = store.work.lease_next(conn, [DocumentStatus.PENDING_INDEX], lease)
        assert sorted(planned.acl_labels) == ["legal", "staff"]
        narrowed = make_settings(sources=[{**source, "acl_labels": ["legal"]}])
        assert discover(db_url, narrowed.sources).relabelled == 1  # while the work is in hand
        index_document(conn, planned, settings, IndexStats())
    labels = {tuple(row[1]) for row in _index_rows(db)}
    assert labels == {("legal",)}


def test_a_run_of_two_document_steps_reports_both_and_builds_the_index(make_settings, db, tmp_path):
    from dagster import DagsterInstance

    from rag_pipeline.defs.runs import run_ingest

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for index in range(4):
        (corpus / f"note-{index}.md").write_text(port_note(index))
    settings = make_settings(sources=[{"name": "port", "root": str(corpus), "acl_labels": ["staff"]}],
                             execution={"steps": 2})
    with DagsterInstance.ephemeral() as instance:
        summary = run_ingest(settings, instance=instance)
    assert summary["success"], summary.get("errors")
    assert summary["parsed"] == 4 and summary["documents_indexed"] == 4
    steps = db.execute("SELECT step_key FROM run_outputs WHERE run_id = %s ORDER BY step_key",
                       (summary["run_id"],)).fetchall()
    assert [s for (s,) in steps if "work_documents" in s] == [
        "parsed_documents.work_documents_0", "parsed_documents.work_documents_1"]


def test_a_re_execution_counts_the_steps_it_skipped_from_the_run_it_re_executes(db):
    """Step reports of a run's lineage (the run, then the runs it re-executes): each step once, from the nearest
    run that ran it; other runs' reports are never counted."""
    from rag_pipeline import store

    store.run_outputs.store(db, "parent", "work_documents_0", "stats", {"parsed": 3})
    store.run_outputs.store(db, "parent", "work_documents_1", "stats", {"parsed": 4})
    store.run_outputs.store(db, "child", "work_documents_1", "stats", {"parsed": 5})  # re-ran the step that failed
    store.run_outputs.store(db, "other", "work_documents_0", "stats", {"parsed": 100})  # a refresh beside them
    assert store.run_outputs.of_run(db, ["child", "parent"], "stats") == [{"parsed": 3}, {"parsed": 5}]
    assert store.run_outputs.of_run(db, ["parent"], "stats") == [{"parsed": 3}, {"parsed": 4}]
    assert store.run_outputs.of_run(db, ["child"], "stats") == [{"parsed": 5}]

def test_the_cli_draws_a_bar_per_stage_from_the_progress_reports():
    from rag_pipeline.cli import _progress_bar

    with _progress_bar() as bars:
        parse = Reporter("parse and chunk", "pages", 1, lambda _: None)
        parse.report(done=5, left=15, units=40)
        parse.report(done=9, left=11, units=70)
        Reporter("index", "chunks", 1, lambda _: None).report(done=2, left=3, units=30)
        Reporter("nothing yet", "chunks", 1, lambda _: None).report(done=0, left=0, units=0)
    shown = {task.description: (task.completed, task.total, task.fields["work"]) for task in bars.tasks}
    # The bar counts documents; the units and their rate are named as what they are.
    assert shown["parse and chunk"][:2] == (9, 20)
    assert re.fullmatch(r"· 70 pages \([\d,.]+ pages/s\)", shown["parse and chunk"][2])
    assert shown["index"][:2] == (2, 5) and re.fullmatch(r"· 30 chunks \([\d,.]+ chunks/s\)", shown["index"][2])
    assert "nothing yet" not in shown  # no 0/0 bar


def test_parse_workers_and_the_embedder_share_the_cores_instead_of_each_taking_all():
    assert thread_budget(2, cores=2) == ThreadBudget(per_worker=1, embedder=1)  # the floor: one thread each
    assert thread_budget(3, cores=16) == ThreadBudget(per_worker=4, embedder=4)
    assert thread_budget(1, cores=8) == ThreadBudget(per_worker=4, embedder=4)
    assert thread_budget(3, configured_per_worker=2, cores=16) == ThreadBudget(per_worker=2, embedder=10)


def test_a_bounded_worker_builds_its_onnx_sessions_and_torch_with_that_many_threads():
    """In a process of its own, as a worker: the bound must reach the sessions the layout tier builds."""
    script = (
        "import torch\n"
        "from rag_pipeline.workers.threads import bound_compute_threads\n"
        "bound_compute_threads(1)\n"
        "from rag_pipeline.parsing import layout\n"
        "print(layout._layout_engine().session.session.get_session_options().intra_op_num_threads,"
        " layout._table_engine().table_structure.session.session.get_session_options().intra_op_num_threads,"
        " torch.get_num_threads())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-3:] == ["1", "1", "1"]


def test_a_steady_total_never_grows_and_is_never_below_what_is_done():
    reporter = Reporter("index", "chunks", 1, lambda line: None, steady_total=True)
    assert reporter.report(done=5, left=15, units=0).total == 20
    assert reporter.report(done=6, left=15, units=0).total == 20  # read a moment apart: counted twice, not grown
    assert reporter.report(done=12, left=5, units=0).total == 17
    assert reporter.report(done=18, left=0, units=0).total == 18
    assert reporter.report(done=19, left=0, units=0).total == 19  # more done than was known: the total follows
