"""Embedding stage vs raw `SentenceTransformer.encode` on the same inputs and batch size.

The stage is `rag_pipeline.ingest.index_pending` with an empty embedding cache: cache lookups, encoding,
cache writes, near-duplicate grouping and the row writes into the index version. The baseline is one
`encode` call over exactly the inputs the stage embedded (prefix + chunk text), same model, same batch size.

    .venv/bin/python -m bench.embedding --docs 300
"""

from __future__ import annotations

import argparse

import yaml
from sentence_transformers import SentenceTransformer

from bench.common import generate_documents, machine, throwaway_database, timed
from rag_pipeline import ingest, store
from rag_pipeline.config import load_settings
from rag_pipeline.database import connect
from rag_pipeline.embedding import get_embedder, resolve_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    with throwaway_database() as database:
        corpus = database.workdir / "corpus"
        generate_documents(corpus, args.docs)
        config = database.workdir / "rag.yaml"
        config.write_text(yaml.safe_dump({
            "database_url": database.create("bench_embedding"), "data_dir": str(database.workdir / "data"),
            "embedding": {"batch_size": args.batch_size},
            "sources": [{"name": "bench", "root": str(corpus), "acl_labels": ["staff"]}],
        }))
        settings = load_settings(config)
        url = settings.database_url
        ingest.prepare_index(url, settings)
        ingest.discover(url, settings.sources)
        ingest.parse_pending(url, settings)
        ingest.chunk_pending(url, settings)
        with connect(url) as conn:
            doc_ids = [r[0] for r in conn.execute("SELECT doc_id FROM documents").fetchall()]
            inputs = sorted({c.embedding_input for chunks in store.chunks_of(conn, doc_ids).values() for c in chunks})
        get_embedder(settings.embedding.model, batch_size=args.batch_size).embed_documents(inputs[:64])  # warm up

        stage_seconds = timed(lambda: ingest.index_pending(url, settings))
        raw = SentenceTransformer(resolve_model(settings.embedding.model).location, device="cpu")
        raw.encode(inputs[:64], batch_size=args.batch_size)  # warm up
        raw_seconds = timed(lambda: raw.encode(inputs, batch_size=args.batch_size, normalize_embeddings=True))

    print(f"machine: {machine()}")
    print(f"{len(inputs)} distinct inputs from {args.docs} documents, batch size {args.batch_size}, "
          f"{settings.embedding.model}")
    print("| measurement | seconds | chunks/s |")
    print("|---|---|---|")
    print(f"| raw SentenceTransformer.encode | {raw_seconds:.2f} | {len(inputs) / raw_seconds:.1f} |")
    print(f"| index stage (cache, encode, dedup, writes) | {stage_seconds:.2f} | {len(inputs) / stage_seconds:.1f} |")
    print(f"| stage throughput / raw throughput | {raw_seconds / stage_seconds:.3f} | goal >= 0.9 |")


if __name__ == "__main__":
    main()
