"""Incremental refresh: full build vs no-op refresh vs 1%-changed vs deletion-only refresh, at several corpus
sizes, to show that a refresh costs what changed, not what exists.

Runs the real `ingest` job (through Dagster, on an ephemeral instance) against a throwaway embedded
PostgreSQL (or RAG_BENCH_ADMIN_URL's server). The corpus is generated Markdown, about 3 chunks a document.

    .venv/bin/python -m bench.refresh --sizes 300,3000
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import yaml
from dagster import DagsterInstance

from bench.common import generate_documents, machine, throwaway_database
from rag_pipeline.config import load_settings
from rag_pipeline.defs.runs import run_ingest
from rag_pipeline.embedding.embedders import get_embedder


def run(settings, instance, label: str) -> tuple[float, dict]:
    started = time.perf_counter()
    summary = run_ingest(settings, instance=instance, log_level="WARNING")
    elapsed = time.perf_counter() - started
    if not summary["success"]:
        raise SystemExit(f"{label}: run failed: {summary.get('errors')}")
    print(f"  {label:<22} {elapsed:8.2f} s  parsed={summary['parsed']} chunks={summary['chunks_written']} "
          f"embedded={summary['vectors_embedded']} reused={summary['vectors_reused']} deleted={summary['deleted']}",
          flush=True)
    return elapsed, summary


def measure(database, size: int) -> dict[str, float]:
    corpus = database.workdir / f"corpus-{size}"
    documents = generate_documents(corpus, size)
    config = database.workdir / f"rag-{size}.yaml"
    config.write_text(yaml.safe_dump({
        "database_url": database.create(f"bench_refresh_{size}"), "data_dir": str(database.workdir / "data"),
        "sources": [{"name": "bench", "root": str(corpus), "acl_labels": ["staff"]}],
    }))
    settings = load_settings(config)
    print(f"{size} documents", flush=True)
    with DagsterInstance.ephemeral() as instance:
        full, first = run(settings, instance, "full build")
        noop, _ = run(settings, instance, "no-op refresh")
        changed = documents[:: max(1, len(documents) // max(1, size // 100))][: max(1, size // 100)]
        for path in changed:
            path.write_text(path.read_text().replace("## Section 1", "## Section 1 (revised)", 1)
                            + "\nA revised closing paragraph about the charging dock.\n")
        one_percent, _ = run(settings, instance, f"1% changed ({len(changed)})")
        deleted = documents[1:: max(1, len(documents) // max(1, size // 100))][: max(1, size // 100)]
        for path in deleted:
            Path(path).unlink()
        deletion, _ = run(settings, instance, f"1% deleted ({len(deleted)})")
    return {"documents": size, "chunks": first["chunks_written"], "full": full, "noop": noop,
            "one_percent": one_percent, "deletion": deletion}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="300,3000", help="comma-separated corpus sizes (documents)")
    args = parser.parse_args()
    get_embedder("all-MiniLM-L6-v2")  # load the model outside the timings
    results = []
    with throwaway_database() as database:
        for size in (int(s) for s in args.sizes.split(",")):
            results.append(measure(database, size))
    print(f"\nmachine: {machine()}")
    print("| documents | chunks | full build | no-op (ratio) | 1% changed (ratio) | 1% deleted (ratio) |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['documents']:,} | {r['chunks']:,} | {r['full']:.1f} s | {r['noop']:.2f} s ({r['noop'] / r['full']:.4f})"
              f" | {r['one_percent']:.2f} s ({r['one_percent'] / r['full']:.4f})"
              f" | {r['deletion']:.2f} s ({r['deletion'] / r['full']:.4f}) |")
    print("goals: no-op <= 0.02, 1% changed <= 0.05 of a full build")


if __name__ == "__main__":
    main()
