"""Query latency of the three search modes on a large index, at several sizes: p50/p95/p99 unfiltered and for
callers whose labels reach 20% and 2% of the rows, under 1 and 8 concurrent clients; whether the results are
right at that size (no row outside the caller's labels, the BM25 list against an exhaustive scorer, HNSW recall);
the storage each structure costs and how long each took to build; and, with --churn, what ten refresh cycles of
10% churn do to size and latency.

    .venv/bin/python -m bench.query_latency [--sizes 100000,300000,1000000] [--vocabularies zipf,stress]
                                            [--modes sparse,dense,hybrid] [--clients 1,8] [--churn 10]
                                            [--workdir DIR]

Latencies include the query embedding (dense and hybrid) and return the full k. With --workdir the embedded
server and each size's database are kept there and reused by the next run with the same size and vocabulary (a
1,000,000-chunk index takes about 16 minutes to load here): what it measures then is the ranking of the code
checked out, on the same rows. Printed as Markdown tables.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from dataclasses import replace
from pathlib import Path

import psycopg
from pgvector import HalfVector
from psycopg import sql

from bench.common import WORDS, Database, kept_database, machine, server_settings, throwaway_database
from bench.synthetic import COMMON_LABEL, RARE_LABEL, TEAM_LABEL, ZipfText, load_index, synthetic_vectors
from rag_pipeline import store
from rag_pipeline.config import Settings
from rag_pipeline.embedding.embedders import get_embedder
from rag_pipeline.retrieval.search import SearchOptions, plan, search
from rag_pipeline.store.database import connect

FILTERS = (("none", [COMMON_LABEL, TEAM_LABEL, RARE_LABEL]), ("20% labels", [TEAM_LABEL]), ("2% labels", [RARE_LABEL]))
AS_THE_SERVICE = SearchOptions(light_query_model=False)  # the full query model, as `rag-pipeline serve` keeps it
CHECKED_QUERIES = 20  # per filter, for the exhaustive BM25 scorer and exact nearest neighbours


def zipf_queries(zipf: ZipfText, count: int) -> list[str]:
    """The Zipfian vocabulary's queries, the same on every run (bench.bm25_paths asks them too)."""
    rng = random.Random(5)
    return [zipf.query(rng) for _ in range(count)]


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


class Cell:
    """One (mode, filter, clients) measurement: per-request latencies and what came back."""

    def __init__(self, latencies: list[float], returned: list[int], seconds: float):
        self.latencies, self.returned, self.seconds = latencies, returned, seconds

    def p(self, share: float) -> float:
        return percentile(self.latencies, share)

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.seconds


def run_clients(url: str, queries: list[str], labels: list[str], mode: str, k: int, clients: int,
                hits_seen: list[tuple[str, list[str]]]) -> Cell:
    """`clients` threads, each with its own connection, taking the queries in turn; the first query of each
    thread is a warm-up, and the clock starts once every client has connected and warmed up. Hits are collected
    for the ACL check."""
    pending = iter(range(len(queries)))
    lock = threading.Lock()
    ready = threading.Barrier(clients + 1)
    latencies: list[float] = []
    returned: list[int] = []

    def client() -> None:
        with connect(url) as conn:
            try:
                search(conn, queries[0], labels, k=k, mode=mode, options=AS_THE_SERVICE)
            finally:
                ready.wait()
            while True:
                with lock:
                    n = next(pending, None)
                if n is None:
                    return
                started = time.perf_counter()
                hits = search(conn, queries[n], labels, k=k, mode=mode, options=AS_THE_SERVICE)
                elapsed = (time.perf_counter() - started) * 1000
                with lock:
                    latencies.append(elapsed)
                    returned.append(len(hits))
                    hits_seen.append((mode, [h.chunk_id for h in hits]))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    ready.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    if len(latencies) != len(queries):
        raise SystemExit(f"{mode} with {clients} clients: {len(queries) - len(latencies)} searches failed")
    return Cell(latencies, returned, time.perf_counter() - started)


def prewarm(url: str, version) -> tuple[float, float]:
    """Read the version's search structures into shared_buffers with pg_prewarm, as a serving database holds them
    (pg_prewarm's autoprewarm restores them after a restart): the table and its indexes, the HNSW graph, the BM25
    impact index, weight vectors, term-set index and counters. (The postings' heap and key are read by writes, not
    searches.) Returns (MB read, seconds)."""
    table = version.table_name
    started = time.perf_counter()
    with connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
        relations = [r[0] for r in conn.execute(
            """SELECT c.oid FROM pg_class c WHERE c.relname = ANY(%s)
               UNION SELECT i.indexrelid FROM pg_index i WHERE i.indrelid = ANY(
                   SELECT c.oid FROM pg_class c WHERE c.relname = ANY(%s))""",
            ([table, f"{table}_bm25docs", f"{table}_bm25_df", f"{table}_bm25_totals", f"{table}_postings_impact"],
             [table, f"{table}_bm25docs", f"{table}_bm25_df", f"{table}_bm25_totals"])).fetchall()]
        blocks = sum(conn.execute("SELECT pg_prewarm(%s)", (oid,)).fetchone()[0] for oid in relations)
    return blocks * 8192 / 2**20, time.perf_counter() - started


def measure(url: str, queries: list[str], modes: list[str], k: int, clients: list[int],
            version) -> tuple[dict[tuple[str, str, int], Cell], dict[str, int]]:
    """(mode, filter, clients) -> Cell; and the ACL check: rows returned outside each filter's labels (must be 0)."""
    results, outside = {}, {}
    with connect(url) as conn:
        for query in queries[:10]:  # warm the caches and the model
            for mode in modes:
                search(conn, query, FILTERS[0][1], k=k, mode=mode, options=AS_THE_SERVICE)
    for name, labels in FILTERS:
        seen: list[tuple[str, list[str]]] = []
        for mode in modes:
            for count in clients:
                results[(mode, name, count)] = run_clients(url, queries, labels, mode, k, count, seen)
        with connect(url) as conn:
            returned_ids = sorted({chunk for _, ids in seen for chunk in ids})
            outside[name] = conn.execute(sql.SQL(
                "SELECT count(*) FROM {} WHERE chunk_id = ANY(%s) AND NOT acl_labels && %s").format(
                    sql.Identifier(version.table_name)), (returned_ids, labels)).fetchone()[0]
    return results, outside


def bm25_against_oracle(conn: psycopg.Connection, version, queries: list[str], k: int) -> dict[str, tuple[int, int]]:
    """Per filter: (queries whose BM25 list equals an exhaustive scorer's, queries checked). The scorer reads every
    posting of every query term (no impact order, no pruning) and computes each weight from tf and the row's length
    as the textbook formula does; the ranking's top k must have the same scores in the same order (within single
    precision)."""
    table = version.table_name
    settings = Settings().retrieval.bm25
    agree: dict[str, tuple[int, int]] = {}
    for name, labels in FILTERS:
        same = 0
        for query in queries:
            ranked = conn.execute(
                "SELECT chunk_id, score FROM rag.bm25_ranking(%s, %s, %s, %s, %s, %s)",
                (version.version_id, query, labels, k, settings.depth, settings.max_query_terms)).fetchall()
            oracle = conn.execute(sql.SQL("""
                WITH q AS (SELECT term_id, idf FROM rag.query_terms(%s, %s, %s)),
                     params AS (SELECT k1, b, avgdl FROM {params}),
                     scored AS (
                         SELECT p.lexical_id,
                                sum(q.idf * rag_bm25_weight(p.tf, d.len, params.avgdl, params.k1, params.b)) AS score
                         FROM q JOIN {postings} p USING (term_id) JOIN {docs} d USING (lexical_id), params
                         GROUP BY p.lexical_id)
                SELECT t.chunk_id, s.score FROM scored s JOIN {table} t USING (lexical_id)
                WHERE t.acl_labels && %s ORDER BY s.score DESC, t.chunk_id LIMIT %s""").format(
                    params=sql.Identifier(f"{table}_bm25_params"), postings=sql.Identifier(f"{table}_postings"),
                    docs=sql.Identifier(f"{table}_bm25docs"), table=sql.Identifier(table)),
                (version.version_id, query, settings.max_query_terms, labels, k)).fetchall()
            # pgvector sums the ranking's scores in single precision, the scorer here in double
            same += len(ranked) == len(oracle) and all(
                abs(float(a) - float(b)) <= 1e-5 * max(1.0, abs(float(b))) for (_, a), (_, b) in zip(ranked, oracle, strict=True))
        agree[name] = (same, len(queries))
    return agree


def dense_recall(conn: psycopg.Connection, version, queries: list[str], k: int,
                 ef_search: int | None) -> dict[str, tuple[float, float]]:
    """Per filter: the dense list's recall@k against the exact k nearest rows the caller may read, and how much
    lower the cosine similarity of its k-th hit is than the exact k-th's (mean over the queries)."""
    table = sql.Identifier(version.table_name)
    options = replace(AS_THE_SERVICE, ef_search=ef_search)
    measured = {}
    for name, labels in FILTERS:
        recall, gap = [], []
        for query in queries:
            vector = plan(query, labels, k=k, mode="dense", version=version, options=options).vector
            got = [h.chunk_id for h in search(conn, query, labels, k=k, mode="dense", options=options)]
            exact = conn.execute(sql.SQL(
                "SELECT chunk_id, 1 - (embedding <=> %s) FROM {} WHERE acl_labels && %s"
                " ORDER BY (embedding <=> %s) + 0 LIMIT %s").format(table), (vector, labels, vector, k)).fetchall()
            kth = conn.execute(sql.SQL("SELECT min(1 - (embedding <=> %s)) FROM {} WHERE chunk_id = ANY(%s)").format(
                table), (vector, got)).fetchone()[0]
            recall.append(len(set(got) & {chunk for chunk, _ in exact}) / max(1, len(exact)))
            gap.append(exact[-1][1] - kth)
        measured[name] = (statistics.fmean(recall), statistics.fmean(gap))
    return measured


def storage(conn, version) -> dict[str, int]:
    """Bytes per structure: the table with its B-trees, the HNSW index, the BM25 postings, weights and counters."""
    def size(expression: str, name: str) -> int:
        return conn.execute(sql.SQL("SELECT {}(%s::regclass)").format(sql.SQL(expression)), (name,)).fetchone()[0]

    table = version.table_name
    term_sets = (size("pg_relation_size", f"{table}_bm25docs_terms") if conn.execute(
        "SELECT to_regclass(%s)", (f"{table}_bm25docs_terms",)).fetchone()[0] else 0)
    return {
        "halfvec HNSW index": size("pg_relation_size", f"{table}_hnsw"),
        "rows (heap, TOAST, B-trees, GIN)": size("pg_total_relation_size", table) - size("pg_relation_size", f"{table}_hnsw"),
        "BM25 postings (+ 2 indexes)": size("pg_total_relation_size", f"{table}_postings"),
        "BM25 weight vectors (sparsevec)": size("pg_total_relation_size", f"{table}_bm25docs") - term_sets,
        "BM25 term-set index (GIN)": term_sets,
        "BM25 counters (df, totals)": size("pg_total_relation_size", f"{table}_bm25_df")
        + size("pg_total_relation_size", f"{table}_bm25_totals"),
    }


def churn(conn, version, texts: list[str], vectors, cycle: int, share: float = 0.1) -> None:
    """Replace `share` of the documents as a refresh does: each changed document's rows deleted and its new rows
    inserted in one transaction, through the triggers (BM25), with new texts and vectors drawn from the corpus."""
    table = sql.Identifier(version.table_name)
    rng = random.Random(cycle)
    documents = [r[0] for r in conn.execute(sql.SQL(
        "SELECT doc_id FROM {} GROUP BY doc_id ORDER BY doc_id").format(table)).fetchall()]
    conn.commit()
    for doc_id in rng.sample(documents, int(len(documents) * share)):
        with conn.transaction(), conn.cursor() as cur:
            count = cur.execute(sql.SQL("DELETE FROM {} WHERE doc_id = %s").format(table), (doc_id,)).rowcount
            for ordinal in range(count):
                n = rng.randrange(len(texts))
                chunk_id = f"churn{cycle}-{doc_id}-{ordinal}"
                cur.execute(sql.SQL(
                    "INSERT INTO {} (chunk_id, owner_chunk_id, doc_id, ordinal, text, prefix, section_path, page_start,"
                    " page_end, content_type, acl_labels, embedding_input_sha, embedding)"
                    " SELECT %s, %s, %s, %s, %s, '', '', 1, 1, 'prose', d.acl_labels, %s, %s FROM documents d"
                    " WHERE d.doc_id = %s").format(table),
                    (chunk_id, chunk_id, doc_id, ordinal, texts[n], chunk_id, HalfVector(vectors[n]), doc_id))


def corpus(vocabulary: str, size: int, zipf: ZipfText) -> tuple[list[str], object]:
    texts, vectors = synthetic_vectors(size, passages=2000)
    if vocabulary == "zipf":
        text_rng = random.Random(9)
        texts = [zipf.text(text_rng) for _ in range(size)]
    return texts, vectors


def loaded(database: Database, vocabulary: str, size: int, zipf: ZipfText, reuse: bool):
    """The size's database with its index: reused when `reuse` and it already holds `size` rows, else loaded."""
    name = f"bench_latency_{vocabulary}_{size}"
    if reuse and database.exists(name):
        url = database.open(name)
        with connect(url) as conn:
            version = store.versions.active_version(conn)
            # an index loaded before one of FILTERS' labels existed would measure an empty caller: loaded again
            if (version is not None and store.versions.row_count(conn, version) == size
                    and all(conn.execute("SELECT rag.label_rows(%s, %s)", (version.version_id, labels)).fetchone()[0]
                            for _, labels in FILTERS)):
                print(f"{vocabulary} {size:,}: reusing {name}", flush=True)
                return url, version, None, None
    url = database.create(name)
    texts, vectors = corpus(vocabulary, size, zipf)
    with connect(url) as conn:
        version, timings = load_index(conn, texts, vectors)
    print(f"{vocabulary} {size:,}: loaded in {sum(timings.values()):.0f} s "
          + ", ".join(f"{key} {value:.0f}" for key, value in timings.items()), flush=True)
    return url, version, timings, (texts, vectors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100000,300000", help="comma-separated chunk counts (e.g. add 1000000)")
    parser.add_argument("--vocabularies", default="zipf,stress")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("-k", type=int, default=10)
    parser.add_argument("--modes", default="sparse,dense,hybrid")
    parser.add_argument("--clients", default="1,8", help="comma-separated numbers of concurrent clients")
    parser.add_argument("--churn", type=int, default=0, help="refresh cycles of 10%% churn at the first size")
    parser.add_argument("--workdir", type=Path, help="keep the server and each size's index here, reuse them")
    parser.add_argument("--no-checks", action="store_true",
                        help="latencies only: skip the exhaustive BM25 and exact nearest-neighbour checks")
    parser.add_argument("--prewarm", action="store_true",
                        help="read each size's search structures into shared_buffers before measuring (pg_prewarm)")
    parser.add_argument("--server-setting", action="append", default=[], metavar="NAME=VALUE",
                        help="with --workdir: a server setting (e.g. shared_buffers=6GB), restarting it; repeatable")
    args = parser.parse_args()
    if args.server_setting and not args.workdir:
        parser.error("--server-setting needs --workdir (a kept server)")
    modes = args.modes.split(",")
    clients = [int(c) for c in args.clients.split(",")]
    sizes = [int(s) for s in args.sizes.split(",")]
    embedder = get_embedder("all-MiniLM-L6-v2")
    embed_ms = []
    for word in WORDS:
        started = time.perf_counter()
        embedder.embed_query(f"{word} policy")
        embed_ms.append((time.perf_counter() - started) * 1000)
    print(f"machine: {machine()}; query embedding alone: p50 {statistics.median(embed_ms):.1f} ms (included below)",
          flush=True)
    zipf = ZipfText()
    rows_out, checks_out, sizes_out = [], [], []
    p95: dict[tuple[str, str, str, int, int], float] = {}
    server = (kept_database(args.workdir, dict(s.split("=", 1) for s in args.server_setting)) if args.workdir
              else throwaway_database())
    with server as database:
        print(f"server: {server_settings(database.admin_url)}", flush=True)
        for vocabulary in args.vocabularies.split(","):
            rng = random.Random(5)
            if vocabulary == "zipf":
                queries = zipf_queries(zipf, args.queries)
            else:
                queries = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 6))) for _ in range(args.queries)]
            for size in sizes:
                url, version, timings, data = loaded(database, vocabulary, size, zipf, args.workdir is not None)
                if args.prewarm:
                    megabytes, seconds = prewarm(url, version)
                    print(f"{vocabulary} {size:,}: {megabytes:,.0f} MB read into shared_buffers in {seconds:.0f} s",
                          flush=True)
                results, outside = measure(url, queries, modes, args.k, clients, version)
                for (mode, name, count), cell in results.items():
                    p95[(vocabulary, mode, name, count, size)] = cell.p(0.95)
                    rows_out.append(f"| {vocabulary} | {size:,} | {mode} | {name} | {count} | {cell.p(0.5):.1f} | "
                                    f"{cell.p(0.95):.1f} | {cell.p(0.99):.1f} | {cell.throughput:.1f} | "
                                    f"{statistics.fmean(cell.returned):.1f} |")
                with connect(url) as conn:
                    measured = storage(conn, version)
                    if not args.no_checks:
                        agree = bm25_against_oracle(conn, version, queries[:CHECKED_QUERIES], args.k)
                        recall = {ef: dense_recall(conn, version, queries[:CHECKED_QUERIES], args.k, ef)
                                  for ef in (None, 400)}
                for name, _ in FILTERS if not args.no_checks else ():
                    checks_out.append(f"| {vocabulary} | {size:,} | {name} | {outside[name]} | "
                                      f"{agree[name][0]} of {agree[name][1]} | {recall[None][name][0]:.3f} / "
                                      f"{recall[400][name][0]:.3f} | {recall[None][name][1]:.4f} / "
                                      f"{recall[400][name][1]:.4f} |")
                print(f"{vocabulary} {size:,}: measured", flush=True)
                sizes_out.append((vocabulary, size, measured, timings))
                if args.churn and size == sizes[0] and vocabulary == "zipf" and data:
                    report_churn(url, version, data, queries, modes, args.k, args.churn, results, measured)
    print(f"\n{args.queries} queries per cell, k={args.k}; ms; throughput in searches/s")
    print("| vocabulary | chunks | mode | caller labels | clients | p50 | p95 | p99 | throughput | mean hits |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows_out))
    if len(sizes) > 1:
        print("\np95 growth between consecutive sizes (goal <= 1.5x from 300,000 to 1,000,000)")
        print("| vocabulary | mode | caller labels | clients | " + " | ".join(
            f"{a:,} -> {b:,}" for a, b in zip(sizes, sizes[1:], strict=False)) + " |")
        print("|---|---|---|---|" + "---|" * (len(sizes) - 1))
        for vocabulary, mode, name, count, size in list(p95):
            if size == sizes[0]:
                ratios = [p95.get((vocabulary, mode, name, count, b), float("nan"))
                          / p95.get((vocabulary, mode, name, count, a), float("nan")) for a, b in zip(sizes, sizes[1:], strict=False)]
                print(f"| {vocabulary} | {mode} | {name} | {count} | " + " | ".join(f"{r:.2f}" for r in ratios) + " |")
    print(f"\ncorrect at size: rows outside the caller's labels among every hit returned (must be 0); the BM25 list's "
          f"top {args.k} against an exhaustive scorer (same scores, same order); the dense list against the exact "
          f"{args.k} nearest rows the caller may read, at the default ef_search and at 400: recall@{args.k}, and how "
          f"much lower the k-th hit's cosine similarity is; {CHECKED_QUERIES} queries each")
    print("| vocabulary | chunks | caller labels | rows outside labels | BM25 = exhaustive | dense recall (default / 400)"
          " | k-th similarity below exact (default / 400) |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(checks_out))
    print("\nstorage (MB; per 100,000 chunks in brackets) and build times (s; a reused index has none)")
    names = list(sizes_out[0][2])
    print("| vocabulary | chunks | " + " | ".join(names) + " | all | bulk load | HNSW | BM25 postings |")
    print("|---|---|" + "---|" * (len(names) + 4))
    for vocabulary, size, measured, timings in sizes_out:
        cells = " | ".join(f"{measured[n] / 2**20:,.0f} ({measured[n] / 2**20 * 100_000 / size:,.0f})" for n in names)
        built = " | ".join(f"{timings[key]:.0f}" if timings else "–"
                           for key in ("copy_rows_s", "build_hnsw_s", "build_bm25_s"))
        print(f"| {vocabulary} | {size:,} | {cells} | {sum(measured.values()) / 2**20:,.0f} | {built} |")


def report_churn(url: str, version, data, queries: list[str], modes: list[str], k: int, cycles: int,
                 results: dict, sizes: dict) -> None:
    texts, vectors = data
    with connect(url) as conn:
        started, vacuumed = time.perf_counter(), 0
        for cycle in range(cycles):
            churn(conn, version, texts, vectors, cycle)
            conn.autocommit = True  # what the index stage does after each refresh's writes
            vacuumed += len(store.versions.vacuum_churned(conn, version, Settings().execution.vacuum_dead_share))
            conn.autocommit = False
        churn_seconds = time.perf_counter() - started
        after_sizes = storage(conn, version)
    after, _ = measure(url, queries, modes, k, [1], version)
    print(f"\n{cycles} cycles of 10% churn ({churn_seconds:.0f} s; {vacuumed} tables vacuumed "
          "by the refresh policy, execution.vacuum_dead_share):")
    print("| mode | caller labels | p95 before | p95 after | ratio |\n|---|---|---|---|---|")
    for key, cell in results.items():
        if key in after:
            print(f"| {key[0]} | {key[1]} | {cell.p(0.95):.1f} | {after[key].p(0.95):.1f} | "
                  f"{after[key].p(0.95) / cell.p(0.95):.2f} |")
    print("| structure | MB before | MB after | ratio |\n|---|---|---|---|")
    for name, before in sizes.items():
        print(f"| {name} | {before / 2**20:.0f} | {after_sizes[name] / 2**20:.0f} | "
              f"{after_sizes[name] / max(1, before):.2f} |")
    total_before, total_after = sum(sizes.values()), sum(after_sizes.values())
    print(f"| all of them | {total_before / 2**20:.0f} | {total_after / 2**20:.0f} | {total_after / total_before:.2f} |")


if __name__ == "__main__":
    main()
