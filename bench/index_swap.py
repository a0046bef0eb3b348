"""A new index version at size: an embedding-model swap over an index that bench.refresh built and kept, with a
remote endpoint (a local stand-in serving hashed vectors in a process of its own, standing in for a GPU fleet),
so that what is measured is the pipeline's own cost of writing a version while the active one serves.

The build is what an operator runs: `rag-pipeline index build --model stand-in-768` in a process of its own (a
Dagster backfill of the version's shards, on the configuration's own Dagster instance). Measured:
- rows written into the new version, polled every `--poll` seconds: rows a second while its shards are written,
  and the whole build's wall time (the BM25 re-weight that ends it included);
- searches of the active version by an application in another process, paced at `--qps` (hybrid, the corpus's
  label, its queries embedded at an endpoint of their own): p50 / p95 / p99 for `--baseline` seconds before the
  build, and during it.

`--max-seconds` stops the build after that long (the rate is then of the rows written so far; the CLI is
terminated, so its Dagster run and backfill stay marked as started in the configuration's instance). The version
is retired afterwards whatever stopped the build, so the kept index can be swapped again.

    .venv/bin/python -m bench.refresh --sizes 30000 --embedding stand-in --workdir DIR
    .venv/bin/python -m bench.index_swap --workdir DIR --size 30000 [--max-seconds 720]
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import STAND_IN_MODELS, WORDS, kept_database, machine, server_settings, stand_in_endpoint
from bench.query_latency import percentile
from bench.refresh import SOURCE_LABELS, database_name, write_settings
from rag_pipeline import store
from rag_pipeline.config import load_settings
from rag_pipeline.domain.status import VersionStatus
from rag_pipeline.lifecycle.blue_green import retire
from rag_pipeline.store.database import connect

SWAP_MODEL = "stand-in-768"  # served by the stand-in (bench.common.STAND_IN_MODELS)


def search_load(config: str, qps: float, stop: Any, results: Any) -> None:
    """An application's searches of the active version, one every 1/qps seconds (fewer when one takes longer),
    until `stop` is set; puts [(started_at, seconds)] on `results`."""
    from rag_pipeline.retrieval.search import SearchOptions, search

    settings = load_settings(Path(config))
    options = SearchOptions.from_settings(settings)
    rng = random.Random(53)
    timings: list[tuple[float, float]] = []
    with connect(settings.database_url) as conn:
        search(conn, "warm up the connection and the query model", SOURCE_LABELS, options=options)
        conn.commit()
        due = time.time()
        while not stop.is_set():
            query = " ".join(rng.sample(WORDS, rng.randint(2, 4)))
            started = time.time()
            search(conn, query, SOURCE_LABELS, k=10, mode="hybrid", options=options)
            conn.commit()  # no snapshot held across searches (it would keep the build's dead rows alive)
            timings.append((started, time.time() - started))
            due = max(due + 1.0 / qps, time.time())
            stop.wait(max(0.0, due - time.time()))
    results.put(timings)


def summary(label: str, latencies: list[float]) -> str:
    if not latencies:
        return f"| {label} | 0 | | | |"
    ms = [value * 1000 for value in latencies]
    return (f"| {label} | {len(ms):,} | {percentile(ms, 0.5):.1f} ms | {percentile(ms, 0.95):.1f} ms | "
            f"{percentile(ms, 0.99):.1f} ms |")


def building_rows(db_url: str) -> tuple[int, int] | None:
    """(version id, rows) of the version being built, or None before it is registered."""
    with connect(db_url) as conn:
        versions = store.versions.index_versions(conn, (VersionStatus.BUILDING, VersionStatus.READY))
        return (versions[0].version_id, store.versions.row_count(conn, versions[0])) if versions else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, required=True, help="bench.refresh --workdir's folder")
    parser.add_argument("--size", type=int, required=True, help="the kept index's corpus size (documents)")
    parser.add_argument("--qps", type=float, default=5.0, help="the application's searches a second")
    parser.add_argument("--baseline", type=float, default=60.0, help="seconds of searches before the build")
    parser.add_argument("--poll", type=float, default=10.0, help="seconds between counts of the rows written")
    parser.add_argument("--max-seconds", type=float, help="stop the build after this long")
    args = parser.parse_args()
    with kept_database(args.workdir) as database, stand_in_endpoint() as endpoint, \
            stand_in_endpoint() as query_endpoint:
        if not database.exists(database_name(args.size)):
            raise SystemExit(f"no index for {args.size:,} documents in {args.workdir}: run bench.refresh --sizes "
                             f"{args.size} --embedding stand-in --workdir {args.workdir} first")
        db_url = database.open(database_name(args.size))
        source = {"name": "bench", "root": str(args.workdir / f"corpus-{args.size}"), "acl_labels": SOURCE_LABELS}
        settings = write_settings(database, args.size, db_url, source, {"backend": "remote", "endpoint": endpoint})
        # The application embeds its queries at an endpoint of its own: its latency is the database's and the
        # machine's, not a wait behind the build's batches at a shared stand-in (which encodes one batch at a time).
        application = write_settings(database, args.size, db_url, source,
                                     {"backend": "remote", "endpoint": query_endpoint}, name="application")
        with connect(db_url) as conn:
            active = store.versions.active_version(conn)
            active_rows = store.versions.row_count(conn, active)
            documents = conn.execute("SELECT count(*) FROM documents WHERE status = 'indexed'").fetchone()[0]
        if building_rows(db_url) is not None:
            raise SystemExit("a version is already being built in this index: retire it first")
        print(f"machine: {machine()}; {server_settings(database.admin_url)}", flush=True)
        print(f"active: {active.label} ({active.embedding_model}, {active_rows:,} rows, {documents:,} documents)",
              flush=True)

        context = multiprocessing.get_context("spawn")
        stop, results = context.Event(), context.Queue()
        searcher = context.Process(target=search_load, args=(str(application.config_file), args.qps, stop, results),
                                   daemon=True)
        searcher.start()
        progress: list[tuple[float, int]] = []  # (seconds since the build started, rows written)
        build, stopped, written, status = None, False, 0, "never registered"
        log_path = args.workdir / f"index-build-{args.size}.log"
        try:
            time.sleep(args.baseline)
            build_started = time.time()
            with log_path.open("w") as log:
                # `rag-pipeline index build`, from this checkout (`-m`, as this benchmark runs).
                build = subprocess.Popen([sys.executable, "-m", "rag_pipeline.cli", "--config",
                                          str(settings.config_file), "index", "build", "--model", SWAP_MODEL],
                                         stdout=log, stderr=subprocess.STDOUT)
                while True:
                    try:
                        build.wait(timeout=args.poll)
                        break
                    except subprocess.TimeoutExpired:
                        pass
                    counted = building_rows(db_url)
                    if counted is not None:
                        progress.append((time.time() - build_started, counted[1]))
                        print(f"  {progress[-1][0]:7.0f} s: {counted[1]:,} rows", flush=True)
                    if args.max_seconds and time.time() - build_started > args.max_seconds:
                        stopped = True  # the CLI's Dagster run and backfill are left as started
                        build.terminate()
                        try:
                            build.wait(timeout=30)
                        except subprocess.TimeoutExpired:  # a shard's transaction in flight: it is rolled back
                            build.kill()
                            build.wait()
                        break
            build_ended = time.time()
        finally:
            stop.set()
            if build is not None and build.poll() is None:
                build.kill()
                build.wait()
            # The version goes whatever stopped the build, so the kept index can be swapped again.
            with connect(db_url) as conn:
                versions = store.versions.index_versions(conn, (VersionStatus.BUILDING, VersionStatus.READY))
                if versions:
                    written, status = store.versions.row_count(conn, versions[0]), versions[0].status
                    with conn.transaction():
                        retire(conn, versions[0].version_id)
        timings = results.get(timeout=120)
        searcher.join(timeout=60)
    if build.returncode != 0 and not stopped:
        raise SystemExit(f"the build failed (exit code {build.returncode}); its output: {log_path}")

    seconds = build_ended - build_started
    writing = [(at, rows) for at, rows in progress if 0 < rows < written or (stopped and rows)]
    steady = (f"{(writing[-1][1] - writing[0][1]) / (writing[-1][0] - writing[0][0]):,.0f}" if len(writing) > 1
              else "n/a")
    before = [latency for started, latency in timings if started < build_started]
    during = [latency for started, latency in timings if build_started <= started < build_ended]
    if not before or not during:
        raise SystemExit(f"the application's searches stopped early: {len(before)} before the build, "
                         f"{len(during)} during it")
    print(f"\n| index | new version | rows written | build | rows/s over the build | rows/s while shards write |\n"
          f"|---|---|---|---|---|---|\n"
          f"| {documents:,} documents, {active_rows:,} rows ({active.embedding_model}) | {SWAP_MODEL} "
          f"({STAND_IN_MODELS[SWAP_MODEL]} dimensions), {status}{', stopped' if stopped else ''} | {written:,} | "
          f"{seconds:.0f} s | {written / seconds:,.0f} | {steady} |")
    print(f"\nsearches of the active version, hybrid, paced at {args.qps:g} a second:\n"
          "| when | searches | p50 | p95 | p99 |\n|---|---|---|---|---|")
    print(summary(f"before the build ({args.baseline:.0f} s)", before))
    print(summary(f"during the build ({seconds:.0f} s)", during))


if __name__ == "__main__":
    main()
