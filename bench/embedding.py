"""Embedding stage vs raw `SentenceTransformer.encode` on the same inputs and batch size.

The baseline is one `encode` call over exactly the inputs the index stage embeds (prefix + chunk text), same
model, same batch size. Measured against it: the embedding step as rag_pipeline runs it (embedding-cache
lookup, encode, cache write), and the whole index stage (`rag_pipeline.stages.process.process_pending(..., parse=False, chunk=False)` on an empty
cache), which also groups near-duplicates and writes the rows of the index version.

    .venv/bin/python -m bench.embedding --docs 300
"""

from __future__ import annotations

import argparse

import yaml
from sentence_transformers import SentenceTransformer

from bench.common import generate_documents, machine, throwaway_database, timed
from rag_pipeline import store
from rag_pipeline.config import load_settings
from rag_pipeline.domain import ids
from rag_pipeline.embedding.embedders import get_embedder
from rag_pipeline.embedding.locations import resolve_model
from rag_pipeline.stages.discover import discover
from rag_pipeline.stages.process import process_pending
from rag_pipeline.store.database import connect


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
        discover(url, settings.sources)
        process_pending(url, settings, chunk=False, index=False)
        process_pending(url, settings, parse=False, index=False)
        with connect(url) as conn:
            doc_ids = [r[0] for r in conn.execute("SELECT doc_id FROM documents").fetchall()]
            inputs = sorted({c.embedding_input for chunks in store.chunks.chunks_of(conn, doc_ids).values() for c in chunks})
        embedder = get_embedder(settings.embedding.model, settings.embedding)
        embedder.embed_documents(inputs[:64])  # warm up
        raw = SentenceTransformer(resolve_model(settings.embedding.model).location, device="cpu")
        raw.encode(inputs[:64], batch_size=args.batch_size)  # warm up
        raw_seconds = timed(lambda: raw.encode(inputs, batch_size=args.batch_size, normalize_embeddings=True))

        def embedding_step() -> None:
            with connect(url) as conn:
                shas = [ids.embedding_input_sha(text) for text in inputs]
                cached = store.chunks.cached_embeddings(conn, embedder.model.name, shas)
                missing = [(sha, text) for sha, text in zip(shas, inputs, strict=True) if sha not in cached]
                vectors = embedder.embed_documents([text for _, text in missing])
                store.chunks.store_embeddings(conn, embedder.model.name, dict(zip([sha for sha, _ in missing], vectors,
                                                                           strict=True)))

        step_seconds = timed(embedding_step)
        with connect(url) as conn:
            conn.execute("DELETE FROM embedding_cache")  # the stage below embeds everything afresh
        stage_seconds = timed(lambda: process_pending(url, settings, parse=False, chunk=False))

    print(f"machine: {machine()}")
    print(f"{len(inputs)} distinct inputs from {args.docs} documents, batch size {args.batch_size}, "
          f"{settings.embedding.model}")
    print("| measurement | seconds | chunks/s |")
    print("|---|---|---|")
    print(f"| raw SentenceTransformer.encode | {raw_seconds:.2f} | {len(inputs) / raw_seconds:.1f} |")
    print(f"| embedding step (cache lookup, encode, cache write) | {step_seconds:.2f} | {len(inputs) / step_seconds:.1f} |")
    print(f"| whole index stage (+ near-duplicate grouping, row writes) | {stage_seconds:.2f} | "
          f"{len(inputs) / stage_seconds:.1f} |")
    print(f"| embedding step / raw throughput | {raw_seconds / step_seconds:.3f} | goal >= 0.9 |")
    print(f"| whole index stage / raw throughput | {raw_seconds / stage_seconds:.3f} | |")


if __name__ == "__main__":
    main()
