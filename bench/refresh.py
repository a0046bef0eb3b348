"""Incremental refresh: full build vs no-op refresh vs 1%-changed vs deletion-only refresh, at several corpus
sizes, to show that a refresh costs what changed, not what exists.

Runs the real `ingest` job (through Dagster, on an ephemeral instance) against a throwaway embedded
PostgreSQL (or RAG_BENCH_ADMIN_URL's server). The corpus is generated Markdown, about 5 chunks a document, in a
folder or (`--store s3`) in a bucket of a real S3 server (SeaweedFS on 127.0.0.1).

For each size it prints:
- the full build: wall time, documents and chunks a second, each stage's seconds as it reports them (they overlap:
  parsing streams into chunking and indexing);
- the no-op refresh split three ways, from the run's event log: the scan (the discover step; the listing or folder
  walk alone and the pipeline's scan alone, without the database, beside it), reconcile (the other steps: what is
  pending, what the index lacks, the asset checks), and Dagster (the run's wall time outside every step);
- the scan's memory: peak RSS of a fresh process that runs the pipeline's scan of the whole source;
- a 1%-changed and a 1%-deleted refresh, then the index checked against the corpus (every live document indexed
  and chunked and nothing else, each chunk served by its near-duplicate group's row, no stale row, no row of a
  deleted document, the changed ones re-chunked with their revision); a no-op that did any work, or an index that
  disagrees, stops the benchmark.

`--embedding stand-in` embeds through the remote backend against a local OpenAI-compatible server in its own
process that answers with feature-hashed vectors (thousands of texts a second): what is measured is the
pipeline's own cost, as with a GPU fleet behind an endpoint (the stand-in's own CPU, a few per cent, is taken
from the same two cores). Two CPU cores embed about 50 chunks a second with the real model, so 100,000
documents would take hours of embedding alone. `--workdir` keeps the server, corpus and index for bench.index_swap.

`--noop-only` measures this checkout's no-op refresh of an index an earlier run kept (`--workdir`), after
migrating it as an upgrade would: a change to the no-op's cost is measured on the same rows, without a new build.

    .venv/bin/python -m bench.refresh --sizes 300,3000
    .venv/bin/python -m bench.refresh --sizes 30000 --embedding stand-in [--store s3] [--workdir DIR]
    .venv/bin/python -m bench.refresh --sizes 30000 --embedding stand-in --workdir DIR --noop-only
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from pathlib import Path
from typing import Any

import yaml
from dagster import DagsterEventType, DagsterInstance
from psycopg import sql

from bench.common import generate_documents, kept_database, machine, stand_in_endpoint, throwaway_database
from bench.object_store import measure_memory
from rag_pipeline import store
from rag_pipeline.config import load_settings
from rag_pipeline.defs.runs import run_ingest
from rag_pipeline.domain import ids
from rag_pipeline.embedding.embedders import get_embedder
from rag_pipeline.store.database import connect

MODEL = "all-MiniLM-L6-v2"
SOURCE, SOURCE_LABELS = "bench", ["staff"]
REVISION = "A revised closing paragraph about the charging dock"  # what a changed document's last chunk says


class FolderCorpus:
    """The generated documents where they were written."""

    def __init__(self, root: Path, labels: list[str]):
        self.root = root
        self.entry: dict[str, Any] = {"name": SOURCE, "root": str(root), "acl_labels": labels}

    def listing_seconds(self) -> tuple[float, int]:
        """A walk of the folder alone (what the filesystem costs, nothing the pipeline adds)."""
        started = time.perf_counter()
        files = sum(len(names) for _, _, names in os.walk(self.root))
        return time.perf_counter() - started, files

    def rel_path(self, path: Path) -> str:
        """The document's path as the source names it (a bucket's source is rooted at `generated/`)."""
        return path.relative_to(self.root).as_posix()

    def write(self, path: Path, text: str) -> None:
        path.write_text(text)

    def delete(self, path: Path) -> None:
        path.unlink()


class BucketCorpus(FolderCorpus):
    """The generated documents uploaded to a bucket, under the same relative paths."""

    def __init__(self, root: Path, labels: list[str], server: Any, bucket: str, concurrency: int = 64):
        from bench.object_store import source_entry, upload

        super().__init__(root, labels)
        self.server, self.bucket = server, bucket
        server.create_bucket(bucket)
        paths = sorted(p for p in root.rglob("*") if p.is_file())
        written, seconds = upload(server.store(bucket), ((self.key(p), p.read_bytes()) for p in paths), concurrency)
        print(f"  upload: {len(paths):,} objects, {written:,} bytes in {seconds:.1f} s", flush=True)
        self.entry = {**source_entry(server.endpoint, "generated"), "root": f"s3://{bucket}/generated/",
                      "acl_labels": labels}

    def key(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def rel_path(self, path: Path) -> str:
        return self.key(path).removeprefix("generated/")

    def listing_seconds(self) -> tuple[float, int]:
        from bench.object_store import timed_listing

        seconds, counters = timed_listing(self.entry)
        return seconds, counters.listed

    def write(self, path: Path, text: str) -> None:
        import obstore

        obstore.put(self.server.store(self.bucket), self.key(path), text.encode())
        super().write(path, text)  # the folder stays the bucket's copy

    def delete(self, path: Path) -> None:
        import obstore

        obstore.delete(self.server.store(self.bucket), self.key(path))
        super().delete(path)


def index_agrees(db_url: str, generated: list[str], deleted: list[str], changed: list[str]) -> str:
    """What the active version holds after the refreshes, against the corpus: every live document indexed and
    chunked and nothing else, every chunk of theirs served by a row of its near-duplicate group, no row that no
    current chunk backs, no row of a deleted one, and the changed ones re-chunked with their revision. Raises when
    any differs."""
    live = {ids.doc_id(SOURCE, rel_path) for rel_path in set(generated) - set(deleted)}
    gone = [ids.doc_id(SOURCE, rel_path) for rel_path in deleted]
    revised = [ids.doc_id(SOURCE, rel_path) for rel_path in changed]
    with connect(db_url) as conn:
        table = sql.Identifier(store.versions.active_version(conn).table_name)
        indexed = {row[0] for row in conn.execute("SELECT doc_id FROM documents WHERE status = 'indexed'")}
        rows_of_deleted = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE doc_id = ANY(%s)").format(table),
                                       (gone,)).fetchone()[0]
        # A chunk is served by its group's row, which another document may own (the same revision line, a chunk
        # of its own in several changed documents, is one group).
        unserved = conn.execute(sql.SQL(
            """SELECT count(*) FROM chunks c JOIN documents d USING (doc_id)
               WHERE d.status = 'indexed'
                 AND NOT EXISTS (SELECT 1 FROM {} t WHERE t.chunk_id = coalesce(c.group_id, c.chunk_id))""").format(
            table)).fetchone()[0]
        # A row no current chunk backs (a changed document's old chunk, a deleted one's) is stale.
        stale = conn.execute(sql.SQL(
            """SELECT count(*) FROM {} t WHERE NOT EXISTS (
                   SELECT 1 FROM chunks c WHERE c.chunk_id = t.owner_chunk_id
                     AND coalesce(c.group_id, c.chunk_id) = t.chunk_id)""").format(table)).fetchone()[0]
        chunked = {row[0] for row in conn.execute("SELECT DISTINCT doc_id FROM chunks")}
        with_revision = {row[0] for row in conn.execute(
            "SELECT DISTINCT doc_id FROM chunks WHERE doc_id = ANY(%s) AND text LIKE %s", (revised, f"%{REVISION}%"))}
    found = (f"index against the corpus: {len(indexed):,} indexed of {len(live):,} live documents, "
             f"{len(live - indexed)} missing, {len(indexed - live)} not in the corpus, {len(live - chunked)} without "
             f"chunks, {unserved} chunks without their group's row, {stale} stale rows, {rows_of_deleted} rows of "
             f"deleted documents, {len(with_revision)} of {len(revised)} changed documents re-chunked with their "
             "revision")
    if (live != indexed or live - chunked or unserved or stale or rows_of_deleted
            or len(with_revision) != len(revised)):
        raise SystemExit(f"the index does not agree with the corpus: {found}")
    return found


def step_intervals(instance: DagsterInstance, run_id: str) -> dict[str, tuple[float, float]]:
    """Each step's (start, end) in the run's event log: the time Dagster ran our code, asset checks included."""
    starts: dict[str, float] = {}
    intervals: dict[str, tuple[float, float]] = {}
    for entry in instance.all_logs(run_id, of_type={DagsterEventType.STEP_START, DagsterEventType.STEP_SUCCESS,
                                                    DagsterEventType.STEP_FAILURE}):
        if entry.dagster_event.event_type == DagsterEventType.STEP_START:
            starts[entry.step_key] = entry.timestamp
        elif entry.step_key in starts:
            intervals[entry.step_key] = (starts[entry.step_key], entry.timestamp)
    return intervals


def covered(intervals: list[tuple[float, float]]) -> float:
    """Seconds inside at least one interval (steps may run at once)."""
    total, reached = 0.0, float("-inf")
    for start, end in sorted(intervals):
        total += max(0.0, end - max(start, reached))
        reached = max(reached, end)
    return total


def run(settings, instance, label: str) -> tuple[float, dict]:
    started = time.perf_counter()
    summary = run_ingest(settings, instance=instance, log_level="WARNING")
    elapsed = time.perf_counter() - started
    if not summary["success"]:
        raise SystemExit(f"{label}: run failed: {summary.get('errors')}")
    summary["steps"] = step_intervals(instance, summary["run_id"])
    stages = summary["seconds"]
    print(f"  {label:<22} {elapsed:8.2f} s  parsed={summary['parsed']} chunks={summary['chunks_written']} "
          f"embedded={summary['vectors_embedded']} reused={summary['vectors_reused']} deleted={summary['deleted']}; "
          f"stages {', '.join(f'{name} {seconds:.2f}' for name, seconds in stages.items())} s; steps "
          f"{', '.join(f'{key} {end - start:.2f}' for key, (start, end) in summary['steps'].items())} s", flush=True)
    return elapsed, summary


def database_name(size: int) -> str:
    return f"bench_refresh_{size}"


def write_settings(database, size: int, db_url: str, source: dict[str, Any], embedding: dict[str, Any],
                   name: str = "rag"):
    """The configuration of the index for `size` documents (bench.index_swap writes it again for a kept one)."""
    config = database.workdir / f"{name}-{size}.yaml"
    config.write_text(yaml.safe_dump({
        "database_url": db_url, "data_dir": str(database.workdir / f"data-{size}"),
        "embedding": {"model": MODEL, **embedding}, "sources": [source],
    }))
    return load_settings(config)


def measure(database, corpus: FolderCorpus, documents: list[Path], size: int,
            embedding: dict[str, Any]) -> dict[str, Any]:
    settings = write_settings(database, size, database.create(database_name(size)), corpus.entry, embedding)
    listing, listed = corpus.listing_seconds()
    scan = measure_memory("scan", corpus.entry)
    print(f"  listing alone: {listed:,} in {listing:.2f} s; the pipeline's scan alone: {scan.items:,} in "
          f"{scan.seconds:.2f} s, peak RSS {scan.baseline_mib:.0f} -> {scan.peak_mib:.0f} MiB, Python heap peak "
          f"{scan.heap_peak_mib:.1f} MiB", flush=True)
    with DagsterInstance.ephemeral() as instance:
        full, first = run(settings, instance, "full build")
        noop, idle = run(settings, instance, "no-op refresh")
        work = {name: idle[name] for name in ("parsed", "chunks_written", "vectors_embedded", "deleted")}
        if any(work.values()):
            raise SystemExit(f"the no-op refresh did work: {work}")
        step = max(1, len(documents) // max(1, size // 100))
        changed = documents[::step][: max(1, size // 100)]
        for path in changed:
            text = path.read_text().replace("## Section 1", "## Section 1 (revised)", 1)
            text += f"\n{REVISION}.\n"
            corpus.write(path, text)
        one_percent, _ = run(settings, instance, f"1% changed ({len(changed)})")
        deleted = documents[1::step][: max(1, size // 100)]
        for path in deleted:
            corpus.delete(path)
        deletion, _ = run(settings, instance, f"1% deleted ({len(deleted)})")
    agreement = index_agrees(settings.database_url, [corpus.rel_path(p) for p in documents],
                             [corpus.rel_path(p) for p in deleted], [corpus.rel_path(p) for p in changed])
    print(f"  {agreement}", flush=True)
    return {"documents": size, "chunks": first["chunks_written"], "full": full, "full_stages": first["seconds"],
            "noop": noop, "noop_steps": idle["steps"], "one_percent": one_percent, "deletion": deletion,
            "listing": listing, "scan": scan}


def measure_noop(database, corpus: FolderCorpus, size: int, embedding: dict[str, Any]) -> None:
    """This checkout's no-op refresh of a kept index (migrated first, as an upgrade is), split as measure() splits it."""
    if not database.exists(database_name(size)):
        raise SystemExit(f"no kept index for {size:,} documents in {database.workdir}: run without --noop-only first")
    started = time.perf_counter()
    db_url = database.open(database_name(size))  # migrated to this checkout
    print(f"  opened and migrated in {time.perf_counter() - started:.1f} s", flush=True)
    settings = write_settings(database, size, db_url, corpus.entry, embedding)
    with DagsterInstance.ephemeral() as instance:
        runs = [run(settings, instance, f"no-op refresh {n}") for n in (1, 2, 3)]
    for _, summary in runs:
        work = {name: summary[name] for name in ("parsed", "chunks_written", "vectors_embedded", "deleted")}
        if any(work.values()):
            raise SystemExit(f"the no-op refresh did work: {work}")
    print("\n| documents | no-op (best of 3) | scan (discover step) | reconcile (the other steps) | Dagster (wall - steps) "
          "| slowest steps |")
    print("|---|---|---|---|---|---|")
    elapsed, summary = min(runs, key=lambda r: r[0])
    steps = summary["steps"]
    discover = [interval for key, interval in steps.items() if key.endswith(DISCOVER_STEP)]
    others = [interval for key, interval in steps.items() if not key.endswith(DISCOVER_STEP)]
    slowest = sorted(((end - start, key) for key, (start, end) in steps.items()), reverse=True)[:3]
    print(f"| {size:,} | {elapsed:.2f} s | {covered(discover):.2f} s | {covered(others):.2f} s | "
          f"{elapsed - covered(list(steps.values())):.2f} s | "
          f"{', '.join(f'{key} {seconds:.2f} s' for seconds, key in slowest)} |")


def print_tables(results: list[dict[str, Any]], store: str, embedding: str) -> None:
    print(f"\nmachine: {machine()}; source: {store}; embedding: {embedding}")
    print("| documents | chunks | full build | docs/s | chunks/s | stage seconds as reported, overlapping "
          "(discover / parse / chunk / index) |")
    print("|---|---|---|---|---|---|")
    for r in results:
        stages = r["full_stages"]
        print(f"| {r['documents']:,} | {r['chunks']:,} | {r['full']:.1f} s | {r['documents'] / r['full']:.1f} | "
              f"{r['chunks'] / r['full']:.1f} | {' / '.join(f'{stages.get(s, 0.0):.1f}' for s in STAGES)} s |")
    print("\n| documents | no-op (of full) | scan: discover step / pipeline's scan alone / listing alone | "
          "reconcile (the other steps) | Dagster (wall - steps) | scan peak RSS (growth) | 1% changed (of full) | "
          "1% deleted (of full) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        steps = r["noop_steps"]
        discover = [interval for key, interval in steps.items() if key.endswith(DISCOVER_STEP)]
        others = [interval for key, interval in steps.items() if not key.endswith(DISCOVER_STEP)]
        dagster = r["noop"] - covered(list(steps.values()))
        scan = r["scan"]
        print(f"| {r['documents']:,} | {r['noop']:.2f} s ({r['noop'] / r['full']:.4f}) | {covered(discover):.2f} / "
              f"{scan.seconds:.2f} / {r['listing']:.2f} s | {covered(others):.2f} s | {dagster:.2f} s | "
              f"{scan.peak_mib:.0f} MiB (+{scan.peak_mib - scan.baseline_mib:.0f}) | "
              f"{r['one_percent']:.2f} s ({r['one_percent'] / r['full']:.4f}) | "
              f"{r['deletion']:.2f} s ({r['deletion'] / r['full']:.4f}) |")
    print("goals: no-op <= 0.02 of a full build and <= 15 s at 100,000 documents; 1% changed <= 0.05; "
          "scan memory flat in the corpus size")


STAGES = ("discover", "parse", "chunk", "index")
DISCOVER_STEP = "source_documents"


def s3_server(workdir: Path) -> Any:
    """A SeaweedFS server the pipeline reads with a read-and-list identity, given through credentials_env."""
    from bench.object_store import ID_VARIABLE, READER_KEY, READER_SECRET, SECRET_VARIABLE
    from rag_pipeline_tests.object_servers import S3Identity, SeaweedS3Server

    os.environ[ID_VARIABLE], os.environ[SECRET_VARIABLE] = READER_KEY, READER_SECRET
    return SeaweedS3Server(workdir / "s3", identities=(S3Identity("bench-reader", READER_KEY, READER_SECRET,
                                                                  ("Read", "List")),))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="300,3000", help="comma-separated corpus sizes (documents)")
    parser.add_argument("--store", choices=("folder", "s3"), default="folder", help="where the documents are")
    parser.add_argument("--embedding", choices=("local", "stand-in"), default="local",
                        help="local: the real model in this process; stand-in: a remote endpoint of hashed vectors")
    parser.add_argument("--workdir", type=Path, help="keep the server, the corpus and each size's index here "
                        "(bench.index_swap builds a new version of a kept one); default: a throwaway one")
    parser.add_argument("--noop-only", action="store_true",
                        help="with --workdir and the folder store: time this checkout's no-op refresh of each size's "
                             "kept index (migrated first), without a new build")
    args = parser.parse_args()
    if args.noop_only and (args.workdir is None or args.store != "folder"):
        parser.error("--noop-only needs --workdir and the folder store")
    results = []
    with contextlib.ExitStack() as stack:
        database = stack.enter_context(kept_database(args.workdir) if args.workdir else throwaway_database())
        embedding: dict[str, Any] = {}
        if args.embedding == "stand-in":
            embedding = {"backend": "remote", "endpoint": stack.enter_context(stand_in_endpoint())}
        else:
            get_embedder(MODEL)  # load the model outside the timings
        server = stack.enter_context(s3_server(database.workdir)) if args.store == "s3" else None
        for size in (int(s) for s in args.sizes.split(",")):
            print(f"{size:,} documents", flush=True)
            folder = database.workdir / f"corpus-{size}"
            if args.noop_only:
                measure_noop(database, FolderCorpus(folder, SOURCE_LABELS), size, embedding)
                continue
            documents = generate_documents(folder, size)
            corpus = (FolderCorpus(folder, SOURCE_LABELS) if server is None
                      else BucketCorpus(folder, SOURCE_LABELS, server, f"bench-refresh-{size}"))
            results.append(measure(database, corpus, documents, size, embedding))
    if results:
        print_tables(results, args.store, args.embedding)


if __name__ == "__main__":
    main()
