"""Object-store sources at scale: what a listing, a scan, a first discover, a no-op refresh and a 1%-changed refresh
of a bucket cost against a real S3 server (SeaweedFS on 127.0.0.1, started here, data in a temporary folder).

The bucket holds N small Markdown objects under `all/<decile>/<group>/doc-NNNNNN.md`, so that `all/0/` is the
first 10% of them and `all/` is all of them. Measured:

1. listing alone (`list_objects`): time and listing requests, for the 10% prefix and for all N;
2. peak memory of a listing and of a whole scan (`scan_objects`), each in a fresh child process: peak RSS and the
   Python heap's peak (tracemalloc), 10% vs all N;
3. a first discover of all N (into a throwaway embedded PostgreSQL);
4. a no-op refresh (discover + process_pending): time, bytes downloaded (must be 0), ratio to the listing alone;
5. a 1%-changed refresh: objects and bytes downloaded against the changed objects' sizes, discover vs process.

Between 3 and 4 every document is marked indexed by SQL this benchmark executes (an UPDATE of the status and the
chunker version, then VACUUM ANALYZE): parsing and embedding N documents is not what this measures (bench.refresh
does that), and the refreshes only need a database that believes it is current. Peak RSS is the child's VmHWM:
ru_maxrss, shown beside it, can keep the parent's high-water mark across exec.

    .venv/bin/python -m bench.object_store --objects 100000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import yaml

from bench.common import WORDS, machine, throwaway_database
from rag_pipeline.config import Settings, SourceConfig, load_settings
from rag_pipeline.sources import kinds
from rag_pipeline.sources.folders import ScanReport
from rag_pipeline.sources.object_stores import StoreCounters, build_store, list_objects

BUCKET = "bench-docs"
SOURCE = "bench"
# The identity the pipeline reads with (read and list only), given to it through credentials_env as a deployment
# would. Set in os.environ before any parse worker starts: workers keep the environment they started with.
ID_VARIABLE, SECRET_VARIABLE = "BENCH_S3_READER_ID", "BENCH_S3_READER_SECRET"
READER_KEY, READER_SECRET = "bench-reader-key", "bench-reader-secret"
UPLOAD_BUDGET_SECONDS = 600.0  # the brief: if N objects take longer than ~10 minutes to upload, use fewer


# --- the bucket's contents --------------------------------------------------------------------------------------

def object_key(index: int, total: int) -> str:
    """`all/<decile>/<group of 1,000>/doc-NNNNNN.md`: the decile directory makes `all/0/` the first 10% (an
    object-store prefix is a directory to obstore: `all/00` would not match `all/000/...`)."""
    return f"all/{index * 10 // total}/{index // 1000:03d}/doc-{index:06d}.md"


def object_body(index: int, revision: int = 0) -> bytes:
    """100-300 bytes of Markdown, the same for the same (index, revision); a revision changes the content."""
    rng = random.Random(f"{index}:{revision}")  # str seeds are hashed (sha512): deterministic across runs
    target = rng.randint(100, 300)
    head = f"# Document {index}" + (f" (revision {revision})" if revision else "") + "\n\n"
    words: list[str] = []
    length = len(head) + 2  # the closing ".\n"
    while True:
        word = rng.choice(WORDS)
        if length + len(word) + 1 > target:
            break
        words.append(word)
        length += len(word) + 1
    return (head + " ".join(words).capitalize() + ".\n").encode()


async def _upload(store: Any, items: Iterable[tuple[str, bytes]], concurrency: int) -> int:
    """Put every (key, body) with at most `concurrency` requests in flight; returns the bytes written. A task is
    created only once a slot is free, so 100,000 objects never become 100,000 pending coroutines."""
    import obstore

    slots = asyncio.Semaphore(concurrency)
    failures: list[BaseException] = []
    running: set[asyncio.Task[None]] = set()
    written = 0

    async def put(key: str, body: bytes) -> None:
        try:
            await obstore.put_async(store, key, body)
        except Exception as exc:  # noqa: BLE001 - collected, raised once the uploads in flight have finished
            failures.append(exc)
        finally:
            slots.release()

    for key, body in items:
        await slots.acquire()
        if failures:
            slots.release()
            break
        task = asyncio.create_task(put(key, body))
        running.add(task)
        task.add_done_callback(running.discard)
        written += len(body)
    await asyncio.gather(*running)
    if failures:
        raise RuntimeError(f"{len(failures)} uploads failed; first: {failures[0]!r}")
    return written


def upload(store: Any, items: Iterable[tuple[str, bytes]], concurrency: int) -> tuple[int, float]:
    started = time.perf_counter()
    written = asyncio.run(_upload(store, items, concurrency))
    return written, time.perf_counter() - started


def fill_bucket(server: Any, wanted: int, concurrency: int) -> tuple[int, int, float]:
    """Upload the bucket; returns (objects, bytes, seconds). 2,000 objects go to a scratch bucket first: when
    `wanted` would take well over UPLOAD_BUDGET_SECONDS at that rate, the bucket gets fewer (and the run says so).
    The keys' layout depends on the total, hence the scratch bucket rather than a head start."""
    server.create_bucket(f"{BUCKET}-probe")
    probe = min(wanted, 2000)
    _, probe_seconds = upload(server.store(f"{BUCKET}-probe"),
                              ((object_key(i, wanted), object_body(i)) for i in range(probe)), concurrency)
    rate = probe / probe_seconds
    total = wanted
    if wanted / rate > UPLOAD_BUDGET_SECONDS * 1.1:
        total = max(1000, int(rate * UPLOAD_BUDGET_SECONDS) // 1000 * 1000)
        print(f"  {wanted:,} objects would take about {wanted / rate / 60:.0f} min to upload here "
              f"({rate:,.0f} objects/s); using {total:,}", flush=True)
    server.create_bucket(BUCKET)
    written, seconds = upload(server.store(BUCKET),  # the admin identity: the reader may not write
                              ((object_key(i, total), object_body(i)) for i in range(total)), concurrency)
    return total, written, seconds


# --- the source, as the pipeline configures it --------------------------------------------------------------------

def source_entry(endpoint: str, prefix: str) -> dict[str, Any]:
    """The source as a YAML file would give it: credentials through the variables credentials_env names."""
    return {"name": SOURCE, "root": f"s3://{BUCKET}/{prefix}/", "acl_labels": ["staff"],
            "endpoint_url": endpoint, "allow_http": True, "region": "us-east-1",
            "credentials_env": {"access_key_id": ID_VARIABLE, "secret_access_key": SECRET_VARIABLE}}


def timed_listing(entry: dict[str, Any]) -> tuple[float, StoreCounters]:
    """One full listing of the source's prefix, through the pipeline's own store and listing."""
    counters = StoreCounters()
    store = build_store(SourceConfig(**entry))
    started = time.perf_counter()
    for _ in list_objects(store, counters):
        pass
    return time.perf_counter() - started, counters


# --- memory, in a child process ---------------------------------------------------------------------------------

def _status_kib(field_name: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(f"{field_name}:"))


def child(what: str, entry: dict[str, Any], trace: bool) -> None:
    """Consume a listing or a scan of `entry` and print what it cost as one JSON line (the parent reads it)."""
    source = SourceConfig(**entry)
    consume: Callable[[], Iterator[Any]]
    counters = StoreCounters()
    if what == "list":
        store = build_store(source)
        consume = lambda: list_objects(store, counters)  # noqa: E731
    else:  # a folder or a bucket: the scan the discover stage runs
        consume = lambda: kinds.scan(source, ScanReport(), counters=counters)  # noqa: E731
    baseline_kib = _status_kib("VmHWM")  # interpreter, pipeline and obstore imported, nothing listed yet
    if trace:
        tracemalloc.start()
    started = time.perf_counter()
    items = sum(1 for _ in consume())
    seconds = time.perf_counter() - started
    heap_peak = tracemalloc.get_traced_memory()[1] if trace else 0
    print(json.dumps({
        "items": items, "seconds": seconds, "list_requests": counters.list_requests, "baseline_kib": baseline_kib,
        # VmHWM is this process's own high-water mark; ru_maxrss (KiB on Linux) may keep the parent's across exec.
        "vm_hwm_kib": _status_kib("VmHWM"), "ru_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "heap_peak_bytes": heap_peak}))


@dataclass
class Memory:
    items: int
    seconds: float
    baseline_mib: float  # peak RSS before the first listing request
    peak_mib: float  # VmHWM after the whole listing or scan
    ru_maxrss_mib: float
    heap_peak_mib: float  # tracemalloc, from a second run (tracing slows the run and adds its own memory)


def measure_memory(what: str, entry: dict[str, Any]) -> Memory:
    """Two fresh children: one for RSS (untraced), one for the Python heap's peak (traced). `entry` is a source's
    configuration (a folder's too, for a scan)."""
    runs = []
    for trace in (False, True):
        done = subprocess.run(
            [sys.executable, "-m", "bench.object_store", "--child", what, "--child-source", json.dumps(entry)]
            + (["--trace"] if trace else []), capture_output=True, text=True, env=os.environ.copy())
        if done.returncode != 0:
            raise SystemExit(f"child {what} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    plain, traced = runs
    mib = 1024.0
    return Memory(plain["items"], plain["seconds"], plain["baseline_kib"] / mib, plain["vm_hwm_kib"] / mib,
                  plain["ru_maxrss_kib"] / mib, traced["heap_peak_bytes"] / mib / mib)


# --- the pipeline's stages --------------------------------------------------------------------------------------

def write_settings(workdir: Path, db_url: str, entry: dict[str, Any]) -> Settings:
    path = workdir / "rag_pipeline.yaml"
    path.write_text(yaml.safe_dump({"database_url": db_url, "data_dir": str(workdir / "data"), "sources": [entry]}))
    return load_settings(path)


def quiet(_message: str) -> None:
    """The stages' progress callback: nothing printed inside the timings."""


def timed_call(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def mark_all_indexed(db_url: str, settings: Settings) -> int:
    # Bench-only shortcut, on purpose: the benchmark executes SQL itself. Parsing, chunking and embedding N
    # documents is what bench.refresh measures, not this; the refreshes below only need every document to read as
    # current. The chunker version must be the current one, or process_pending requeues every document for
    # chunking (store.queue.requeue_for_chunker) and the "no-op" refresh rechunks all N. content_hash stays NULL,
    # so a changed document is chunked and embedded again after its parse.
    from rag_pipeline.stages.chunk import current_chunker_version, sizing_model_location

    with psycopg.connect(db_url, autocommit=True) as conn:
        version = current_chunker_version(settings, sizing_model_location(conn, settings))
        marked = conn.execute("UPDATE documents SET status = 'indexed', chunker_version = %s", (version,)).rowcount
        # One UPDATE of every row leaves N dead tuples and statistics that still say "all pending": a database
        # that got here document by document, under autovacuum, has neither.
        conn.execute("VACUUM ANALYZE documents")
    return marked


def statuses(db_url: str) -> dict[str, int]:
    with psycopg.connect(db_url) as conn:
        return dict(conn.execute("SELECT status, count(*) FROM documents GROUP BY status ORDER BY 1").fetchall())


def requests_of(discover_stats: Any) -> str:
    per = discover_stats.per_source[SOURCE]
    return (f"list_requests={per['list_requests']}, sidecar_reads={per['sidecar_reads']}, "
            f"metadata_reads={per['metadata_reads']}")


# --- the run ----------------------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=100_000, help="objects in the bucket (at least 1,000)")
    parser.add_argument("--concurrency", type=int, default=64, help="uploads in flight at once")
    parser.add_argument("--repeat", type=int, default=3, help="listings timed per prefix (the median is shown)")
    parser.add_argument("--changed-share", type=float, default=0.01, help="share of objects rewritten for the "
                        "changed refresh")
    parser.add_argument("--child", choices=("list", "scan"), help=argparse.SUPPRESS)
    parser.add_argument("--child-source", help=argparse.SUPPRESS)
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, json.loads(args.child_source), args.trace)
        return
    if args.objects < 1000:
        parser.error("--objects: at least 1,000 (the 10% prefix is a tenth of them)")

    from rag_pipeline.embedding.embedders import get_embedder
    from rag_pipeline.stages.discover import discover
    from rag_pipeline.stages.process import process_pending
    from rag_pipeline_tests.object_servers import S3Identity, SeaweedS3Server

    os.environ[ID_VARIABLE], os.environ[SECRET_VARIABLE] = READER_KEY, READER_SECRET
    reader = S3Identity("bench-reader", READER_KEY, READER_SECRET, ("Read", "List"))
    began = time.perf_counter()
    rows: list[tuple[str, str]] = []  # the results table: (measurement, value)

    with throwaway_database() as database, SeaweedS3Server(database.workdir / "s3", identities=(reader,)) as s3:
        print(f"SeaweedFS on {s3.endpoint} (started in {s3.startup_seconds:.1f} s)", flush=True)

        # 1. The bucket. Context, not a result.
        total, uploaded_bytes, upload_seconds = fill_bucket(s3, args.objects, args.concurrency)
        print(f"upload: {total:,} objects, {uploaded_bytes:,} bytes in {upload_seconds:.1f} s "
              f"({total / upload_seconds:,.0f} objects/s, {args.concurrency} in flight)", flush=True)
        rows.append(("setup: upload of the bucket (context, not a result)",
                     ("" if total == args.objects else f"asked for {args.objects:,}, fewer fit ~10 min: ")
                     + f"{total:,} objects, {uploaded_bytes / 1e6:.1f} MB in {upload_seconds:.1f} s "
                     f"({total / upload_seconds:,.0f}/s, {args.concurrency} in flight)"))
        subset, everything = source_entry(s3.endpoint, "all/0"), source_entry(s3.endpoint, "all")

        # 2. Listing alone, through the pipeline's store and listing.
        listing: dict[str, tuple[float, StoreCounters]] = {}
        for label, entry in (("10%", subset), ("all", everything)):
            runs = [timed_listing(entry) for _ in range(args.repeat)]
            seconds = statistics.median(run[0] for run in runs)
            counters = runs[0][1]
            listing[label] = (seconds, counters)
            print(f"listing {label}: {counters.listed:,} objects, {counters.list_requests} requests, "
                  f"{seconds:.2f} s (median of {args.repeat}: {', '.join(f'{r[0]:.2f}' for r in runs)})", flush=True)
        (sub_s, sub_c), (all_s, all_c) = listing["10%"], listing["all"]
        rows.append((f"listing alone, 10% prefix ({sub_c.listed:,} objects), median of {args.repeat}",
                     f"{sub_s:.2f} s, {sub_c.list_requests} requests ({sub_c.listed / sub_s:,.0f} objects/s)"))
        rows.append((f"listing alone, all ({all_c.listed:,} objects), median of {args.repeat}",
                     f"{all_s:.2f} s, {all_c.list_requests} requests ({all_c.listed / all_s:,.0f} objects/s)"))

        # 3. Memory of a listing and of a scan, each in fresh child processes (before this process loads a model).
        for what, name in (("list", "listing"), ("scan", "scan")):
            small, large = measure_memory(what, subset), measure_memory(what, everything)
            for label, memory in (("10%", small), ("all", large)):
                print(f"{name} {label}: {memory.items:,} items in {memory.seconds:.2f} s, RSS {memory.baseline_mib:.0f}"
                      f" -> {memory.peak_mib:.0f} MiB (ru_maxrss {memory.ru_maxrss_mib:.0f} MiB), Python heap peak "
                      f"{memory.heap_peak_mib:.2f} MiB", flush=True)
            rows.append((f"{name} peak RSS (VmHWM), {small.items:,} vs {large.items:,} "
                         f"(before the first request: {small.baseline_mib:.0f} / {large.baseline_mib:.0f} MiB)",
                         f"{small.peak_mib:.0f} vs {large.peak_mib:.0f} MiB ({large.peak_mib / small.peak_mib:.2f}x); "
                         f"growth {small.peak_mib - small.baseline_mib:.0f} vs "
                         f"{large.peak_mib - large.baseline_mib:.0f} MiB"))
            rows.append((f"{name} ru_maxrss, {small.items:,} vs {large.items:,}",
                         f"{small.ru_maxrss_mib:.0f} vs {large.ru_maxrss_mib:.0f} MiB "
                         f"({large.ru_maxrss_mib / small.ru_maxrss_mib:.2f}x)"))
            rows.append((f"{name} Python heap peak (tracemalloc), {small.items:,} vs {large.items:,}",
                         f"{small.heap_peak_mib:.2f} vs {large.heap_peak_mib:.2f} MiB "
                         f"({large.heap_peak_mib / small.heap_peak_mib:.2f}x)"))
            if what == "scan":
                rows.append((f"scan time in the child (untraced), {small.items:,} vs {large.items:,}",
                             f"{small.seconds:.2f} vs {large.seconds:.2f} s"))

        # 4. First discover of all N.
        get_embedder("all-MiniLM-L6-v2")  # loaded outside the timings (the refreshes embed with it)
        db_url = database.create("bench_object_store")
        settings = write_settings(database.workdir, db_url, everything)
        first_s, first = timed_call(lambda: discover(db_url, settings.sources, progress=quiet))
        print(f"first discover: {first.documents_seen:,} seen, {first.new:,} new in {first_s:.1f} s "
              f"({requests_of(first)})", flush=True)
        rows.append((f"first discover of all ({first.documents_seen:,} seen, {first.new:,} new)",
                     f"{first_s:.1f} s; {requests_of(first)}"))
        marked = mark_all_indexed(db_url, settings)
        print(f"marked {marked:,} documents indexed (SQL UPDATE + VACUUM ANALYZE, bench only)", flush=True)

        # 5. No-op refresh: a discover that finds nothing new, then the process stage with nothing queued.
        noop_discover_s, noop = timed_call(lambda: discover(db_url, settings.sources, progress=quiet))
        noop_process_s, noop_process = timed_call(lambda: process_pending(db_url, settings, progress=quiet))
        noop_s = noop_discover_s + noop_process_s
        print(f"no-op refresh: discover {noop_discover_s:.1f} s (unchanged {noop.unchanged:,}, new {noop.new}, "
              f"changed {noop.changed}), process {noop_process_s:.1f} s, downloaded "
              f"{noop_process.parse.objects_downloaded} objects / {noop_process.parse.bytes_downloaded} bytes "
              f"({requests_of(noop)})", flush=True)
        rows.append(("no-op refresh: discover + process_pending",
                     f"{noop_s:.1f} s ({noop_discover_s:.1f} + {noop_process_s:.1f}); unchanged {noop.unchanged:,}, "
                     f"new {noop.new}, changed {noop.changed}; {requests_of(noop)}"))
        rows.append(("no-op refresh: objects / bytes downloaded (goal 0)",
                     f"{noop_process.parse.objects_downloaded} / {noop_process.parse.bytes_downloaded}"))
        rows.append(("no-op refresh: parsed / chunked / requeued for a new chunker / indexed (all 0: nothing queued)",
                     f"{noop_process.parse.parsed} / {noop_process.chunk.documents_chunked} / "
                     f"{noop_process.chunk.requeued_for_new_chunker} / {noop_process.index.documents_indexed}"))
        rows.append(("no-op refresh / listing alone (goal <= 2x)", f"{noop_s / all_s:.2f}x "
                     f"(discover alone {noop_discover_s / all_s:.2f}x)"))

        # 6. 1%-changed refresh: rewrite evenly spread objects with new content, then a real refresh of them.
        step = max(1, round(1 / args.changed_share))
        changed_bodies = {i: object_body(i, revision=1) for i in range(0, total, step)}
        expected_bytes = sum(len(body) for body in changed_bodies.values())
        upload(s3.store(BUCKET), ((object_key(i, total), body) for i, body in changed_bodies.items()),
               args.concurrency)
        changed_discover_s, changed = timed_call(lambda: discover(db_url, settings.sources, progress=quiet))
        changed_process_s, work = timed_call(lambda: process_pending(db_url, settings, progress=quiet))
        parse = work.parse
        print(f"1% changed: {len(changed_bodies):,} rewritten ({expected_bytes:,} bytes); discover "
              f"{changed_discover_s:.1f} s (changed {changed.changed:,}, unchanged {changed.unchanged:,}; "
              f"{requests_of(changed)}), process {changed_process_s:.1f} s (parsed {parse.parsed}, dead-lettered "
              f"{parse.dead_lettered}, downloaded {parse.objects_downloaded} objects / {parse.bytes_downloaded:,} "
              f"bytes; chunks {work.chunk.chunks_written}, embedded {work.index.vectors_embedded})", flush=True)
        after = statuses(db_url)
        rows.append((f"1% changed refresh: {len(changed_bodies):,} objects rewritten, discover + process_pending",
                     f"{changed_discover_s + changed_process_s:.1f} s ({changed_discover_s:.1f} discover + "
                     f"{changed_process_s:.1f} process); changed {changed.changed:,}, unchanged "
                     f"{changed.unchanged:,}; {requests_of(changed)}"))
        rows.append(("1% changed: objects downloaded / bytes downloaded / sum of the changed objects' sizes",
                     f"{parse.objects_downloaded:,} / {parse.bytes_downloaded:,} / {expected_bytes:,} "
                     f"({'equal' if parse.bytes_downloaded == expected_bytes else 'DIFFERENT'})"))
        rows.append(("1% changed: parsed / dead-lettered / chunks written / vectors embedded",
                     f"{parse.parsed:,} / {parse.dead_lettered} / {work.chunk.chunks_written:,} / "
                     f"{work.index.vectors_embedded:,}"))
        # The stages overlap (workers parse and chunk while this process embeds and indexes): not a sum.
        rows.append(("1% changed: stage seconds (overlapping): parse / chunk / index; per changed object",
                     f"{parse.seconds:.1f} / {work.chunk.seconds:.1f} / {work.index.seconds:.1f} s; "
                     f"{changed_process_s / max(1, len(changed_bodies)) * 1e3:.0f} ms"))
        rows.append(("documents by status afterwards", ", ".join(f"{k} {v:,}" for k, v in after.items())))

    wall = time.perf_counter() - began
    print(f"\nmachine: {machine()}")
    print(f"{total:,} objects of 100-300 bytes in SeaweedFS (S3, 127.0.0.1); total wall time {wall / 60:.1f} min")
    print("| measurement | value |")
    print("|---|---|")
    for measurement, value in rows:
        print(f"| {measurement} | {value} |")
    print("note: after the first discover every document was marked indexed by SQL this benchmark executes (UPDATE "
          "of status and chunker_version, then VACUUM ANALYZE; parsing and embedding all N is bench.refresh's "
          "subject). Peak RSS is the child's VmHWM; ru_maxrss is shown beside it. No timing is asserted.")


if __name__ == "__main__":
    main()
