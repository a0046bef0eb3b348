"""The BM25 list's two ways of ranking, on the same kept index and queries: through the chunks that hold enough of
the query's terms (rag.bm25_by_term_sets, the term-set index) and over the impact-ordered postings alone
(p_term_sets => false), alternately query by query, so both meet the same cache and load, after reading the
search structures into shared_buffers. Prints p50/p95/p99 of
rag.bm25_ranking itself (no embedding, no fusion) and whether both gave the same scores in the same order.

The term-set path's two settings (where tau starts, and the estimated chunks above which it gives way) were chosen
on the first 100 of the 200 queries bench.query_latency asks at 1,000,000 chunks; `--half second` measures on the
other 100.

    .venv/bin/python -m bench.bm25_paths --workdir .bench/latency --sizes 300000,1000000 [--half second]
                                         [--want 10,40] [--server-setting shared_buffers=8GB]

The indexes are bench.query_latency's (`--workdir`, Zipfian vocabulary): load them with it first.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench.common import kept_database
from bench.query_latency import FILTERS, percentile, prewarm, zipf_queries
from bench.synthetic import ZipfText
from rag_pipeline import store
from rag_pipeline.config import Settings
from rag_pipeline.store.database import connect


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, required=True, help="bench.query_latency's kept server and indexes")
    parser.add_argument("--sizes", default="300000,1000000")
    parser.add_argument("--half", choices=("first", "second", "both"), default="second")
    parser.add_argument("--want", default="10,40", help="comma-separated list lengths (hybrid asks for 40)")
    parser.add_argument("--server-setting", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    queries = zipf_queries(ZipfText(), 200)  # bench.query_latency's, in its order
    queries = {"first": queries[:100], "second": queries[100:], "both": queries}[args.half]
    bm25 = Settings().retrieval.bm25
    print(f"{len(queries)} queries ({args.half} half); ms of rag.bm25_ranking; p50 / p95 / p99")
    print("| chunks | wanted | caller labels | impact-ordered postings | term sets | same scores, same order |")
    print("|---|---|---|---|---|---|")
    with kept_database(args.workdir, dict(s.split("=", 1) for s in args.server_setting)) as database:
        for size in (int(s) for s in args.sizes.split(",")):
            name = f"bench_latency_zipf_{size}"
            if not database.exists(name):
                raise SystemExit(f"no {name} in {args.workdir}: load it with bench.query_latency --sizes {size}")
            url = database.open(name)
            with connect(url, autocommit=True) as conn:
                version = store.versions.active_version(conn)
                prewarm(url, version)  # as a serving database holds them (bench.query_latency --prewarm)
                for want in (int(w) for w in args.want.split(",")):
                    for label_name, labels in FILTERS:
                        timings: dict[bool, list[float]] = {True: [], False: []}
                        same = 0
                        for query in queries[:5]:  # warm both
                            for term_sets in (True, False):
                                store.search.bm25_ranking(conn, version, query, tuple(labels), want, depth=bm25.depth,
                                                          max_terms=bm25.max_query_terms, term_sets=term_sets)
                        for query in queries:
                            lists = {}
                            for term_sets in (True, False):
                                started = time.perf_counter()
                                lists[term_sets] = store.search.bm25_ranking(
                                    conn, version, query, tuple(labels), want, depth=bm25.depth,
                                    max_terms=bm25.max_query_terms, term_sets=term_sets)
                                timings[term_sets].append((time.perf_counter() - started) * 1000)
                            a, b = lists[True], lists[False]
                            same += a.chunk_ids == b.chunk_ids and all(
                                abs(x - y) <= 1e-5 * max(1.0, abs(y)) for x, y in zip(a.scores, b.scores, strict=True))
                        cells = [" / ".join(f"{percentile(timings[t], p):.1f}" for p in (0.5, 0.95, 0.99))
                                 for t in (False, True)]
                        print(f"| {size:,} | {want} | {label_name} | {cells[0]} | {cells[1]} | {same} of "
                              f"{len(queries)} |", flush=True)


if __name__ == "__main__":
    main()
