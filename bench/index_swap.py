"""A new index version at size: an embedding-model swap over an index that bench.refresh built and kept, with a
remote endpoint (a local stand-in serving hashed vectors in a process of its own, standing in for a GPU fleet),
so that what is measured is the pipeline's own cost of writing a version while the active one serves.

Measured:
- the build (`run_index_build`, the same backfill the CLI and the UI run): wall time, rows written, rows a second;
- searches of the active version by an application in another process, paced at `--qps` (hybrid, the corpus's
  label): p50 / p95 / p99 for `--baseline` seconds before the build, and for the whole build.

The version is retired afterwards, so the kept index can be swapped again.

    .venv/bin/python -m bench.refresh --sizes 100000 --embedding stand-in --workdir DIR
    .venv/bin/python -m bench.index_swap --workdir DIR --size 100000
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import time
from pathlib import Path
from typing import Any

from dagster import DagsterInstance

from bench.common import WORDS, kept_database, machine, server_settings, stand_in_endpoint
from bench.query_latency import percentile
from bench.refresh import SOURCE_LABELS, database_name, write_settings
from rag_pipeline import store
from rag_pipeline.config import load_settings
from rag_pipeline.defs.runs import run_index_build
from rag_pipeline.lifecycle.blue_green import retire
from rag_pipeline.store.database import connect

SWAP_MODEL = "stand-in-768"  # bench.common.STAND_IN_MODELS: served by the stand-in at 768 dimensions


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, required=True, help="bench.refresh --workdir's folder")
    parser.add_argument("--size", type=int, required=True, help="the kept index's corpus size (documents)")
    parser.add_argument("--qps", type=float, default=5.0, help="the application's searches a second")
    parser.add_argument("--baseline", type=float, default=60.0, help="seconds of searches before the build")
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
        print(f"machine: {machine()}; {server_settings(database.admin_url)}", flush=True)
        print(f"active: {active.label} ({active.embedding_model}, {active_rows:,} rows, {documents:,} documents)",
              flush=True)

        context = multiprocessing.get_context("spawn")
        stop, results = context.Event(), context.Queue()
        searcher = context.Process(target=search_load, args=(str(application.config_file), args.qps, stop, results),
                                   daemon=True)
        searcher.start()
        try:
            time.sleep(args.baseline)
            build_started = time.time()
            with DagsterInstance.ephemeral() as instance:
                built = run_index_build(settings, SWAP_MODEL, instance=instance)
            build_ended = time.time()
        finally:
            stop.set()
        timings = results.get(timeout=120)
        searcher.join(timeout=60)
        if not built["success"]:
            raise SystemExit(f"the build failed: {built}")
        with connect(db_url) as conn, conn.transaction():
            retire(conn, built["version"])

    seconds = build_ended - build_started
    before = [latency for started, latency in timings if started < build_started]
    during = [latency for started, latency in timings if build_started <= started < build_ended]
    if not before or not during:
        raise SystemExit(f"the application's searches stopped early: {len(before)} before the build, "
                         f"{len(during)} during it")
    print(f"\n| index | new version | rows written | build | rows/s |\n|---|---|---|---|---|\n"
          f"| {documents:,} documents, {active_rows:,} rows ({active.embedding_model}) | {built['model']} "
          f"({built['dimensions']} dimensions), {built['status']} | {built['rows']:,} | {seconds:.1f} s | "
          f"{built['rows'] / seconds:,.0f} |")
    print(f"\nsearches of the active version, hybrid, paced at {args.qps:g} a second:\n"
          "| when | searches | p50 | p95 | p99 |\n|---|---|---|---|---|")
    print(summary(f"before the build ({args.baseline:.0f} s)", before))
    print(summary(f"during the build ({seconds:.0f} s)", during))


if __name__ == "__main__":
    main()
