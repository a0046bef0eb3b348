"""Test fixtures on real components: an embedded PostgreSQL + pgvector started here, the real model.

One server per test session; every test that needs a database gets a fresh one cloned from a migrated
template (CREATE DATABASE ... TEMPLATE), which takes milliseconds.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
import yaml
from psycopg import sql

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from rag_pipeline.config import ENV_OVERRIDES, Settings, load_settings  # noqa: E402
from rag_pipeline.store.database import EmbeddedPostgres, connect, ensure_database, migrate  # noqa: E402

SAMPLE_CORPUS = Path(__file__).resolve().parent.parent / "sample_corpus"
MODELS_DIR = Path(__file__).resolve().parent.parent / ".models"  # where `make install` puts all-mpnet-base-v2
TORTURE = Path(__file__).resolve().parent.parent.parent / "shared" / "torture"
TEMPLATE_DB = "rag_test_template"
GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "sample_corpus.jsonl"


@pytest.fixture(autouse=True)
def _no_external_database(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests say which database they use; a developer's RAG_* environment must not leak in.
    for name in ("RAG_CONFIG", *ENV_OVERRIDES):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """Admin URL of the session's server: embedded, unless RAG_TEST_ADMIN_URL names an external one."""
    external = os.environ.get("RAG_TEST_ADMIN_URL")
    if external:
        yield external
        return
    workdir = Path(tempfile.mkdtemp(prefix="ragpg-"))  # short path: Unix socket names are length-limited
    server = EmbeddedPostgres(workdir / "pg")
    server.start()
    try:
        yield server.url("postgres")
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _with_database(admin_url: str, name: str) -> str:
    return psycopg.conninfo.make_conninfo(admin_url, dbname=name)


@contextmanager
def database_before(admin_url: str, workdir: Path, first_new: str) -> Iterator[str]:
    """A new database migrated up to (not including) migration `first_new`, e.g. "018": the schema an earlier
    release left, for upgrade tests. Dropped afterwards."""
    from rag_pipeline.store.database import MIGRATIONS_DIR

    name = f"before{first_new}_{uuid.uuid4().hex[:8]}"
    ensure_database(admin_url, name)
    previous = workdir / f"migrations_before_{first_new}"
    previous.mkdir()
    for path in MIGRATIONS_DIR.glob("[0-9][0-9][0-9]_*.sql"):
        if path.name < first_new:
            shutil.copy(path, previous / path.name)
    try:
        url = _with_database(admin_url, name)
        assert len(migrate(url, previous)) == int(first_new) - 1
        yield url
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="session")
def template_url(pg_admin_url: str) -> str:
    ensure_database(pg_admin_url, TEMPLATE_DB)
    url = _with_database(pg_admin_url, TEMPLATE_DB)
    migrate(url)
    return url


@pytest.fixture
def db_url(pg_admin_url: str, template_url: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(TEMPLATE_DB)))
    yield _with_database(pg_admin_url, name)
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def db(db_url: str) -> Iterator[psycopg.Connection]:
    conn = connect(db_url, autocommit=True)
    yield conn
    conn.close()


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """A private copy of the bundled sample corpus that tests may edit."""
    target = tmp_path / "corpus"
    shutil.copytree(SAMPLE_CORPUS, target)
    return target


@pytest.fixture
def make_settings(tmp_path: Path, db_url: str):
    """Write a real configuration file (as users do) and load it."""

    def make(sources: list[dict] | None = None, **overrides) -> Settings:
        config = {"database_url": db_url, "data_dir": str(tmp_path / "data"), "sources": sources or [],
                  "embedding": {"models_dir": str(MODELS_DIR)}}
        config.update(overrides)
        path = tmp_path / f"rag_pipeline_{uuid.uuid4().hex[:6]}.yaml"
        path.write_text(yaml.safe_dump(config))
        return load_settings(path)

    return make


def _write_settings(path: Path, db_url: str, corpus: Path, **overrides):
    config = {"database_url": db_url, "data_dir": str(path.parent / "data"),
              "sources": [{"name": "sample", "root": str(corpus), "acl_labels": ["staff"]}]}
    config.update(overrides)
    path.write_text(yaml.safe_dump(config))
    return load_settings(path)


@pytest.fixture(scope="session")
def ingested(pg_admin_url, template_url, tmp_path_factory):
    """A database holding a clean ingest of the sample corpus, used as a template."""
    from dagster import DagsterInstance

    from rag_pipeline.defs.runs import run_ingest

    workdir = tmp_path_factory.mktemp("checks")
    corpus = workdir / "corpus"
    shutil.copytree(SAMPLE_CORPUS, corpus)
    name = f"checks_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(TEMPLATE_DB)))
    url = psycopg.conninfo.make_conninfo(pg_admin_url, dbname=name)
    settings = _write_settings(workdir / "rag_pipeline.yaml", url, corpus)
    with DagsterInstance.ephemeral() as instance:
        summary = run_ingest(settings, instance=instance)
    assert summary["success"], summary.get("errors")
    yield name, corpus
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def clone(ingested, pg_admin_url, tmp_path):
    """A private copy of the ingested database, its settings, and an open autocommit connection."""
    template, corpus = ingested
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template)))
    url = psycopg.conninfo.make_conninfo(pg_admin_url, dbname=name)
    settings = _write_settings(
        tmp_path / "rag_pipeline.yaml", url, corpus,
        checks={"golden_set": str(GOLDEN), "golden_labels": ["staff"], "max_dead_letter_share": 0.2},
    )
    conn = connect(url, autocommit=True)
    yield conn, settings
    conn.close()
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
