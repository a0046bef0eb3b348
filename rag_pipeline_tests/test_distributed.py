"""The ingest job on an existing distributed engine, Dagster's Dask executor: a scheduler and two worker processes
on 127.0.0.1, two document steps sharing one queue. The index equals a single-process build of the same corpus."""

from __future__ import annotations

import psycopg
import pytest
import yaml
from dagster import DagsterInstance
from psycopg import sql

from rag_pipeline.config import ConfigError, load_settings
from rag_pipeline.defs.runs import run_ingest
from rag_pipeline.store.database import connect, resolve_urls
from rag_pipeline_tests.conftest import DOCUMENTS, MODELS_DIR, assert_same_index, snapshot


@pytest.fixture
def index_db(pg_admin_url, template_url, tmp_path):
    name = f"dask_{tmp_path.name[-10:].replace('-', '_').lower()}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE rag_test_template").format(sql.Identifier(name)))
    yield psycopg.conninfo.make_conninfo(pg_admin_url, dbname=name)
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_a_dask_cluster_builds_the_index_one_process_builds(notes, clean_build, index_db, tmp_path,  # noqa: F811
                                                           monkeypatch):
    import dask
    from dask.distributed import LocalCluster

    config = tmp_path / "rag.yaml"
    # Worker processes inherit the environment they are started with: the configuration every one rebuilds the
    # job from, and (the worker pools start processes of their own) workers that are not daemonic.
    monkeypatch.setenv("RAG_CONFIG", str(config))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with dask.config.set({"distributed.worker.daemon": False}), LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None) as cluster:
        config.write_text(yaml.safe_dump({
            "database_url": index_db, "data_dir": str(tmp_path / "data"),
            # The models installed once per machine, as the clean build's: a worker that had to export the int8
            # model first would start its document work after the other worker had taken all of it.
            "embedding": {"models_dir": str(MODELS_DIR)},
            "sources": [{"name": "notes", "root": str(notes), "acl_labels": ["staff"]}],
            "execution": {"executor": "dask", "dask_address": cluster.scheduler_address, "steps": 2, "workers": 1},
        }))
        settings = load_settings(config)
        (tmp_path / "dagster_home").mkdir()
        with DagsterInstance.local_temp(str(tmp_path / "dagster_home")) as instance:
            summary = run_ingest(settings, instance=instance)
    assert summary["success"], summary.get("errors")
    assert_same_index(snapshot(index_db), clean_build)
    with connect(index_db) as conn:
        steps = conn.execute("SELECT step_key, value FROM run_outputs WHERE run_id = %s AND step_key LIKE %s",
                             (summary["run_id"], "%work_documents%")).fetchall()
    assert len(steps) == 2
    # The two steps shared one queue: every document parsed once, by one of them. Which worker takes how much is
    # the scheduler's: the small notes (about 3 s of work with int8 embeddings) can all go to the step that
    # starts first.
    assert sum(value["parse"]["parsed"] for _, value in steps) == DOCUMENTS, steps


def test_a_worker_without_a_database_url_refuses_to_start_a_private_index(tmp_path):
    config = tmp_path / "rag.yaml"
    config.write_text(yaml.safe_dump({
        "data_dir": str(tmp_path / "data"),
        "execution": {"executor": "dask", "dask_address": "tcp://127.0.0.1:8786"},
    }))
    settings = load_settings(config)
    assert settings.embedded_database == "never"
    with pytest.raises(ConfigError, match="database_url: not set, and embedded_database is never"):
        resolve_urls(settings)
    assert not (tmp_path / "data" / "pg").exists()  # nothing embedded was started
    with pytest.raises(ConfigError, match="execution.dask_address is required"):
        bad = tmp_path / "bad.yaml"
        bad.write_text(yaml.safe_dump({"execution": {"executor": "dask"}}))
        load_settings(bad)
