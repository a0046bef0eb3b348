"""Incremental-refresh benchmark: full build vs no-op refresh vs 1%-changed refresh, side by side.

Runs the real `ingest` job (through Dagster, on an ephemeral instance) against a throwaway embedded
PostgreSQL, or against RAG_BENCH_ADMIN_URL when set. The corpus is the bundled sample corpus plus
generated Markdown documents, so the numbers scale with --docs.

    .venv/bin/python benchmarks/ingest_benchmark.py --docs 300
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from dagster import DagsterInstance  # noqa: E402

from rag_pipeline.config import load_settings  # noqa: E402
from rag_pipeline.database import EmbeddedPostgres, ensure_database, migrate  # noqa: E402
from rag_pipeline.defs.instance import run_ingest  # noqa: E402
from rag_pipeline.embedding import get_embedder  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
WORDS = (
    "robot warehouse battery shelf picking station safety policy revenue margin quarter customer order "
    "service contract welding arm floor marker camera navigation charging dock payload speed braking "
    "incident laptop password travel hotel allowance receipt expense onboarding badge induction"
).split()


def generate_documents(folder: Path, count: int, seed: int = 7) -> list[Path]:
    rng = random.Random(seed)
    paths = []
    for index in range(count):
        sections = []
        for section in range(rng.randint(2, 5)):
            paragraphs = [
                " ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 120))).capitalize() + "."
                for _ in range(rng.randint(1, 4))
            ]
            sections.append(f"## Section {section + 1}\n\n" + "\n\n".join(paragraphs))
        path = folder / f"generated/doc-{index:05d}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# Generated document {index}\n\n" + "\n\n".join(sections) + "\n")
        paths.append(path)
    return paths


def timed(label: str, settings, instance) -> tuple[float, dict]:
    started = time.perf_counter()
    summary = run_ingest(settings, instance=instance)
    elapsed = time.perf_counter() - started
    if not summary["success"]:
        raise SystemExit(f"{label}: run failed: {summary.get('errors')}")
    print(
        f"  {label:<16} {elapsed:7.2f} s  parsed={summary['parsed']} content_unchanged={summary['content_unchanged']}"
        f" chunks={summary['chunks_written']} embedded={summary['vectors_embedded']}"
        f" reused={summary['vectors_reused']}",
        flush=True,
    )
    return elapsed, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=200, help="generated Markdown documents besides the sample")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="ragbench-"))
    server = None
    try:
        admin_url = os.environ.get("RAG_BENCH_ADMIN_URL")
        if not admin_url:
            server = EmbeddedPostgres(workdir / "pg")
            server.start()
            admin_url = server.url("postgres")
        ensure_database(admin_url, "rag_bench")
        import psycopg

        db_url = psycopg.conninfo.make_conninfo(admin_url, dbname="rag_bench")
        migrate(db_url)
        corpus = workdir / "corpus"
        shutil.copytree(REPO / "sample_corpus", corpus)
        generated = generate_documents(corpus, args.docs)
        config = workdir / "rag.yaml"
        config.write_text(yaml.safe_dump({
            "database_url": db_url, "data_dir": str(workdir / "data"),
            "sources": [{"name": "bench", "root": str(corpus), "acl_labels": ["staff"]}],
        }))
        settings = load_settings(config)
        get_embedder(settings.embedding.model)  # load the model outside the timings

        print(f"corpus: {args.docs + 7} files ({args.docs} generated Markdown + the 7-file sample corpus)")
        with DagsterInstance.ephemeral() as instance:
            full, first = timed("full build", settings, instance)
            noop, _ = timed("no-op refresh", settings, instance)
            changed = generated[: max(1, len(generated) // 100)]
            for path in changed:
                path.write_text(path.read_text().replace("Section 1", "Section one (revised)", 1))
            one_percent, _ = timed(f"{len(changed)} changed", settings, instance)
        print()
        print("| measurement | seconds | ratio to full build | target |")
        print("|---|---|---|---|")
        print(f"| full build ({first['chunks_written']} chunks) | {full:.2f} | 1.00 | |")
        print(f"| no-op refresh | {noop:.2f} | {noop / full:.3f} | <= 0.02 |")
        print(f"| 1% changed refresh | {one_percent:.2f} | {one_percent / full:.3f} | <= 0.05 |")
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
