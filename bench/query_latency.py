"""Hybrid-search latency at 100,000 chunks, with and without a 2%-selective ACL filter.

Builds a real index version table (halfvec + HNSW, tsvector + GIN, GIN on labels) of synthetic chunks (see
bench/synthetic.py), then times `rag_pipeline.retrieval.search` end to end: query embedding, the dense and
sparse candidate lists with the ACL filter inside their SQL, and the fusion.

    .venv/bin/python -m bench.query_latency --chunks 100000
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from psycopg import sql

from bench.common import WORDS, machine, throwaway_database
from bench.synthetic import COMMON_LABEL, RARE_LABEL, load_index, synthetic_vectors
from rag_pipeline.embedding import get_embedder
from rag_pipeline.retrieval import search
from rag_pipeline.store.database import connect


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("-k", type=int, default=10)
    parser.add_argument("--modes", default="hybrid", help="comma-separated: hybrid, dense, sparse")
    args = parser.parse_args()
    rng = random.Random(5)
    queries = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 6))) for _ in range(args.queries)]
    embedder = get_embedder("all-MiniLM-L6-v2")
    embed_ms = []
    for query in queries[:50]:
        started = time.perf_counter()
        embedder.embed_query(query)
        embed_ms.append((time.perf_counter() - started) * 1000)

    texts, vectors = synthetic_vectors(args.chunks, passages=2000)
    with throwaway_database() as database, connect(database.create("bench_latency")) as conn:
        version, timings = load_index(conn, texts, vectors)
        results = {}
        for mode in args.modes.split(","):
            for name, labels in (("no filter (every row readable)", [COMMON_LABEL, RARE_LABEL]),
                                 ("2%-selective ACL filter", [RARE_LABEL])):
                latencies, returned = [], []
                for query in queries[:10]:
                    search(conn, query, labels, k=args.k, mode=mode)  # warm the caches
                for query in queries:
                    started = time.perf_counter()
                    hits = search(conn, query, labels, k=args.k, mode=mode)
                    latencies.append((time.perf_counter() - started) * 1000)
                    returned.append(len(hits))
                results[(mode, name)] = (latencies, returned)
        rows = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(version.table_name))).fetchone()[0]

    print(f"machine: {machine()}")
    print(f"{rows:,} chunks, all-MiniLM-L6-v2 (384 dims, halfvec), HNSW built after a COPY load in "
          f"{timings['build_hnsw_s']:.0f} s; {args.queries} queries, k={args.k}")
    print(f"query embedding alone: p50 {statistics.median(embed_ms):.1f} ms (included below)")
    print("| mode | caller labels | p50 | p95 | mean hits returned |")
    print("|---|---|---|---|---|")
    for (mode, name), (latencies, returned) in results.items():
        print(f"| {mode} | {name} | {percentile(latencies, 0.5):.1f} ms | {percentile(latencies, 0.95):.1f} ms | "
              f"{statistics.fmean(returned):.1f} |")


if __name__ == "__main__":
    main()
