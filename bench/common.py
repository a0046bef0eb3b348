"""What every benchmark shares: a throwaway PostgreSQL, a generated corpus, the machine's description."""

from __future__ import annotations

import contextlib
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import psycopg  # noqa: E402

from rag_pipeline.store.database import EmbeddedPostgres, ensure_database, migrate  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
WORDS = (
    "robot warehouse battery shelf picking station safety policy revenue margin quarter customer order "
    "service contract welding arm floor marker camera navigation charging dock payload speed braking "
    "incident laptop password travel hotel allowance receipt expense onboarding badge induction"
).split()


def machine() -> str:
    cores = os.cpu_count()
    memory = ""
    with contextlib.suppress(OSError), open("/proc/meminfo") as info:
        memory = f", {int(info.readline().split()[1]) / 1024 / 1024:.0f} GiB RAM"
    return f"{platform.processor() or platform.machine()}, {cores} cores{memory}, Python {platform.python_version()}"


@dataclass
class Database:
    admin_url: str
    workdir: Path

    def create(self, name: str) -> str:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(psycopg.sql.Identifier(name)))
        return self.open(name)

    def exists(self, name: str) -> bool:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None

    def open(self, name: str) -> str:
        """The database `name`, created when missing and migrated (functions included) to this checkout."""
        ensure_database(self.admin_url, name)
        url = psycopg.conninfo.make_conninfo(self.admin_url, dbname=name)
        migrate(url)
        return url


@contextlib.contextmanager
def throwaway_database() -> Iterator[Database]:
    """An embedded PostgreSQL in a temporary folder (or RAG_BENCH_ADMIN_URL's server), removed afterwards."""
    workdir = Path(tempfile.mkdtemp(prefix="ragbench-"))
    server = None
    try:
        admin_url = os.environ.get("RAG_BENCH_ADMIN_URL")
        if not admin_url:
            server = EmbeddedPostgres(workdir / "pg")
            server.start()
            admin_url = server.url("postgres")
        yield Database(admin_url, workdir)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def kept_database(workdir: Path, server_settings: dict[str, str] | None = None) -> Iterator[Database]:
    """The embedded PostgreSQL in `workdir` (started, created the first time), kept with its databases after.
    `server_settings` (e.g. shared_buffers) are written with ALTER SYSTEM, the server restarted when they change;
    a setting left out goes back to its default."""
    workdir.mkdir(parents=True, exist_ok=True)
    server = EmbeddedPostgres(workdir / "pg")
    server.start()
    wanted = dict(server_settings or {})
    with psycopg.connect(server.url("postgres"), autocommit=True) as conn:
        held = dict(conn.execute("SELECT name, setting FROM pg_file_settings WHERE sourcefile LIKE "
                                 "'%%postgresql.auto.conf'").fetchall())
        for name in held.keys() - wanted.keys():
            conn.execute(psycopg.sql.SQL("ALTER SYSTEM RESET {}").format(psycopg.sql.Identifier(name)))
        for name, value in wanted.items():
            conn.execute(psycopg.sql.SQL("ALTER SYSTEM SET {} = {}").format(psycopg.sql.Identifier(name),
                                                                            psycopg.sql.Literal(value)))
    if held != wanted:
        server.stop()
        server.start()
    try:
        yield Database(server.url("postgres"), workdir)
    finally:
        server.stop()


def server_settings(admin_url: str, names: tuple[str, ...] = ("shared_buffers", "work_mem", "effective_cache_size",
                                                              "max_parallel_workers_per_gather")) -> str:
    """The server's settings that latency depends on, as one line."""
    with psycopg.connect(admin_url) as conn:
        return ", ".join(f"{n} {conn.execute(psycopg.sql.SQL('SHOW {}').format(psycopg.sql.Identifier(n))).fetchone()[0]}"
                         for n in names)


def paragraph(rng: random.Random, low: int = 40, high: int = 120) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))).capitalize() + "."


def generate_documents(folder: Path, count: int, seed: int = 7, suffix: str = ".md") -> list[Path]:
    """`count` documents of 2-5 sections of 1-4 paragraphs (about 3 chunks each), deterministic for a seed."""
    rng = random.Random(seed)
    paths = []
    for index in range(count):
        sections = []
        for section in range(rng.randint(2, 5)):
            paragraphs = [paragraph(rng) for _ in range(rng.randint(1, 4))]
            sections.append(f"## Section {section + 1}\n\n" + "\n\n".join(paragraphs))
        path = folder / f"generated/{index // 1000:03d}/doc-{index:05d}{suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# Generated document {index}\n\n" + "\n\n".join(sections) + "\n")
        paths.append(path)
    return paths


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


STAND_IN_MODELS = {"all-MiniLM-L6-v2": 384, "stand-in-768": 768}  # the default model's name, and one to swap to


@contextlib.contextmanager
def stand_in_endpoint() -> Iterator[str]:
    """rag_pipeline_tests.embedding_server's stand-in (hashed vectors, thousands of texts a second) serving
    STAND_IN_MODELS, in a process of its own (not under the pipeline's interpreter lock; on this machine's two cores
    it still takes some of their time, which a remote fleet would not); yields its base URL."""
    process = subprocess.Popen([sys.executable, "-m", "rag_pipeline_tests.embedding_server",
                                *(f"--stand-in={name}={size}" for name, size in STAND_IN_MODELS.items())],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        if not url:
            raise RuntimeError(f"the stand-in embedding server did not start (exit code {process.poll()})")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
