"""Per-document execution: the parse stage and the whole build with 1 worker vs N, and a refresh beside a
document that hangs its parser.

    .venv/bin/python -m bench.parallel --docs 32 --pages 16 --workers 2
    .venv/bin/python -m bench.parallel --parts hang --small-docs 100 --timeout 60
    .venv/bin/python -m bench.parallel --parts dask        # the build through Dagster's Dask executor

Part 1 generates `--docs` multi-page PDFs (prose, a figure table per page: what filings look like to the parser)
and builds them into fresh databases: the parse stage alone, then the whole build (discover, parse, chunk, embed,
index). Part 2 builds `--small-docs` documents, adds one whose parser sleeps (and one made of the crafted lines
that once froze every refresh), deletes a file and changes the source's labels while the hanging refresh runs,
and times the refresh beside it.
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from pathlib import Path

import yaml
from fpdf import FPDF

from bench.common import WORDS, generate_documents, machine, paragraph, throwaway_database
from rag_pipeline.config import Settings, load_settings
from rag_pipeline.stages.discover import discover
from rag_pipeline.stages.process import process_pending
from rag_pipeline.store.database import connect


def write_pdfs(folder: Path, count: int, pages: int, seed: int = 5) -> None:
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        pdf = FPDF(format="A4")
        pdf.set_auto_page_break(auto=False)
        for page in range(pages):
            pdf.add_page()
            pdf.set_font("Helvetica", style="B", size=13)
            pdf.set_xy(15, 15)
            pdf.cell(180, 8, f"Report {index} - part {page + 1}")
            pdf.set_font("Helvetica", size=10)
            pdf.set_xy(15, 28)
            for _ in range(3):
                pdf.multi_cell(180, 5, paragraph(rng, 50, 90))
                pdf.ln(3)
            y = pdf.get_y() + 4
            pdf.set_font("Helvetica", style="B", size=9)
            for column, year in enumerate(("2024", "2023", "2022")):
                pdf.set_xy(110 + column * 28, y)
                pdf.cell(24, 5, year, align="R")
            pdf.set_font("Helvetica", size=9)
            for _ in range(12):
                y += 6
                pdf.set_xy(15, y)
                pdf.cell(90, 5, f"{rng.choice(WORDS).capitalize()} {rng.choice(WORDS)}")
                for column in range(3):
                    pdf.set_xy(110 + column * 28, y)
                    pdf.cell(24, 5, f"{rng.randint(100, 99_999):,}", align="R")
        pdf.output(str(folder / f"report-{index:03d}.pdf"))


def settings_for(workdir: Path, url: str, corpus: Path, name: str, **execution) -> Settings:
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "database_url": url, "data_dir": str(workdir / "data"),
        "sources": [{"name": "bench", "root": str(corpus), "acl_labels": ["staff"]}],
        "execution": execution,
    }))
    return load_settings(path)


def scaling(db, workdir: Path, docs: int, pages: int, workers: int, repeat: int) -> None:
    corpus = workdir / "pdfs"
    write_pdfs(corpus, docs, pages)
    print(f"## Parse stage (best of {repeat}) and whole build: {docs} PDFs of {pages} pages ({machine()})\n")
    print("| workers | parse stage alone | pages/s | whole build | parse+chunk | index | dead letters |")
    print("|---|---|---|---|---|---|---|")
    results = {}
    for count in sorted({1, workers}):
        parse_seconds = float("inf")
        for attempt in range(repeat):  # the best of `repeat` fresh builds: other load on the machine only adds
            url = db.create(f"parse_{count}_{attempt}")
            settings = settings_for(workdir, url, corpus, f"parse_{count}", workers=count)
            discover(url, settings.sources, progress=lambda _: None)
            started = time.perf_counter()
            parsed = process_pending(url, settings, lambda _: None, chunk=False, index=False).parse
            parse_seconds = min(parse_seconds, time.perf_counter() - started)
        url = db.create(f"build_{count}")
        settings = settings_for(workdir, url, corpus, f"build_{count}", workers=count)
        started = time.perf_counter()
        discover(url, settings.sources, progress=lambda _: None)
        built = process_pending(url, settings, lambda _: None)
        build_seconds = time.perf_counter() - started
        results[count] = (parse_seconds, build_seconds)
        print(f"| {count} | {parse_seconds:.1f} s | {parsed.pages / parse_seconds:.2f} | {build_seconds:.1f} s | "
              f"{built.parse.seconds:.1f} s | {built.index.seconds:.1f} s | {parsed.dead_lettered} |")
    # The same build with the stages one after another (what a refresh did before parsing overlapped embedding).
    url = db.create("build_sequential")
    settings = settings_for(workdir, url, corpus, "build_sequential", workers=1)
    started = time.perf_counter()
    discover(url, settings.sources, progress=lambda _: None)
    process_pending(url, settings, lambda _: None, index=False)
    process_pending(url, settings, lambda _: None, parse=False, chunk=False)
    sequential = time.perf_counter() - started
    print(f"| 1, stages one after another | | | {sequential:.1f} s | | | |")
    if workers > 1:
        (p1, b1), (pn, bn) = results[1], results[workers]
        print(f"\nparse stage speed-up with {workers} workers: {p1 / pn:.2f}x (goal >= 1.7x on 2 cores); "
              f"whole build: {b1 / bn:.2f}x (against the stages one after another: {sequential / bn:.2f}x)\n")


def hang(db, workdir: Path, small_docs: int, timeout: int) -> None:
    from rag_pipeline_tests.hanging_worker import HangingRunner

    corpus = workdir / "small"
    generate_documents(corpus, small_docs)
    print(f"## A refresh beside a document that hangs its parser ({small_docs} documents, "
          f"execution.document_timeout {timeout} s)\n")
    url = db.create("hang_baseline")
    settings = settings_for(workdir, url, corpus, "hang_baseline", document_timeout=timeout, page_timeout=0)
    started = time.perf_counter()
    discover(url, settings.sources, progress=lambda _: None)
    process_pending(url, settings, lambda _: None, runner=HangingRunner())
    baseline = time.perf_counter() - started

    url = db.create("hang")
    settings = settings_for(workdir, url, corpus, "hang", document_timeout=timeout, page_timeout=0)
    (corpus / "hang.md").write_text("# This parser never returns\n\nIts worker is killed at the timeout.\n")
    (corpus / "crafted.md").write_text("# a" + "\u2028" * 20000 + "b\n\n" + "x" + ". " * 40000 + "z\n")
    outcome: dict[str, float] = {}

    def hanging_refresh() -> None:
        begun = time.perf_counter()
        discover(url, settings.sources, progress=lambda _: None)
        process_pending(url, settings, lambda _: None, runner=HangingRunner())
        outcome["seconds"] = time.perf_counter() - begun

    refresh = threading.Thread(target=hanging_refresh)
    refresh.start()
    with connect(url, autocommit=True) as conn:
        while not conn.execute("SELECT count(*) FROM documents WHERE rel_path = 'hang.md' "
                               "AND lease_owner IS NOT NULL").fetchone()[0]:
            time.sleep(0.2)
        victim = next(iter(sorted((corpus / "generated").rglob("*.md"))))
        victim.unlink()
        relabelled = settings.model_copy(update={"sources": (
            settings.sources[0].model_copy(update={"acl_labels": ("staff", "legal")}),)})
        begun = time.perf_counter()
        stats = discover(url, relabelled.sources, progress=lambda _: None)
        process_pending(url, relabelled, lambda _: None)
        next_refresh = time.perf_counter() - begun
        gone = not conn.execute("SELECT count(*) FROM rag.indexed_chunks a JOIN documents d USING (doc_id) "
                                "WHERE d.rel_path = %s", (str(victim.relative_to(corpus)),)).fetchone()[0]
        narrowed = conn.execute("SELECT bool_and(acl_labels @> ARRAY['legal']) FROM rag.indexed_chunks").fetchone()[0]
        running = refresh.is_alive()
    refresh.join()
    with connect(url) as conn:
        dead = dict(conn.execute("SELECT d.rel_path, l.reason FROM dead_letters l JOIN documents d USING (doc_id)"))
    print("| measure | value |")
    print("|---|---|")
    print(f"| refresh of the {small_docs} documents alone | {baseline:.1f} s |")
    print(f"| refresh with the hanging document | {outcome['seconds']:.1f} s "
          f"(bound: timeout + the documents = {timeout + baseline:.1f} s) |")
    print(f"| hang.md | {dead.get('hang.md', 'not dead-lettered')} |")
    print(f"| crafted lines | {dead.get('crafted.md', 'indexed')} |")
    print(f"| refresh started while it hung (delete 1, relabel {stats.relabelled}) | {next_refresh:.1f} s, "
          f"first refresh still running: {running} |")
    print(f"| deletion reached the index | {gone} |")
    print(f"| label change reached every row | {bool(narrowed)} |")


def through_dask(db, workdir: Path, docs: int, pages: int) -> None:
    """The same build through Dagster twice: in one process, and on Dask (a scheduler and two workers here)."""
    import os

    import dask
    from dagster import DagsterInstance
    from dask.distributed import LocalCluster

    from rag_pipeline.defs.runs import run_ingest

    corpus = workdir / "pdfs"
    if not corpus.exists():
        write_pdfs(corpus, docs, pages)
    print(f"## The whole build through Dagster: in one process vs Dagster's Dask executor ({docs} PDFs of {pages} "
          "pages, two Dask workers on this machine)\n")
    print("| executor | whole build | documents indexed |")
    print("|---|---|---|")
    (workdir / "home").mkdir(exist_ok=True)
    url = db.create("through_dagster")
    settings = settings_for(workdir, url, corpus, "through_dagster")
    with DagsterInstance.local_temp(str(workdir / "home")) as instance:
        started = time.perf_counter()
        summary = run_ingest(settings, instance=instance, log_level="WARNING")
        print(f"| in process (workers: one per core) | {time.perf_counter() - started:.1f} s | "
              f"{summary['documents_indexed']} |")
    url = db.create("through_dask")
    config = workdir / "dask.yaml"
    os.environ["RAG_CONFIG"] = str(config)
    with dask.config.set({"distributed.worker.daemon": False}), LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None,
            silence_logs=40) as cluster:
        config.write_text(yaml.safe_dump({
            "database_url": url, "data_dir": str(workdir / "data"),
            "sources": [{"name": "bench", "root": str(corpus), "acl_labels": ["staff"]}],
            "execution": {"executor": "dask", "dask_address": cluster.scheduler_address, "steps": 2, "workers": 1},
        }))
        with DagsterInstance.local_temp(str(workdir / "home")) as instance:
            started = time.perf_counter()
            summary = run_ingest(load_settings(config), instance=instance, log_level="WARNING")
            print(f"| Dask, 2 workers x 1 step x 1 parse process | {time.perf_counter() - started:.1f} s | "
                  f"{summary['documents_indexed']} |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=32)
    parser.add_argument("--pages", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=2, help="parse-stage builds per worker count (best kept)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--small-docs", type=int, default=100)
    parser.add_argument("--timeout", type=int, default=60)
    parser.add_argument("--parts", default="scaling,hang",
                        help="comma-separated: scaling, hang, dask (the build through Dagster's Dask executor)")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    with throwaway_database() as db:
        if "scaling" in parts:
            scaling(db, db.workdir, args.docs, args.pages, args.workers, args.repeat)
        if "dask" in parts:
            through_dask(db, db.workdir, args.docs, args.pages)
        if "hang" in parts:
            hang(db, db.workdir, args.small_docs, args.timeout)


if __name__ == "__main__":
    main()
