"""Index footprint: the same rows stored as halfvec (what rag_pipeline uses) and as float32 `vector`, each
with its HNSW index, measured by PostgreSQL itself.

    .venv/bin/python -m bench.footprint --chunks 100000
"""

from __future__ import annotations

import argparse

from pgvector import HalfVector, Vector
from psycopg import sql

from bench.common import machine, throwaway_database
from bench.synthetic import synthetic_vectors
from rag_pipeline.store.database import connect


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=100_000)
    args = parser.parse_args()
    _, vectors = synthetic_vectors(args.chunks, passages=2000)
    dims = vectors.shape[1]
    sizes = {}
    with throwaway_database() as database, connect(database.create("bench_footprint")) as conn:
        conn.execute("SET maintenance_work_mem = '1GB'")
        for kind, wrap, ops in (("halfvec", HalfVector, "halfvec_cosine_ops"), ("vector", Vector, "vector_cosine_ops")):
            table = sql.Identifier(f"rows_{kind}")
            conn.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, embedding {}({}) NOT NULL)").format(
                table, sql.SQL(kind), sql.Literal(dims)))
            with conn.cursor().copy(sql.SQL("COPY {} (id, embedding) FROM STDIN").format(table)) as copy:
                for i, vector in enumerate(vectors):
                    copy.write_row((i, wrap(vector)))
            conn.execute(sql.SQL("CREATE INDEX {} ON {} USING hnsw (embedding {})").format(
                sql.Identifier(f"rows_{kind}_hnsw"), table, sql.SQL(ops)))
            conn.commit()
            sizes[kind] = conn.execute(
                "SELECT pg_table_size(%s), pg_relation_size(%s), pg_total_relation_size(%s)",
                (f"rows_{kind}", f"rows_{kind}_hnsw", f"rows_{kind}"),
            ).fetchone()
    mib = 1024 * 1024
    print(f"machine: {machine()}")
    print(f"{len(vectors):,} rows of {dims} dimensions")
    print("| storage | table (heap + TOAST) | HNSW index | total with indexes |")
    print("|---|---|---|---|")
    for kind, (table_bytes, index_bytes, total) in sizes.items():
        print(f"| {kind}({dims}) | {table_bytes / mib:.0f} MiB | {index_bytes / mib:.0f} MiB | {total / mib:.0f} MiB |")
    half, full = sizes["halfvec"][2], sizes["vector"][2]
    print(f"halfvec / float32 total: {half / full:.2f}")


if __name__ == "__main__":
    main()
