"""Side by side with LangChain's indexing API on the same PostgreSQL: `index()` with a `SQLRecordManager` and
a `PGVector` store (langchain-postgres), the same documents, the same model and the same chunks.

LangChain is handed the chunks rag_pipeline made (embedding input = contextual prefix + text, one
`source` per document), so it skips parsing and chunking, which rag_pipeline's times include; rag_pipeline's
no-op refresh re-scans the folder, while LangChain's is handed the documents again in memory. Both no-ops
therefore favour LangChain.

    make bench-deps && .venv/bin/python -m bench.langchain_indexing --docs 300
"""

from __future__ import annotations

import argparse
import time

import yaml
from dagster import DagsterInstance

from bench.common import generate_documents, machine, throwaway_database
from rag_pipeline import store
from rag_pipeline.config import EmbeddingConfig, load_settings
from rag_pipeline.defs.runs import run_ingest
from rag_pipeline.embedding.embedders import get_embedder
from rag_pipeline.store.database import connect, sqlalchemy_url


def _langchain_embeddings(batch_size: int):
    from langchain_core.embeddings import Embeddings

    embedder = get_embedder("all-MiniLM-L6-v2", EmbeddingConfig(batch_size=batch_size))

    class SameModel(Embeddings):
        """The very model and batch size rag_pipeline uses, behind LangChain's interface."""

        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return embedder.embed_documents(texts).tolist()

        def embed_query(self, text: str) -> list[float]:
            return embedder.embed_query(text).tolist()

    return SameModel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=300)
    args = parser.parse_args()
    from langchain_classic.indexes import SQLRecordManager
    from langchain_core.documents import Document
    from langchain_core.indexing import index
    from langchain_postgres import PGVector

    get_embedder("all-MiniLM-L6-v2")  # load the model outside the timings
    with throwaway_database() as database:
        corpus = database.workdir / "corpus"
        generate_documents(corpus, args.docs)
        url = database.create("bench_ours")
        config = database.workdir / "rag.yaml"
        config.write_text(yaml.safe_dump({
            "database_url": url, "data_dir": str(database.workdir / "data"),
            "sources": [{"name": "bench", "root": str(corpus), "acl_labels": ["staff"]}],
        }))
        settings = load_settings(config)
        with DagsterInstance.ephemeral() as instance:
            started = time.perf_counter()
            full = run_ingest(settings, instance=instance, log_level="WARNING")
            ours_full = time.perf_counter() - started
            assert full["success"]
            ours_index_stage = full["seconds"]["index"]
            started = time.perf_counter()
            noop = run_ingest(settings, instance=instance, log_level="WARNING")
            ours_noop = time.perf_counter() - started
            assert noop["success"]
            ours_noop_stages = sum(noop["seconds"].values())

        with connect(url) as conn:
            paths = dict(conn.execute("SELECT doc_id, rel_path FROM documents").fetchall())
            chunks_by_doc = store.chunks.chunks_of(conn, list(paths))
        documents = [Document(page_content=chunk.embedding_input, metadata={"source": paths[doc_id]})
                     for doc_id in sorted(paths, key=paths.get) for chunk in chunks_by_doc[doc_id]]

        langchain_url = sqlalchemy_url(database.create("bench_langchain"), driver="psycopg")
        embeddings = _langchain_embeddings(settings.embedding.batch_size)
        vectors = PGVector(embeddings=embeddings, collection_name="bench", connection=langchain_url, use_jsonb=True)
        records = SQLRecordManager("pgvector/bench", db_url=langchain_url)
        records.create_schema()
        started = time.perf_counter()
        first = index(documents, records, vectors, cleanup="full", source_id_key="source")
        langchain_full = time.perf_counter() - started
        started = time.perf_counter()
        again = index(documents, records, vectors, cleanup="full", source_id_key="source")
        langchain_noop = time.perf_counter() - started
        assert first["num_added"] == len(documents) and again["num_added"] == 0 and again["num_skipped"] == len(documents)

    print(f"machine: {machine()}")
    print(f"{args.docs} generated documents, {len(documents)} chunks, all-MiniLM-L6-v2, batch size "
          f"{settings.embedding.batch_size}, one PostgreSQL")
    print("| measurement | rag_pipeline | LangChain index() | rag_pipeline / LangChain |")
    print("|---|---|---|---|")
    print(f"| full build | {ours_full:.1f} s (parse, chunk, embed, write, 6 checks) | {langchain_full:.1f} s "
          f"(embed, write; chunks given) | {ours_full / langchain_full:.2f} |")
    print(f"| index stage alone vs full index() | {ours_index_stage:.1f} s | {langchain_full:.1f} s | "
          f"{ours_index_stage / langchain_full:.2f} |")
    print(f"| no-op re-sync | {ours_noop:.2f} s (re-scan folder, 6 checks) | {langchain_noop:.2f} s (documents "
          f"in memory) | {ours_noop / langchain_noop:.2f} |")
    print(f"| no-op re-sync, the four stages alone (no Dagster run) | {ours_noop_stages:.2f} s | {langchain_noop:.2f} s"
          f" | {ours_noop_stages / langchain_noop:.2f} |")


if __name__ == "__main__":
    main()
