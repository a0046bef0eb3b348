"""Faults: the ingest process killed (SIGKILL) mid-parse, mid-embed and mid-write, and the database restarted
under a running ingest. After the next run the index must equal a clean build of the same corpus: same chunk
ids and content hashes, same rows and labels, vectors equal, no duplicates, no orphans, nothing lost."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psycopg
import pytest
import yaml
from dagster import DagsterInstance
from psycopg import sql

from rag_pipeline.config import load_settings
from rag_pipeline.defs.runs import run_ingest
from rag_pipeline.lifecycle import checks as health
from rag_pipeline.store.database import EmbeddedPostgres, connect, ensure_database, migrate

WORDS = ("glacier moraine valley survey ice meltwater snout discharge gauge altitude station snow depth crevasse "
         "firn ablation accumulation summit ridge basin lake shore temperature season winter summer").split()
DOCUMENTS = 36
BATCH = 6  # small batches: the stages interleave, so there is a "middle" to kill in


def _write_corpus(root: Path) -> None:
    rng = random.Random(11)
    for index in range(DOCUMENTS):
        paragraphs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(60, 140))).capitalize() + "."
                      for _ in range(rng.randint(2, 5))]
        sections = "\n\n".join(f"## Part {n + 1}\n\n{p}" for n, p in enumerate(paragraphs))
        (root / f"note-{index:03d}.md").write_text(f"# Field note {index}\n\n{sections}\n")


def _config(path: Path, db_url: str, corpus: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "database_url": db_url, "data_dir": str(path.parent / "data"), "batch_size": BATCH,
        "sources": [{"name": "notes", "root": str(corpus), "acl_labels": ["staff"]}],
    }))
    return path


def snapshot(url: str) -> dict:
    """Everything a clean build determines: documents, chunks, index rows with their vectors."""
    with connect(url) as conn:
        table = conn.execute("SELECT table_name FROM index_versions WHERE status = 'active'").fetchone()[0]
        rows = conn.execute(
            psycopg.sql.SQL("SELECT chunk_id, owner_chunk_id, doc_id, acl_labels, embedding_input_sha, embedding "
                            "FROM {} ORDER BY chunk_id").format(psycopg.sql.Identifier(table))
        ).fetchall()
        return {
            "documents": conn.execute("SELECT doc_id, status, content_hash, indexed_content_hash FROM documents "
                                      "ORDER BY doc_id").fetchall(),
            "chunks": conn.execute("SELECT chunk_id, doc_id, ordinal, content_hash, group_id FROM chunks "
                                   "ORDER BY chunk_id").fetchall(),
            "rows": [r[:5] for r in rows],
            "vectors": np.array([r[5].to_list() for r in rows], dtype=np.float32),
            "checks": {name: check(conn).passed for name, check in (
                ("deletion_replay", health.deletion_replay), ("acl_coverage", health.acl_coverage),
                ("index_drift", health.index_drift))},
        }


def assert_same_index(actual: dict, expected: dict) -> None:
    assert actual["documents"] == expected["documents"]
    assert actual["chunks"] == expected["chunks"]
    assert actual["rows"] == expected["rows"]  # chunk_id is the key: no duplicates by construction
    assert actual["vectors"].shape == expected["vectors"].shape
    assert np.abs(actual["vectors"] - expected["vectors"]).max() < 2e-3  # halfvec rounding of the same vector
    assert all(actual["checks"].values()), actual["checks"]


@pytest.fixture(scope="module")
def notes(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("notes")
    _write_corpus(root)
    return root


@pytest.fixture(scope="module")
def clean_build(notes, pg_admin_url, template_url, tmp_path_factory) -> dict:
    name = "faults_clean"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE rag_test_template").format(sql.Identifier(name)))
    url = psycopg.conninfo.make_conninfo(pg_admin_url, dbname=name)
    settings = load_settings(_config(tmp_path_factory.mktemp("clean") / "rag.yaml", url, notes))
    with DagsterInstance.ephemeral() as instance:
        assert run_ingest(settings, instance=instance)["success"]
    return snapshot(url)


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
    yield url, dagster_url, _config(tmp_path / "rag.yaml", url, notes)
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
        config = _config(tmp_path / "rag.yaml", url, notes)
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
