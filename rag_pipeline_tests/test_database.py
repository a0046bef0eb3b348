import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from rag_pipeline import store
from rag_pipeline.domain import ids
from rag_pipeline.store.database import (
    SQL_DIR,
    DatabaseError,
    EmbeddedPostgres,
    connect,
    migrate,
    register_vector_types,
)
from rag_pipeline_tests.conftest import database_before, legacy_migrate, upgrade_legacy

SHIPPED = sorted(p.name for p in (SQL_DIR / "migrations").glob("[0-9][0-9][0-9]_*.sql"))


def test_migrations_apply_once_and_refuse_edits(db_url, tmp_path):
    with psycopg.connect(db_url) as conn:
        applied = [r[0] for r in conn.execute("SELECT version FROM schema_migrations").fetchall()]
    assert sorted(applied) == SHIPPED and SHIPPED[0] == "000_baseline.sql"
    assert migrate(db_url) == []  # already applied: nothing happens
    edited = tmp_path / "sql"
    shutil.copytree(SQL_DIR, edited)
    original = SQL_DIR / "migrations" / "000_baseline.sql"
    (edited / "migrations" / "000_baseline.sql").write_text(original.read_text() + "\n-- edited\n")
    with pytest.raises(DatabaseError, match="changed after it was applied"):
        migrate(db_url, edited)
    (edited / "migrations" / "000_baseline.sql").write_text(original.read_text())
    (edited / "migrations" / "900_extra.sql").write_text("CREATE TABLE extra_things (id int);")
    assert migrate(db_url, edited) == ["900_extra.sql"]
    assert migrate(db_url, edited) == []


def test_schema_has_pgvector_and_the_version_table_indexes(db):
    version = db.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()[0]
    assert tuple(int(p) for p in version.split(".")[:2]) >= (0, 8)
    with db.transaction():
        created = store.versions.ensure_active(db, ids.ModelIdentity("torch", "m", "sha256:m"), 8, "c1", "p1")
        again = store.versions.ensure_active(db, ids.ModelIdentity("torch", "m", "sha256:m"), 8, "c1", "p1")
    assert created.version_id == again.version_id and created.status == "active"
    indexes = dict(
        db.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s", (created.table_name,)).fetchall()
    )
    defs = " ".join(indexes.values())
    assert "USING hnsw (embedding halfvec_cosine_ops)" in defs
    assert "USING gin (acl_labels)" in defs and "tsv" not in defs
    column_type = db.execute(
        "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'embedding'",
        (created.table_name,),
    ).fetchone()[0]
    assert column_type == "halfvec(8)"
    # The alias view follows the active version.
    assert db.execute("SELECT count(*) FROM rag.indexed_chunks").fetchone()[0] == 0
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.execute(
            "INSERT INTO index_versions (table_name, embedding_model, dimensions, chunker_version, parser_version,"
            " status) VALUES ('x', 'm', 8, 'c', 'p', 'active')"
        )


def test_connections_read_and_write_pgvector_types_as_pgvectors_own_registration_does(db_url, pg_admin_url):
    """connect() registers pgvector's types in one query; what a connection reads and writes is what
    pgvector.psycopg.register_vector gives."""
    import numpy as np
    from pgvector import HalfVector, SparseVector, Vector
    from pgvector.psycopg import register_vector

    query = ("SELECT %s::vector, %s::halfvec, %s::sparsevec, '101'::bit(3), "
             "'[1,2]'::vector, '[3,4]'::halfvec, '{1:5}/2'::sparsevec")
    values = [np.array([1.5, 2.0], dtype=np.float32), HalfVector([0.5, 1.0]), SparseVector({0: 2.0}, 3)]
    with connect(db_url) as ours, connect(db_url, autocommit=True) as autocommitted, \
            psycopg.connect(db_url) as theirs:
        register_vector(theirs)
        for conn in (ours, autocommitted):
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE  # nothing left open
        reference = theirs.execute(query, values).fetchone()
        for conn in (ours, autocommitted):
            mine = conn.execute(query, values).fetchone()
            assert [type(v) for v in mine] == [type(v) for v in reference] == [
                Vector, HalfVector, SparseVector, str, Vector, HalfVector, SparseVector]
            assert [str(v) for v in mine] == [str(v) for v in reference]
    # A database without the extension yet (before the first migration) connects all the same.
    name = f"bare_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        bare = psycopg.conninfo.make_conninfo(pg_admin_url, dbname=name)
        with connect(bare) as conn:
            assert conn.execute("SELECT to_regtype('vector')").fetchone() == (None,)
            with pytest.raises(psycopg.ProgrammingError, match="vector type not found"):
                register_vector_types(conn, required=True)  # what the search service's pool asks
    finally:
        with psycopg.connect(pg_admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def test_embedded_server_lifecycle_through_the_cli():
    workdir = Path(tempfile.mkdtemp(prefix="ragdb-"))
    env = {"RAG_DATA_DIR": str(workdir), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    cli = [sys.executable, "-m", "rag_pipeline.cli"]
    try:
        status = subprocess.run([*cli, "db", "status"], env=env, capture_output=True, text=True, cwd=workdir)
        assert status.returncode == 1 and '"running": false' in status.stdout
        for _ in range(2):  # starting is idempotent
            started = subprocess.run([*cli, "db", "start"], env=env, capture_output=True, text=True, cwd=workdir)
            assert started.returncode == 0, started.stderr
        url = subprocess.run([*cli, "db", "url"], env=env, capture_output=True, text=True, cwd=workdir).stdout.strip()
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM schema_migrations").fetchone()[0] == len(SHIPPED)
        assert EmbeddedPostgres(workdir / "pg").is_running()
        stopped = subprocess.run([*cli, "db", "stop"], env=env, capture_output=True, text=True, cwd=workdir)
        assert stopped.stdout.strip() == "stopped"
        assert not EmbeddedPostgres(workdir / "pg").is_running()
    finally:
        EmbeddedPostgres(workdir / "pg").stop()
        shutil.rmtree(workdir, ignore_errors=True)


# A version table exactly as the previous release created it (rag_pipeline/store.py before the restructure).
PREVIOUS_VERSION_TABLE = """
CREATE TABLE index_v1 (
    chunk_id text PRIMARY KEY, owner_chunk_id text NOT NULL,
    doc_id text NOT NULL REFERENCES documents (doc_id) ON DELETE CASCADE, ordinal integer NOT NULL,
    text text NOT NULL, prefix text NOT NULL, section_path text NOT NULL, page_start integer NOT NULL,
    page_end integer NOT NULL, content_type text NOT NULL,
    acl_labels text[] NOT NULL CHECK (cardinality(acl_labels) > 0), embedding_input_sha text NOT NULL,
    embedding halfvec(8) NOT NULL,
    tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', prefix || ' ' || text)) STORED);
CREATE INDEX index_v1_hnsw ON index_v1 USING hnsw (embedding halfvec_cosine_ops);
CREATE INDEX index_v1_tsv ON index_v1 USING gin (tsv);
"""


def test_the_migrations_upgrade_a_database_the_previous_release_left(pg_admin_url, tmp_path):
    """A database migrated to 007 (a release before the SQL baseline; its migrations are test fixtures now) with
    documents in every state and an index version in use is upgraded in place, by the last legacy release and then
    this one: states kept (indexed ones queued for regrouping, 012), transitions enforced (008), and the existing rows
    searchable by BM25 and kept by its triggers from then on (009)."""
    from pgvector import HalfVector
    from psycopg import sql

    from rag_pipeline import store
    from rag_pipeline.store.database import connect, ensure_database

    name = f"upgrade_{tmp_path.name[-8:].replace('-', '_')}"
    ensure_database(pg_admin_url, name)
    url = psycopg.conninfo.make_conninfo(pg_admin_url, dbname=name)
    statuses = ("pending_parse", "pending_chunk", "pending_index", "indexed", "dead_letter", "held_no_labels")
    try:
        assert len(legacy_migrate(url, "008")) == 7
        with connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO sources (name, root, include_patterns, freshness_sla_seconds)"
                         " VALUES ('s', '/x', '{}', 60)")
            for number, status in enumerate(statuses):
                conn.execute("""INSERT INTO documents (doc_id, source, rel_path, fingerprint, size_bytes, modified_at,
                                                       acl_labels, status)
                                VALUES (%s, 's', %s, 'f', 1, now(), '{staff}', %s)""", (status, f"{number}.md", status))
            conn.execute("""INSERT INTO index_versions (table_name, embedding_model, dimensions, chunker_version,
                                                        parser_version, status)
                            VALUES ('index_v1', 'm', 8, 'c', 'p', 'active'), ('index_v2', 'm2', 8, 'c', 'p', 'ready')""")
            conn.execute("INSERT INTO index_alias (alias, version_id) VALUES ('active', 1)")
            conn.execute(PREVIOUS_VERSION_TABLE)
            for i, text in enumerate(["The warehouse robot charges at dock seven.", "Travel needs approval."]):
                conn.execute("""INSERT INTO index_v1 (chunk_id, owner_chunk_id, doc_id, ordinal, text, prefix,
                                    section_path, page_start, page_end, content_type, acl_labels, embedding_input_sha,
                                    embedding) VALUES (%s, %s, 'indexed', %s, %s, '', '', 1, 1, 'prose', '{staff}', 's', %s)""",
                             (f"c{i}", f"c{i}", i, text, HalfVector([0.1] * 8)))
        applied = upgrade_legacy(url)
        assert applied[0] == "008_status_transitions.sql" and "009_bm25.sql" in applied
        with connect(url, autocommit=True) as conn:
            states = dict(conn.execute("SELECT doc_id, status FROM documents").fetchall())
            assert states == {**{s: s for s in statuses}, "indexed": "pending_index"}
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute("UPDATE documents SET status = 'indexed' WHERE doc_id = 'pending_chunk'")
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute("UPDATE index_versions SET status = 'building' WHERE status = 'active'")
            version = store.versions.active_version(conn)
            assert store.search.bm25_ranking(conn, version, "robot dock", ("staff",), 5).chunk_ids == ["c0"]
            conn.execute(sql.SQL("DELETE FROM {} WHERE chunk_id = 'c0'").format(sql.Identifier("index_v1")))
            assert store.search.bm25_ranking(conn, version, "robot dock", ("staff",), 5).chunk_ids == []
            state = store.versions.bm25_state(conn, version)
            assert state.rows_counted == state.rows_weighted == 1
    finally:
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_the_work_unit_migration_upgrades_the_database_the_previous_main_left(pg_admin_url, tmp_path):
    """A database at legacy migration 015 with queued documents: after 016 they are leased one at a time, a lease
    whose session is gone is free at once, and pending_chunk may go to dead_letter (a chunk over its budget)."""

    from rag_pipeline import store
    from rag_pipeline.domain.status import DocumentStatus as D
    from rag_pipeline.store.database import connect

    with database_before(pg_admin_url, tmp_path, "016") as url:
        with connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO sources (name, root, include_patterns, freshness_sla_seconds)"
                         " VALUES ('s', '/x', '{}', 60)")
            for doc_id, status in (("a", "pending_parse"), ("b", "pending_chunk")):
                conn.execute("""INSERT INTO documents (doc_id, source, rel_path, fingerprint, size_bytes, modified_at,
                                                       acl_labels, status)
                                VALUES (%s, 's', %s, 'f', 1, now(), '{staff}', %s)""", (doc_id, f"{doc_id}.md", status))
        assert upgrade_legacy(url)[0] == "016_work_units.sql"
        queue = [D.PENDING_PARSE, D.PENDING_CHUNK]
        with connect(url) as keeper, connect(url) as worker:
            lease = store.work.open_lease(keeper, "test", 60)
            first = store.work.lease_next(worker, queue, lease)
            second = store.work.lease_next(worker, queue, lease)
            assert (first[0], first[1].doc_id, second[0], second[1].doc_id) == (
                D.PENDING_PARSE, "a", D.PENDING_CHUNK, "b")
            assert store.work.lease_next(worker, queue, lease) is None  # both held
        # The keeper's session ended: its leases are void without waiting for them to lapse.
        with connect(url) as conn:
            other = store.work.open_lease(conn, "other", 60)
            deadline = time.monotonic() + 10  # the ended session's backend exits a moment after its client
            while (taken := store.work.lease_next(conn, queue, other)) is None:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert taken[1].doc_id == "a"
            conn.execute("UPDATE documents SET status = 'dead_letter' WHERE doc_id = 'b'")
            conn.commit()


def test_a_lease_reads_its_queue_not_the_documents_already_worked(db_url):
    """The documents already worked come first in doc_id order (they were leased in it): leasing the next one must
    not read past them. It did, walking the primary key, so each lease cost more as a build went on."""
    from psycopg import sql

    from rag_pipeline import store
    from rag_pipeline.domain.status import DocumentStatus as D
    from rag_pipeline.store.database import connect

    with connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO sources (name, root, include_patterns, freshness_sla_seconds)"
                     " VALUES ('s', '/x', '{}', 60)")
        conn.execute("""INSERT INTO documents (doc_id, source, rel_path, fingerprint, size_bytes, modified_at,
                                               acl_labels, status)
                        SELECT format('d%s', lpad(i::text, 6, '0')), 's', format('%s.md', i), 'f', 1, now(),
                               '{staff}', CASE WHEN i <= 20000 THEN 'indexed' WHEN i % 2 = 0 THEN 'pending_chunk'
                                               ELSE 'pending_parse' END
                        FROM generate_series(1, 40000) AS i""")
        conn.execute("ANALYZE documents")
    queue = [D.PENDING_PARSE, D.PENDING_CHUNK]
    with connect(db_url) as keeper, connect(db_url) as worker:
        lease = store.work.open_lease(keeper, "test", 60)
        with worker.transaction(force_rollback=True):
            plan = worker.execute(sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) {}").format(store.work.LEASE_NEXT),
                                  (lease.owner, [str(s) for s in queue]), prepare=False).fetchone()[0]

        def rows_read(node: dict) -> float:
            own = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
            return own * node.get("Actual Loops", 1) + sum(rows_read(child) for child in node.get("Plans", []))

        assert rows_read(plan[0]["Plan"]) < 200  # the first of each queue, not the 20,000 indexed before them
        taken = [store.work.lease_next(worker, queue, lease) for _ in range(3)]
        assert [(status, doc.doc_id) for status, doc in taken] == [
            (D.PENDING_PARSE, "d020001"), (D.PENDING_CHUNK, "d020002"), (D.PENDING_PARSE, "d020003")]


def test_the_short_name_migration_renames_the_documents_the_previous_main_left(pg_admin_url, tmp_path):
    """A document stored at legacy migration 022 under a squashed capitalised file name gains the name terms of
    its leading letters ("MGM" from MGMRESORTS) in place; a lower-case path keeps the terms it had."""
    from rag_pipeline.store.database import connect

    paths = {"m": "filings/MGMRESORTS_2022_10K.pdf", "d": "manual/datatype-uuid.html"}
    with database_before(pg_admin_url, tmp_path, "023") as url:
        with connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO sources (name, root, include_patterns, freshness_sla_seconds)"
                         " VALUES ('s', '/x', '{}', 60)")
            for doc_id, path in paths.items():
                conn.execute("""INSERT INTO documents (doc_id, source, rel_path, fingerprint, size_bytes, modified_at,
                                                       acl_labels, status)
                                VALUES (%s, 's', %s, 'f', 1, now(), '{staff}', 'pending_parse')""", (doc_id, path))
            before = dict(conn.execute("SELECT doc_id, name_terms FROM documents").fetchall())
        assert upgrade_legacy(url)[0] == "023_periods_and_short_names.sql"
        with connect(url, autocommit=True) as conn:
            after = dict(conn.execute("SELECT doc_id, name_terms FROM documents").fetchall())
            mgm = conn.execute("SELECT rag_term_id('mgm')").fetchone()[0]
        assert mgm in after["m"] and mgm not in before["m"] and set(before["m"]) < set(after["m"])
        assert after["d"] == before["d"]


def test_the_file_identity_migration_upgrades_documents_the_previous_main_left(pg_admin_url, tmp_path):
    """Legacy migration 024 on a database at 023: existing documents gain a ref and no identity; a scan records the identity
    without re-queueing an unchanged document, and parsing refuses a document it has no identity for."""
    from rag_pipeline.config import SourceConfig
    from rag_pipeline.stages.discover import discover

    root = tmp_path / "docs"
    root.mkdir()
    (root / "a.md").write_text("# A\n\ntext")
    info = (root / "a.md").stat()
    with database_before(pg_admin_url, tmp_path, "024") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO sources (name, root, include_patterns, freshness_sla_seconds) "
                         "VALUES ('docs', %s, '{*.md}', 86400)", (str(root),))
            conn.execute(
                "INSERT INTO documents (doc_id, source, rel_path, fingerprint, size_bytes, modified_at, acl_labels, "
                "status) VALUES (%s, 'docs', 'a.md', %s, %s, now(), '{staff}', 'indexed')",
                (ids.doc_id("docs", "a.md"), f"{info.st_size}:{info.st_mtime_ns}", info.st_size))
        assert upgrade_legacy(url) == ["024_file_identity_and_refs.sql"]
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT ref IS NOT NULL, file_id FROM documents").fetchone() == (True, None)
            discover(url, [SourceConfig(name="docs", root=root, acl_labels=("staff",))])
            status, file_id, links = conn.execute("SELECT status, file_id, file_links FROM documents").fetchone()
            assert status == "indexed" and file_id == f"{info.st_dev}:{info.st_ino}" and links == 1


@contextmanager
def _database_at_b988343(pg_admin_url: str, tmp_path: Path) -> Iterator[str]:
    """A new database migrated as far as main went at b988343 (004), dropped afterwards: the upgrades' start."""
    with _database_at(pg_admin_url, tmp_path, "004_source_labelling.sql") as url:
        yield url


@contextmanager
def _database_at(pg_admin_url: str, tmp_path: Path, last: str) -> Iterator[str]:
    """A new database migrated up to and including migration `last` (with this checkout's functions), dropped
    afterwards."""
    from rag_pipeline.store.database import ensure_database

    previous = tmp_path / "sql"
    shutil.copytree(SQL_DIR, previous)
    for path in (previous / "migrations").glob("*.sql"):
        if path.name > last:
            path.unlink()
    name = f"upgrade_{uuid.uuid4().hex[:10]}"
    ensure_database(pg_admin_url, name)
    url = psycopg.conninfo.make_conninfo(pg_admin_url, dbname=name)
    try:
        assert migrate(url, previous)[-1] == last
        yield url
    finally:
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_the_scan_failure_migration_upgrades_the_sources_the_previous_main_left(pg_admin_url, tmp_path):
    """Migration 005 on a database at 004 (the schema main left at b988343): a registered source keeps its scans and
    gains no failure; a failed scan is kept on its row and fails staleness at once, a completed scan clears it."""
    from datetime import UTC, datetime

    from rag_pipeline.config import SourceConfig
    from rag_pipeline.lifecycle.checks import staleness
    from rag_pipeline.store.scans import ReconcileCounts

    with _database_at_b988343(pg_admin_url, tmp_path) as url:
        with connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO sources (name, root, include_patterns, freshness_sla_seconds, "
                         "last_scan_started_at, last_scan_completed_at) VALUES ('s', '/x', '{}', 86400, now(), now())")
        assert "005_source_scan_failures.sql" in migrate(url)
        source = SourceConfig(name="s", root=Path("/x"), acl_labels=("staff",))
        with connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT last_scan_failed_at, last_scan_failure FROM sources").fetchone() == (None, None)
            assert staleness(conn, [source]).passed
            store.sources.record_scan_failure(conn, source, "PermissionDenied: access denied")
            failed = staleness(conn, [source])
            assert not failed.passed and failed.error and "s: its latest scan failed (PermissionDenied" in failed.summary
            store.sources.record_scan(conn, "s", datetime.now(UTC), ReconcileCounts())
            assert staleness(conn, [source]).passed


def test_the_erased_documents_migration_upgrades_the_database_the_previous_main_left(pg_admin_url, tmp_path):
    """Migration 006 on a database at 004 (the schema main left at b988343) with documents and an erasure: the rows
    are kept, `held_erased` is a status with exactly the transitions status.py lists, and 'readmit' an audit scope."""
    from rag_pipeline.domain.status import DOCUMENT_TRANSITIONS

    with _database_at_b988343(pg_admin_url, tmp_path) as url:
        with connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO sources (name, root, include_patterns, freshness_sla_seconds) "
                         "VALUES ('s', '/x', '{}', 60)")
            for status in ("indexed", "held_bad_sidecar"):
                conn.execute("""INSERT INTO documents (doc_id, source, rel_path, fingerprint, size_bytes, modified_at,
                                                       acl_labels, status)
                                VALUES (%s, 's', %s, 'f', 1, now(), '{staff}', %s)""", (status, f"{status}.md", status))
            conn.execute("INSERT INTO erasures (subject, scope, removed) VALUES ('ab', 'document', '{}')")
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute("UPDATE documents SET status = 'held_erased' WHERE doc_id = 'indexed'")
        assert "006_erased_documents_held.sql" in migrate(url)
        with connect(url, autocommit=True) as conn:
            assert dict(conn.execute("SELECT doc_id, status FROM documents").fetchall()) == {
                "indexed": "indexed", "held_bad_sidecar": "held_bad_sidecar"}
            rows = {tuple(r) for r in conn.execute("SELECT from_status, to_status FROM document_status_transitions")}
            assert rows == {(str(a), str(b)) for a, targets in DOCUMENT_TRANSITIONS.items() for b in targets}
            conn.execute("UPDATE documents SET status = 'held_erased' WHERE doc_id IN ('indexed', 'held_bad_sidecar')")
            conn.execute("UPDATE documents SET status = 'pending_parse' WHERE doc_id = 'indexed'")
            with pytest.raises(psycopg.errors.CheckViolation):  # released to parsing or chunking only
                conn.execute("UPDATE documents SET status = 'indexed' WHERE doc_id = 'held_bad_sidecar'")
            conn.execute("INSERT INTO erasures (subject, scope, removed) VALUES ('ab', 'readmit', '{}')")
            assert [r[0] for r in conn.execute("SELECT scope FROM erasures ORDER BY id")] == ["document", "readmit"]


def test_the_document_identity_migration_upgrades_the_database_the_previous_main_left(pg_admin_url, tmp_path):
    """Migration 007 on a database at 006 (the schema main left at 124999c): documents keep their rows and names and
    gain an empty identity; once parsing writes one, the document is also named by it (its organisation, its
    initials, its fiscal year)."""
    with _database_at(pg_admin_url, tmp_path, "006_erased_documents_held.sql") as url:
        with connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO sources (name, root, include_patterns, freshness_sla_seconds) "
                         "VALUES ('s', '/x', '{}', 60)")
            conn.execute("""INSERT INTO documents (doc_id, source, rel_path, fingerprint, size_bytes, modified_at,
                                                   acl_labels, status, title)
                            VALUES ('d', 's', '3f9a1c77.pdf', 'f', 1, now(), '{staff}', 'indexed', 'Fleet review')""")
            names_before = conn.execute("SELECT name_terms FROM documents").fetchone()[0]
        assert "007_document_identity.sql" in migrate(url)
        with connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT identity, name_terms FROM documents").fetchone() == ({}, names_before)

            def named_by(words: str) -> bool:
                return conn.execute("SELECT name_terms @> rag.name_term_ids(%s) FROM documents", (words,)).fetchone()[0]

            assert not named_by("Harbourline")
            conn.execute("""UPDATE documents SET identity = '{"organisation": "Harbourline Marine Logistics Inc.",
                                                           "kind": "annual report", "year": 2022}'""")
            assert named_by("Harbourline") and named_by("HML") and named_by("FY2022") and named_by("Fleet review")
            # a sidecar's word is over the document's: the title column, and metadata keys
            conn.execute("""UPDATE documents SET metadata = '{"organisation": "Northwind", "year": "2021"}'""")
            identity = conn.execute("SELECT rag.document_identity(title, metadata, identity) FROM documents").fetchone()[0]
            assert (identity["organisation"], identity["year"], identity["title"]) == ("Northwind", 2021, "Fleet review")
            assert identity["found"] == {"organisation": "sidecar", "year": "sidecar", "title": "sidecar"}
            assert named_by("Northwind FY2021") and not named_by("Harbourline")


def test_the_picture_descriptions_migration_upgrades_the_database_the_previous_main_left(pg_admin_url, tmp_path):
    """Migration 008 on a database at 007 (the schema main left at 8e0cb58): documents are kept, and a description
    of one of their pictures is deleted with its document."""
    with _database_at(pg_admin_url, tmp_path, "007_document_identity.sql") as url:
        with connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO sources (name, root, include_patterns, freshness_sla_seconds) "
                         "VALUES ('s', '/x', '{}', 60)")
            conn.execute("""INSERT INTO documents (doc_id, source, rel_path, fingerprint, size_bytes, modified_at,
                                                   acl_labels, status)
                            VALUES ('d', 's', 'deck.pdf', 'f', 1, now(), '{staff}', 'indexed')""")
        assert "008_picture_descriptions.sql" in migrate(url)
        with connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT doc_id, status FROM documents").fetchall() == [("d", "indexed")]
            conn.execute("INSERT INTO picture_descriptions (doc_id, image_sha256, prompt_version, model, description)"
                         " VALUES ('d', 'a1', 'picture-v1', 'vlm', 'A bar chart.')")
            conn.execute("DELETE FROM documents WHERE doc_id = 'd'")
            assert conn.execute("SELECT count(*) FROM picture_descriptions").fetchone()[0] == 0


def test_the_previous_versions_migration_names_the_kept_version_previous(pg_admin_url, tmp_path):
    """Migration 009 on a database at 008: a version kept for rollback ("retired" with its table) is previous, one
    whose table was dropped stays retired, and the transitions follow the new names (a dropped version stays so)."""
    with _database_at(pg_admin_url, tmp_path, "008_picture_descriptions.sql") as url:
        with connect(url, autocommit=True) as conn:
            for version_id, status, dropped in ((1, "retired", True), (2, "retired", False), (3, "active", False)):
                conn.execute("""INSERT INTO index_versions (version_id, table_name, embedding_model, dimensions,
                                    chunker_version, parser_version, status, promoted_at, retired_at, dropped_at)
                                OVERRIDING SYSTEM VALUE VALUES (%s, %s, 'm', 384, 'c', 'p', %s, now(), now(),
                                    CASE WHEN %s THEN now() END)""",
                             (version_id, f"index_v{version_id}", status, dropped))
        assert "009_previous_versions.sql" in migrate(url)
        with connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT version_id, status FROM index_versions ORDER BY 1").fetchall() == [
                (1, "retired"), (2, "previous"), (3, "active")]
            with pytest.raises(psycopg.errors.CheckViolation, match="cannot go from retired to previous"):
                conn.execute("UPDATE index_versions SET status = 'previous' WHERE version_id = 1")
            conn.execute("UPDATE index_versions SET status = 'previous' WHERE version_id = 3")  # a promotion's step


def test_the_tsv_migration_drops_the_column_the_previous_main_left_and_keeps_the_rows(pg_admin_url, tmp_path):
    """Migration 010 on a database at 009 whose version tables carry `tsv` and its GIN index, as every version table
    main created until dd2f4a2 did: the column and its index are gone, every row stays, BM25 still finds it, and
    rows written afterwards are indexed by the triggers as before. A dropped version's table is not looked for."""
    from pgvector import HalfVector

    with _database_at(pg_admin_url, tmp_path, "009_previous_versions.sql") as url:
        with connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO sources (name, root, include_patterns, freshness_sla_seconds) "
                         "VALUES ('s', '/x', '{}', 60)")
            conn.execute("""INSERT INTO documents (doc_id, source, rel_path, fingerprint, size_bytes, modified_at,
                                                   acl_labels, status)
                            VALUES ('d', 's', 'd.md', 'f', 1, now(), '{staff}', 'indexed')""")
            version = store.versions.ensure_active(conn, ids.ModelIdentity("torch", "m", "sha256:m"), 8, "c", "p")
            table = sql.Identifier(version.table_name)
            conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN tsv tsvector GENERATED ALWAYS AS "
                                 "(to_tsvector('english', prefix || ' ' || text)) STORED").format(table))
            conn.execute(sql.SQL("CREATE INDEX {} ON {} USING gin (tsv)").format(
                sql.Identifier(f"{version.table_name}_tsv"), table))
            insert = sql.SQL("INSERT INTO {} (chunk_id, owner_chunk_id, doc_id, ordinal, text, prefix, section_path,"
                             " page_start, page_end, content_type, acl_labels, embedding_input_sha, embedding)"
                             " VALUES (%s, %s, 'd', %s, %s, '', '', 1, 1, 'prose', '{{staff}}', 's', %s)").format(table)
            conn.execute(insert, ("c0", "c0", 0, "the warehouse robot docks to charge", HalfVector([0.1] * 8)))
            conn.execute("""INSERT INTO index_versions (table_name, embedding_model, dimensions, chunker_version,
                                                        parser_version, status, dropped_at)
                            VALUES ('index_v99', 'm', 8, 'c', 'p', 'retired', now())""")
        assert "010_drop_unused_tsv.sql" in migrate(url)
        with connect(url, autocommit=True) as conn:
            columns = [r[0] for r in conn.execute("SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass "
                                                  "AND attnum > 0 AND NOT attisdropped", (version.table_name,))]
            assert "tsv" not in columns and "embedding" in columns
            assert conn.execute("SELECT to_regclass(%s)", (f"{version.table_name}_tsv",)).fetchone()[0] is None
            conn.execute(insert, ("c1", "c1", 1, "a second robot for the warehouse floor", HalfVector([0.2] * 8)))
            assert sorted(store.search.bm25_ranking(conn, version, "warehouse robot", ("staff",), 5).chunk_ids) == [
                "c0", "c1"]
