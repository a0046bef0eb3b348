"""Embedding backends side by side on the same inputs: torch, ONNX Runtime int8 and a remote OpenAI-compatible
endpoint (a server on 127.0.0.1 serving the same packaged MiniLM), with the golden set's recall@10 for each.

    apt-get install postgresql-doc-15
    .venv/bin/python -m bench.embedding_backends [--golden pg_manual]

The corpus is the PostgreSQL manual (golden/pg_manual.jsonl, 179 questions; `--golden sample_corpus` uses the
bundled sample corpus and its 48 questions). It is ingested once with torch; each other backend is an index
version built beside it (blue/green), as a backend change must be. chunks/s is one `embed_documents` call over
the same 2,000 chunk inputs per backend (model already loaded); recall@10 is dense retrieval, with the paired
difference against torch and its 95% confidence interval.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import yaml
from dagster import DagsterInstance

from bench.common import REPO, machine, throwaway_database
from rag_pipeline import store
from rag_pipeline.config import load_settings
from rag_pipeline.defs.runs import run_index_build, run_ingest
from rag_pipeline.embedding.embedders import get_embedder
from rag_pipeline.embedding.locations import resolve_model
from rag_pipeline.lifecycle.blue_green import retire
from rag_pipeline.retrieval.evaluation import evaluate, load_golden, paired_differences
from rag_pipeline.retrieval.search import SearchOptions
from rag_pipeline.store.database import connect
from rag_pipeline_tests.embedding_server import EmbeddingServer

MODEL = "all-MiniLM-L6-v2"


def settings_for(database, url: str, corpus: Path, labels: list[str], name: str, **embedding):
    config = database.workdir / f"{name}.yaml"
    config.write_text(yaml.safe_dump({
        "database_url": url, "data_dir": str(database.workdir / "data"),
        "embedding": {"model": MODEL, "models_dir": str(database.workdir / "models"), **embedding},
        "sources": [{"name": "docs", "root": str(corpus), "acl_labels": labels}],
    }))
    return load_settings(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--golden", choices=["pg_manual", "sample_corpus"], default="pg_manual")
    parser.add_argument("--inputs", type=int, default=2000)
    args = parser.parse_args()
    questions = load_golden(REPO / "golden" / f"{args.golden}.jsonl")
    labels = ["docs"] if args.golden == "pg_manual" else ["staff"]
    server = EmbeddingServer(resolve_model(MODEL).location, served_name=MODEL)
    try:
        with throwaway_database() as database:
            if args.golden == "pg_manual":
                from scripts.make_pg_manual_corpus import build

                corpus = database.workdir / "pg_manual"
                build(Path("/usr/share/doc/postgresql-doc-15/html"), corpus)
            else:
                corpus = REPO / "sample_corpus"
            url = database.create("bench_backends")
            backends = {
                "torch": settings_for(database, url, corpus, labels, "torch", backend="torch"),
                "onnx-int8": settings_for(database, url, corpus, labels, "onnx", backend="onnx-int8"),
                "remote (127.0.0.1)": settings_for(database, url, corpus, labels, "remote", backend="remote",
                                                   endpoint=server.url, max_concurrency=2),
            }
            with DagsterInstance.ephemeral() as instance:
                summary = run_ingest(backends["torch"], instance=instance, log_level="WARNING")
                assert summary["success"], summary.get("errors")
                with connect(url) as conn:
                    doc_ids = [r[0] for r in conn.execute("SELECT doc_id FROM documents ORDER BY doc_id").fetchall()]
                    inputs = sorted({c.embedding_input for chunks in store.chunks.chunks_of(conn, doc_ids).values()
                                     for c in chunks})[: args.inputs]
                print(f"machine: {machine()}; {len(questions)} questions ({args.golden}); "
                      f"{summary['chunks_written']} chunks; {len(inputs)} inputs timed\n")
                print("| backend | chunks/s | vs torch | version build | dense recall@10 | vs torch (95% CI) |")
                print("|---|---|---|---|---|---|")
                reports: dict[str, Any] = {}
                speeds: dict[str, float] = {}
                for name, settings in backends.items():
                    build_seconds = None
                    if name != "torch":
                        started = time.perf_counter()
                        result = run_index_build(settings, MODEL, instance=instance)
                        assert result["success"], result
                        build_seconds = time.perf_counter() - started
                    embedder = get_embedder(settings.embedding.backend_model, settings.embedding)
                    embedder.embed_documents(inputs[:64])  # warm up (and load or export)
                    started = time.perf_counter()
                    embedder.embed_documents(inputs)
                    speeds[name] = len(inputs) / (time.perf_counter() - started)
                    with connect(url) as conn:
                        version = {v.embedding_model: v for v in store.versions.index_versions(conn)}[
                            settings.embedding.backend_model]
                        reports[name] = evaluate(conn, questions, labels, k=10, mode="dense", version=version,
                                                 options=SearchOptions.from_settings(settings))
                        if name != "torch":  # one version builds at a time: drop this one once measured
                            with conn.transaction():
                                retire(conn, version.version_id)
                    recall = reports[name].metrics["overall"]["recall@k"]
                    versus = ""
                    if name != "torch":
                        (difference,) = [d for d in paired_differences(reports["torch"].results,
                                                                       reports[name].results)
                                         if d.metric == "recall@k"]
                        versus = difference.describe() + (" (real)" if difference.significant
                                                          else " (not significant)")
                    build = f"{build_seconds:.0f} s" if build_seconds else "(the ingest)"
                    print(f"| {name} | {speeds[name]:.1f} | {speeds[name] / speeds['torch']:.2f}x | {build} | "
                          f"{recall:.3f} | {versus} |", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
