"""Query latency of the three search modes on a large index, unfiltered and with a selective ACL filter, at
several sizes and on two vocabularies; the storage each structure costs; and, with --churn, what ten refresh
cycles of 10% churn do to size and latency.

    .venv/bin/python -m bench.query_latency [--sizes 100000,300000] [--vocabularies zipf,stress]
                                            [--modes sparse,dense,hybrid] [--churn 10]

Latencies include the query embedding (dense and hybrid) and return the full k. Printed as Markdown tables.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from pgvector import HalfVector
from psycopg import sql

from bench.common import WORDS, machine, throwaway_database
from bench.synthetic import COMMON_LABEL, RARE_LABEL, ZipfText, load_index, synthetic_vectors
from rag_pipeline import store
from rag_pipeline.config import Settings
from rag_pipeline.embedding.embedders import get_embedder
from rag_pipeline.retrieval.search import SearchOptions, search
from rag_pipeline.store.database import connect

FILTERS = (("none", [COMMON_LABEL, RARE_LABEL]), ("2% labels", [RARE_LABEL]))
AS_THE_SERVICE = SearchOptions(light_query_model=False)  # the full query model, as `rag-pipeline serve` keeps it


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def measure(conn, queries: list[str], modes: list[str], k: int) -> dict[tuple[str, str], tuple[float, float, float]]:
    """(mode, filter) -> (p50 ms, p95 ms, mean hits)."""
    results = {}
    for mode in modes:
        for name, labels in FILTERS:
            for query in queries[:10]:
                search(conn, query, labels, k=k, mode=mode, options=AS_THE_SERVICE)  # warm the caches
            latencies, returned = [], []
            for query in queries:
                started = time.perf_counter()
                hits = search(conn, query, labels, k=k, mode=mode, options=AS_THE_SERVICE)
                latencies.append((time.perf_counter() - started) * 1000)
                returned.append(len(hits))
            results[(mode, name)] = (percentile(latencies, 0.5), percentile(latencies, 0.95),
                                     statistics.fmean(returned))
    return results


def storage(conn, version) -> dict[str, int]:
    """Bytes per structure: the table with its B-trees, the HNSW index, the BM25 postings, weights and counters."""
    def size(expression: str, name: str) -> int:
        return conn.execute(sql.SQL("SELECT {}(%s::regclass)").format(sql.SQL(expression)), (name,)).fetchone()[0]

    table = version.table_name
    return {
        "halfvec HNSW index": size("pg_relation_size", f"{table}_hnsw"),
        "rows (heap, TOAST, B-trees, GIN)": size("pg_total_relation_size", table) - size("pg_relation_size", f"{table}_hnsw"),
        "BM25 postings (+ 2 indexes)": size("pg_total_relation_size", f"{table}_postings"),
        "BM25 weight vectors": size("pg_total_relation_size", f"{table}_bm25docs"),
        "BM25 df counters": size("pg_total_relation_size", f"{table}_bm25_df"),
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100000,300000", help="comma-separated chunk counts (e.g. add 1000000)")
    parser.add_argument("--vocabularies", default="zipf,stress")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("-k", type=int, default=10)
    parser.add_argument("--modes", default="sparse,dense,hybrid")
    parser.add_argument("--churn", type=int, default=0, help="refresh cycles of 10%% churn at the first size")
    args = parser.parse_args()
    modes = args.modes.split(",")
    embedder = get_embedder("all-MiniLM-L6-v2")
    embed_ms = []
    for word in WORDS:
        started = time.perf_counter()
        embedder.embed_query(f"{word} policy")
        embed_ms.append((time.perf_counter() - started) * 1000)
    print(f"machine: {machine()}; query embedding alone: p50 {statistics.median(embed_ms):.1f} ms (included below)")
    zipf = ZipfText()
    rows_out, sizes_out = [], []
    for vocabulary in args.vocabularies.split(","):
        rng = random.Random(5)
        if vocabulary == "zipf":
            queries = [zipf.query(rng) for _ in range(args.queries)]
        else:
            queries = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 6))) for _ in range(args.queries)]
        for size in (int(s) for s in args.sizes.split(",")):
            texts, vectors = synthetic_vectors(size, passages=2000)
            if vocabulary == "zipf":
                text_rng = random.Random(9)
                texts = [zipf.text(text_rng) for _ in range(size)]
            with throwaway_database() as database, connect(database.create("bench_latency")) as conn:
                version, timings = load_index(conn, texts, vectors)
                results = measure(conn, queries, modes, args.k)
                for (mode, name), (p50, p95, hits) in results.items():
                    rows_out.append(f"| {vocabulary} | {size:,} | {mode} | {name} | {p50:.1f} | {p95:.1f} | {hits:.1f} |")
                sizes = storage(conn, version)
                sizes_out.append((vocabulary, size, sizes, timings))
                if args.churn and size == int(args.sizes.split(",")[0]) and vocabulary == "zipf":
                    started, vacuumed = time.perf_counter(), 0
                    for cycle in range(args.churn):
                        churn(conn, version, texts, vectors, cycle)
                        conn.autocommit = True  # what the index stage does after each refresh's writes
                        vacuumed += len(store.versions.vacuum_churned(conn, version, Settings().execution.vacuum_dead_share))
                        conn.autocommit = False
                    churn_seconds = time.perf_counter() - started
                    after = measure(conn, queries, modes, args.k)
                    after_sizes = storage(conn, version)
                    print(f"\n{args.churn} cycles of 10% churn at {size:,} ({churn_seconds:.0f} s; {vacuumed} tables vacuumed "
                          "by the refresh policy, execution.vacuum_dead_share):")
                    print("| mode | caller labels | p95 before | p95 after | ratio |\n|---|---|---|---|---|")
                    for key, (_, p95, _) in results.items():
                        print(f"| {key[0]} | {key[1]} | {p95:.1f} | {after[key][1]:.1f} | {after[key][1] / p95:.2f} |")
                    print("| structure | MB before | MB after | ratio |\n|---|---|---|---|")
                    for name, before in sizes.items():
                        print(f"| {name} | {before / 2**20:.0f} | {after_sizes[name] / 2**20:.0f} | "
                              f"{after_sizes[name] / max(1, before):.2f} |")
                    total_before, total_after = sum(sizes.values()), sum(after_sizes.values())
                    print(f"| all of them | {total_before / 2**20:.0f} | {total_after / 2**20:.0f} | "
                          f"{total_after / total_before:.2f} |")
    print(f"\n{args.queries} queries per cell, k={args.k}; ms")
    print("| vocabulary | chunks | mode | caller labels | p50 | p95 | mean hits |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows_out))
    print("\nstorage per 100,000 chunks (MB) and build times")
    names = list(sizes_out[0][2])
    print("| vocabulary | chunks | " + " | ".join(names) + " | HNSW build s | BM25 build s |")
    print("|---|---|" + "---|" * (len(names) + 2))
    for vocabulary, size, sizes, timings in sizes_out:
        scaled = " | ".join(f"{sizes[n] / 2**20 * 100_000 / size:.0f}" for n in names)
        print(f"| {vocabulary} | {size:,} | {scaled} | {timings['build_hnsw_s']:.0f} | {timings['build_bm25_s']:.0f} |")


if __name__ == "__main__":
    main()
