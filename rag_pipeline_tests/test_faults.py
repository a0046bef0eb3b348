"""Faults: the ingest process killed (SIGKILL) mid-parse, mid-embed and mid-write, and the database restarted
under a running ingest. After the next run the index must equal a clean build of the same corpus: same chunk
ids and content hashes, same rows and labels, vectors equal, no duplicates, no orphans, nothing lost."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from rag_pipeline.store.database import EmbeddedPostgres, ensure_database, migrate
from rag_pipeline_tests.conftest import DOCUMENTS, assert_same_index, config_for_notes, snapshot


class IngestProcess:
    """`rag-pipeline ingest` in a process of its own, as the scheduler would start it."""

    def __init__(self, config: Path, dagster_url: str):
        env = dict(os.environ, RAG_CONFIG=str(config), RAG_DAGSTER_DATABASE_URL=dagster_url, HF_HUB_OFFLINE="1")
        env.pop("RAG_DATABASE_URL", None)
        env.pop("DAGSTER_HOME", None)  # the project's own instance, under the configuration's data_dir
        self.process = subprocess.Popen(
            [sys.executable, "-m", "rag_pipeline.cli", "ingest", "--json"], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True,
        )

    def kill_when(self, url: str, condition: Callable[[psycopg.Connection], bool], timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        with psycopg.connect(url, autocommit=True) as conn:
            while True:
                assert self.process.poll() is None, "ingest finished before the point to kill it at"
                assert time.monotonic() < deadline, "the point to kill at never came"
                if condition(conn):
                    os.killpg(self.process.pid, signal.SIGKILL)
                    self.process.wait(timeout=30)
                    return
                time.sleep(0.02)

    def finish(self, timeout: float = 300) -> tuple[int, str, str]:
        out, err = self.process.communicate(timeout=timeout)
        return self.process.returncode, out, err


def _statuses(conn: psycopg.Connection) -> dict[str, int]:
    return dict(conn.execute("SELECT status, count(*) FROM documents GROUP BY status").fetchall())


def mid_parse(conn: psycopg.Connection) -> bool:
    counts = _statuses(conn)
    return 0 < counts.get("pending_parse", 0) < DOCUMENTS and counts.get("pending_chunk", 0) > 0


def mid_embed(conn: psycopg.Connection) -> bool:
    """Vectors are being made while documents wait for them (parsing may still run beside: they overlap)."""
    counts = _statuses(conn)
    cached = conn.execute("SELECT count(*) FROM embedding_cache").fetchone()[0]
    return counts.get("pending_index", 0) > 0 and counts.get("indexed", 0) > 0 and cached > 0


def mid_write(conn: psycopg.Connection) -> bool:
    """A transaction of the ingest process is open and has written index rows."""
    return conn.execute(
        """SELECT count(*) > 0 FROM pg_stat_activity
           WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
             AND query ILIKE 'INSERT INTO "index_v%%'"""
    ).fetchone()[0]


@pytest.fixture
def crash_env(notes, pg_admin_url, template_url, tmp_path):
    suffix = tmp_path.name[-10:].replace("-", "_").lower()
    names = [f"crash_{suffix}", f"crash_dagster_{suffix}"]
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        for name in names:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE rag_test_template").format(sql.Identifier(names[0])))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(names[1])))
    url, dagster_url = (psycopg.conninfo.make_conninfo(pg_admin_url, dbname=n) for n in names)
    yield url, dagster_url, config_for_notes(tmp_path / "rag.yaml", url, notes)
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        for name in names:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_sigkill_mid_parse_mid_embed_and_mid_write_then_rerun_equals_a_clean_build(crash_env, clean_build):
    url, dagster_url, config = crash_env
    for point in (mid_parse, mid_embed, mid_write):
        IngestProcess(config, dagster_url).kill_when(url, point)
    code, out, err = IngestProcess(config, dagster_url).finish()
    assert code == 0, err[-3000:]
    assert json.loads(out)["success"]
    assert_same_index(snapshot(url), clean_build)


def test_database_restart_mid_run_fails_clearly_and_the_next_run_recovers(notes, clean_build, tmp_path):
    workdir = Path(tempfile.mkdtemp(prefix="ragpg-restart-"))  # short path: socket names are length-limited
    server = EmbeddedPostgres(workdir / "pg")
    server.start()
    try:
        ensure_database(server.url("postgres"), "rag")
        ensure_database(server.url("postgres"), "dagster")
        url = server.url("rag")
        migrate(url)
        config = config_for_notes(tmp_path / "rag.yaml", url, notes)
        run = IngestProcess(config, server.url("dagster"))
        with psycopg.connect(url, autocommit=True) as conn:
            deadline = time.monotonic() + 240
            while not mid_embed(conn):
                assert run.process.poll() is None and time.monotonic() < deadline
                time.sleep(0.02)
        server.stop()  # a fast shutdown: every session is terminated
        time.sleep(1)
        server.start()
        code, out, err = run.finish()
        assert code != 0
        summary = json.loads(out)
        assert not summary["success"]
        (error,) = summary["errors"]
        assert error.startswith("parsed_documents.work_documents: lost the database connection"), error

        code, out, err = IngestProcess(config, server.url("dagster")).finish()
        assert code == 0, err[-3000:]
        assert_same_index(snapshot(url), clean_build)
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def test_two_refreshes_at_once_share_the_work_and_leave_a_clean_index(crash_env, clean_build):
    url, dagster_url, config = crash_env
    first = IngestProcess(config, dagster_url)
    second = IngestProcess(config, dagster_url)
    results = [first.finish(), second.finish()]
    for code, _out, err in results:
        assert code == 0, err[-3000:]
    summaries = [json.loads(out) for _, out, _ in results]
    # The index is the one a single clean build makes; each document was parsed once and each input embedded once,
    # by whichever refresh reached it first, and each summary counts its own run's work (they once reported the
    # other run's counts, read from the shared upstream asset value: 114 to 122 embeddings for 117 inputs).
    assert_same_index(snapshot(url), clean_build)
    assert sum(s["parsed"] for s in summaries) == DOCUMENTS
    with psycopg.connect(url) as conn:
        cached = conn.execute("SELECT count(*) FROM embedding_cache").fetchone()[0]
    assert sum(s["vectors_embedded"] for s in summaries) == cached > 0
