"""The second golden set (golden/pg_manual.jsonl: 179 questions written against the PostgreSQL manual of Debian's
postgresql-doc-15) on both packaged models, each ranking feature on and off, with paired significance.

    apt-get install postgresql-doc-15
    .venv/bin/python -m bench.golden_pg_manual [--models all-MiniLM-L6-v2,all-mpnet-base-v2] [--config FILE]

Prints hit@5, recall@10, MRR and nDCG@10 per mode and feature setting, and paired differences of hybrid against
each single list.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import yaml
from dagster import DagsterInstance

from bench.common import REPO, machine, throwaway_database
from rag_pipeline import store
from rag_pipeline.config import load_settings
from rag_pipeline.defs.runs import run_index_build, run_ingest
from rag_pipeline.retrieval.evaluation import evaluate, load_golden, paired_differences
from rag_pipeline.retrieval.search import SearchOptions
from rag_pipeline.store.database import connect, resolve_urls
from scripts.make_pg_manual_corpus import build

GOLDEN = REPO / "golden" / "pg_manual.jsonl"
LABELS = ["docs"]


def settings_for(database, corpus: Path, model: str):
    config = database.workdir / "rag.yaml"
    config.write_text(yaml.safe_dump({
        "database_url": database.create("bench_pg_manual"), "data_dir": str(database.workdir / "data"),
        "embedding": {"model": model, "models_dir": str(REPO / ".models")},
        "sources": [{"name": "pgdocs", "root": str(corpus), "acl_labels": LABELS}],
    }))
    return load_settings(config)


def variants(settings) -> dict[str, tuple[str, SearchOptions]]:
    base = SearchOptions.from_settings(settings)  # the defaults: RRF 1:1, document routing on
    unrouted = dataclasses.replace(base, routing=base.routing.model_copy(update={"enabled": False}))
    return {
        "dense": ("dense", unrouted),
        "sparse (BM25)": ("sparse", unrouted),
        "hybrid (default: RRF 1:1, document routing)": ("hybrid", base),
        "hybrid, no document routing": ("hybrid", unrouted),
        "hybrid, all query terms": ("hybrid", dataclasses.replace(
            base, bm25=base.bm25.model_copy(update={"max_query_terms": 64}))),
        "hybrid, dense weight 2": ("hybrid", dataclasses.replace(base, dense_weight=2.0)),
        "hybrid, chunks alone (page_weight 0)": ("hybrid", dataclasses.replace(base, page_weight=0.0)),
        "dense, chunks alone (page_weight 0)": ("dense", dataclasses.replace(unrouted, page_weight=0.0)),
    }


def evaluate_versions(settings, questions) -> None:
    rows, differences = [], []
    with connect(resolve_urls(settings).index) as conn:
        for version in store.versions.index_versions(conn):
            for name, (mode, options) in variants(settings).items():
                at5 = evaluate(conn, questions, LABELS, k=5, mode=mode, version=version, options=options)
                at10 = evaluate(conn, questions, LABELS, k=10, mode=mode, version=version, options=options)
                overall5, overall10 = at5.metrics["overall"], at10.metrics["overall"]
                rows.append((version.embedding_model, name, overall5["hit@k"], overall10["recall@k"],
                             overall10["mrr"], overall10["ndcg@k"]))
                differences.append((version.embedding_model, name, at10))
    print("\n| model | ranking | hit@5 | recall@10 | MRR | nDCG@10 |\n|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in row) + " |")
    print("\npaired differences at k=10 (the default hybrid minus each other ranking):")
    for model in dict.fromkeys(m for m, _, _ in differences):
        reports = {name: report for m, name, report in differences if m == model}
        for other in ("dense", "sparse (BM25)", "hybrid, no document routing"):
            for hybrid in ("hybrid (default: RRF 1:1, document routing)",):
                for d in paired_differences(reports[other].results, reports[hybrid].results):
                    if d.metric in ("recall@k", "mrr"):
                        print(f"  {model}: {hybrid} vs {other}: {d.describe()}"
                              f"{' real' if d.significant else ' not significant'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="all-MiniLM-L6-v2,all-mpnet-base-v2")
    parser.add_argument("--config", help="evaluate the index versions of this configuration's database (the corpus "
                        "ingested there as a source labelled docs) instead of building a throwaway one")
    args = parser.parse_args()
    questions = load_golden(GOLDEN)
    print(f"machine: {machine()}; {len(questions)} questions")
    if args.config:
        evaluate_versions(load_settings(args.config), questions)
        return
    with throwaway_database() as database:
        corpus = database.workdir / "pg_manual"
        pages = build(Path("/usr/share/doc/postgresql-doc-15/html"), corpus)
        models = args.models.split(",")
        settings = settings_for(database, corpus, models[0])
        started = time.perf_counter()
        with DagsterInstance.ephemeral() as instance:
            summary = run_ingest(settings, instance=instance)
            assert summary["success"], summary.get("errors")
            print(f"{len(pages)} pages, {summary['chunks_written']} chunks, ingest {time.perf_counter() - started:.0f} s")
            for model in models[1:]:
                started = time.perf_counter()
                built = run_index_build(settings, model, instance=instance)
                print(f"{model}: version built in {time.perf_counter() - started:.0f} s ({built['status']})")
        evaluate_versions(settings, questions)


if __name__ == "__main__":
    main()
