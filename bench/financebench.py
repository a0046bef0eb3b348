"""Real SEC filings: FinanceBench's filings and analyst questions (../shared/financebench-dev) plus the project's
own questions about the same filings (golden/financebench_dev_extra.jsonl), ranked by the index this project
builds from them. Prints page hit@1/5/10, MRR@10 and document hit for each ranking, per question kind, abstention
on the unanswerable questions, and paired significance between rankings (and against a saved run).

    .venv/bin/python -m bench.financebench [--workdir .bench/financebench] [--model all-MiniLM-L6-v2]
        [--save results.json] [--compare results.json] [--structure] [--no-ingest]

The index lives in --workdir (an embedded PostgreSQL and its data) and is kept between runs: a second run parses
nothing that has not changed (a new parser or chunker version re-parses or re-chunks, as in production), so a
ranking change costs one evaluation. The filings are never copied into the repository; the questions written for
the project say in `checked` how each evidence page was read.

A page is "hit at k" when one of the question's evidence pages is among the first k distinct pages of the
ranking (a chunk spanning pages counts for each). The generated look-alike filings (bench.golden_filings) are a
unit check of document routing, not evidence about real filings: this is the benchmark for retrieval work.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import yaml

from bench.common import REPO, machine
from rag_pipeline.retrieval.evaluation import GoldQuestion, load_golden

DEV_SET = REPO.parent / "shared" / "financebench-dev"
EXTRA_QUESTIONS = REPO / "golden" / "financebench_dev_extra.jsonl"
LABELS = ["analysts"]
KS = (1, 5, 10)
DEPTH = 30  # chunks fetched per question: enough distinct pages for hit@10
ALIASES = {"AMD": ["Advanced Micro Devices"], "AWK": ["American Water Works"], "KO": ["Coca-Cola"],
           "GIS": ["General Mills"], "JPM": ["JPMorgan Chase"], "KHC": ["Kraft Heinz"], "LMT": ["Lockheed Martin"],
           "NKE": ["Nike"], "WMT": ["Walmart"]}


def questions() -> list[GoldQuestion]:
    """FinanceBench's questions, then ours (ids must not clash)."""
    merged = load_golden(DEV_SET / "golden_dev.jsonl")
    if EXTRA_QUESTIONS.exists():
        merged += load_golden(EXTRA_QUESTIONS)
    if len({q.id for q in merged}) != len(merged):
        raise SystemExit(f"{EXTRA_QUESTIONS}: a question id repeats one of the dev set's")
    return merged


def settings_for(workdir: Path, model: str):
    from rag_pipeline.config import load_settings

    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "rag.yaml"
    config.write_text(yaml.safe_dump({
        "data_dir": str(workdir / "data"),
        "embedding": {"model": model, "models_dir": str(REPO / ".models")},
        "sources": [{"name": "filings", "root": str(DEV_SET / "pdfs"), "acl_labels": LABELS}],
        # the shipped vocabulary, and the tickers analysts use for the nine companies (configuration, as a
        # deployment would write it for its own documents)
        "retrieval": {"query": {"synonyms_file": "builtin:financial_statements", "aliases": ALIASES}},
    }))
    return load_settings(config)


def ingest(settings) -> dict:
    from dagster import DagsterInstance

    from rag_pipeline.defs.runs import run_ingest

    started = time.perf_counter()
    with DagsterInstance.ephemeral() as instance:
        summary = run_ingest(settings, instance=instance, log_level="WARNING")
    if not summary["success"]:
        raise SystemExit(f"ingest failed: {summary.get('errors')}")
    print(f"ingest: {time.perf_counter() - started:.0f} s")
    return summary


@dataclasses.dataclass
class Scored:
    """One question under one ranking."""

    id: str
    kind: str
    answerable: bool
    page_rank: int | None  # rank (1-based) of the first evidence page among distinct pages, None: not in DEPTH
    doc_rank: int | None  # rank of the first evidence document among distinct documents
    abstained: bool
    top_pages: list[str]

    def hit(self, k: int) -> float:
        return float(self.page_rank is not None and self.page_rank <= k)

    def mrr(self, k: int = 10) -> float:
        return 1.0 / self.page_rank if self.page_rank and self.page_rank <= k else 0.0


def distinct_pages(hits) -> list[tuple[str, int]]:
    seen: list[tuple[str, int]] = []
    for hit in hits:
        for page in range(hit.page_start, hit.page_end + 1):
            if (hit.path, page) not in seen:
                seen.append((hit.path, page))
    return seen


def score(question: GoldQuestion, hits) -> Scored:
    pages = distinct_pages(hits)
    documents = list(dict.fromkeys(path for path, _ in pages))
    gold_pages = {(g.doc, p) for g in question.gold for p in g.pages}
    gold_docs = {g.doc for g in question.gold}
    page_rank = next((rank for rank, page in enumerate(pages, 1) if page in gold_pages), None)
    doc_rank = next((rank for rank, doc in enumerate(documents, 1) if doc in gold_docs), None)
    return Scored(question.id, question.slice, question.answerable, page_rank, doc_rank, not hits,
                  [f"{path}#{page}" for path, page in pages[:5]])


def summary(results: Sequence[Scored]) -> dict[str, dict[str, float]]:
    groups: dict[str, list[Scored]] = defaultdict(list)
    for result in results:
        groups["overall"].append(result)
        groups[result.kind].append(result)
        # FinanceBench's own questions apart from the ones written for the project
        groups["(FinanceBench's)" if result.id.startswith("financebench_") else "(the project's)"].append(result)
    table = {}
    for name, members in groups.items():
        answerable = [r for r in members if r.answerable]
        row: dict[str, float] = {"n": len(answerable)}
        if answerable:
            for k in KS:
                row[f"page hit@{k}"] = float(np.mean([r.hit(k) for r in answerable]))
            row["MRR@10"] = float(np.mean([r.mrr() for r in answerable]))
            row["doc hit@1"] = float(np.mean([r.doc_rank == 1 for r in answerable]))
            row["doc hit@5"] = float(np.mean([r.doc_rank is not None and r.doc_rank <= 5 for r in answerable]))
        unanswerable = [r for r in members if not r.answerable]
        if unanswerable:
            row["abstention"] = float(np.mean([r.abstained for r in unanswerable]))
        table[name] = row
    return table


def paired(a: Sequence[Scored], b: Sequence[Scored], metric, seed: int = 0) -> tuple[float, float, float]:
    """Mean difference b - a over the answerable questions both hold, its p-value by a sign-flip permutation
    test (10,000 resamples) and the share of questions that changed."""
    by_id = {r.id: r for r in a if r.answerable}
    pairs = [(by_id[r.id], r) for r in b if r.answerable and r.id in by_id]
    delta = np.array([metric(y) - metric(x) for x, y in pairs])
    if not len(delta) or not delta.any():
        return 0.0, 1.0, 0.0
    rng = np.random.default_rng(seed)
    flipped = (delta * rng.choice((-1.0, 1.0), size=(10_000, len(delta)))).mean(axis=1)
    p_value = float((np.sum(np.abs(flipped) >= abs(delta.mean()) - 1e-12) + 1) / 10_001)
    return float(delta.mean()), p_value, float(np.mean(delta != 0))


def print_table(name: str, table: dict[str, dict[str, float]]) -> None:
    columns = [c for c in ("n", "page hit@1", "page hit@5", "page hit@10", "MRR@10", "doc hit@1", "doc hit@5",
                           "abstention") if any(c in row for row in table.values())]
    print(f"\n{name}\n| kind | " + " | ".join(columns) + " |\n|---|" + "---|" * len(columns))
    for kind in sorted(table, key=lambda k: (k != "overall", k.startswith("("), k)):
        row = table[kind]
        cells = [f"{row[c]:.0f}" if c == "n" else (f"{row[c]:.3f}" if c in row else "") for c in columns]
        print(f"| {kind} | " + " | ".join(cells) + " |")


def rankings(settings, plain: bool) -> dict[str, tuple[str, object]]:
    """dense, BM25 and hybrid as configured; `plain`: without page support and without reading the query (its
    aliases, instructions and synonyms), as the ranking was before they existed."""
    from rag_pipeline.config import QueryConfig
    from rag_pipeline.retrieval.search import SearchOptions

    base = SearchOptions.from_settings(settings)
    if plain:
        base = dataclasses.replace(base, page_weight=0.0, query=QueryConfig(instruction_patterns=()))
    return {"dense": ("dense", base), "sparse (BM25)": ("sparse", base), "hybrid": ("hybrid", base)}


def evaluate_all(settings, golden: Sequence[GoldQuestion], plain: bool = False) -> dict[str, list[Scored]]:
    from rag_pipeline.retrieval.search import search
    from rag_pipeline.store.database import connect, resolve_urls

    results: dict[str, list[Scored]] = {}
    with connect(resolve_urls(settings).index) as conn:
        for name, (mode, options) in rankings(settings, plain).items():
            started = time.perf_counter()
            results[name] = [score(q, search(conn, q.question, LABELS, k=DEPTH, mode=mode, options=options))
                             for q in golden]
            print(f"{name}: {len(golden)} questions in {time.perf_counter() - started:.1f} s")
    return results


def ablation(settings, golden: Sequence[GoldQuestion]) -> None:
    """Hybrid page hit@5 and MRR@10 with one part of the ranking changed at a time, each against the configured
    ranking with a paired test."""
    from rag_pipeline.config import QueryConfig
    from rag_pipeline.retrieval.search import SearchOptions, search
    from rag_pipeline.store.database import connect, resolve_urls

    base = SearchOptions.from_settings(settings)
    query = base.query
    variants = {
        "configured": base,
        "page_weight 0": dataclasses.replace(base, page_weight=0.0),
        "page_weight 0.25": dataclasses.replace(base, page_weight=0.25),
        "page_weight 1": dataclasses.replace(base, page_weight=1.0),
        "no aliases": dataclasses.replace(base, query=query.model_copy(update={"aliases": {}})),
        "no synonyms": dataclasses.replace(base, query=query.model_copy(update={"synonyms_file": None})),
        "synonyms not in the dense query": dataclasses.replace(
            base, query=query.model_copy(update={"expand_dense": False})),
        "instructions kept": dataclasses.replace(base, query=query.model_copy(update={"instruction_patterns": ()})),
        "no query reading": dataclasses.replace(base, query=QueryConfig(instruction_patterns=())),
    }
    with connect(resolve_urls(settings).index) as conn:
        results = {name: [score(q, search(conn, q.question, LABELS, k=DEPTH, mode="hybrid", options=options))
                          for q in golden] for name, options in variants.items()}
    print("\n| hybrid variant | page hit@1 | page hit@5 | MRR@10 | vs configured, page hit@5 |\n|---|---|---|---|---|")
    for name, scored in results.items():
        row = summary(scored)["overall"]
        diff, p, _ = paired(results["configured"], scored, lambda r: r.hit(5))
        print(f"| {name} | {row['page hit@1']:.3f} | {row['page hit@5']:.3f} | {row['MRR@10']:.3f} | "
              f"{diff:+.3f} (p={p:.3f}) |")


def abstention_sweep(settings, golden: Sequence[GoldQuestion], floors: Sequence[float]) -> None:
    """Page hit@5 of the answerable questions against abstention on the unanswerable ones, for each score floor
    (retrieval.min_similarity), from one hybrid search per question."""
    from rag_pipeline.retrieval.search import SearchOptions, search
    from rag_pipeline.store.database import connect, resolve_urls

    options = dataclasses.replace(SearchOptions.from_settings(settings), min_similarity=None)
    with connect(resolve_urls(settings).index) as conn:
        fetched = [(q, search(conn, q.question, LABELS, k=DEPTH, mode="hybrid", options=options)) for q in golden]
    print("\n| floor (cosine) | page hit@5 | abstention |\n|---|---|---|")
    for floor in floors:
        results = [score(q, [h for h in hits if h.similarity is not None and h.similarity >= floor])
                   for q, hits in fetched]
        row = summary(results)["overall"]
        print(f"| {floor:.2f} | {row.get('page hit@5', 0):.3f} | {row.get('abstention', 0):.3f} |")


def structure_measures(settings) -> None:
    """What the index holds for statement pages and titles (issue: real filings): the share of statement-table
    chunks whose caption or section path names their own statement, the share of chunks whose section path holds a
    contents line, tables that are prose, and words split by character spacing."""
    import psycopg

    from rag_pipeline.embedding.locations import load_tokenizer, resolve_model
    from rag_pipeline.store.database import resolve_urls
    from rag_pipeline.text import structure

    tokenizer = load_tokenizer(resolve_model(settings.embedding.model, settings.embedding.models_dir).location)
    kinds = (("cash", r"cash\s+flow"), ("balance", r"balance\s+sheet|financial\s+(position|condition)"),
             ("equity", r"equity|investment|deficit|retained"), ("comprehensive", r"comprehensive"),
             ("income", r"income|operations|earnings|loss"))

    def kind(text: str) -> str | None:
        name = structure.statement_name(text) if text else None
        return next((k for k, pattern in kinds if re.search(pattern, name, re.I)), None) if name else None

    with psycopg.connect(resolve_urls(settings, start=False).index) as conn:
        pages = {(d, p): md for d, p, md in conn.execute("SELECT doc_id, page, markdown FROM document_pages")}
        chunks = conn.execute("SELECT doc_id, page_start, content_type, section_path, text FROM chunks").fetchall()
    page_kind = {}
    for key, markdown in pages.items():
        head = [line for line in markdown.split("\n") if line.strip() and not line.startswith("|")][:8]
        page_kind[key] = next((k for k in map(kind, head) if k), None)
    statement_tables = named = contents = prose_tables = split = 0
    for doc, page, content_type, path, text in chunks:
        parts = path.split(" › ") if path else []
        contents += any(structure.is_contents_entry(part) for part in parts)
        if content_type == "table":
            first = text.split("\n", 1)[0]
            body = "\n".join(line for line in text.split("\n") if line.startswith("|"))
            prose_tables += structure.prose_of_table(body) is not None
            wanted = page_kind.get((doc, page))
            if wanted:
                statement_tables += 1
                named += wanted in {kind(first.removeprefix("Table: ").split(" — ")[-1]) if first.startswith("Table")
                                    else None, *(kind(part) for part in parts),
                                    *(kind(piece) for piece in first.removeprefix("Table: ").split(" — "))}
        split += structure.join_split_words(text, lambda w: len(tokenizer.tokenize(w)) == 1) != text
    total = max(len(chunks), 1)
    print(f"\nstructure: {len(chunks)} chunks; statement-table chunks naming their statement "
          f"{named}/{statement_tables} = {named / max(statement_tables, 1):.3f}; section paths holding a contents "
          f"line {contents / total:.3f} ({contents}); prose tables {prose_tables}; chunks with split words {split}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=REPO / ".bench" / "financebench")
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--no-ingest", action="store_true", help="evaluate the index as it is")
    parser.add_argument("--ingest-only", action="store_true")
    parser.add_argument("--save", type=Path, help="write every question's ranks here (JSON)")
    parser.add_argument("--compare", type=Path, help="a saved run: paired differences against it")
    parser.add_argument("--show-misses", action="store_true", help="list questions whose page is not in the top 5")
    parser.add_argument("--plain", action="store_true", help="rank without page support and without reading the "
                        "query (aliases, instructions, synonyms): the ranking before they existed")
    parser.add_argument("--structure", action="store_true", help="also measure section paths, statement captions, "
                        "prose tables and split words in the index")
    parser.add_argument("--ablation", action="store_true", help="hybrid with one part of the ranking changed at a "
                        "time")
    parser.add_argument("--floors", default="", help="comma-separated cosine floors: abstention against page hit@5")
    args = parser.parse_args()
    if not (DEV_SET / "pdfs").is_dir():
        raise SystemExit(f"{DEV_SET} is missing: this benchmark reads the real filings there")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    settings = settings_for(args.workdir.resolve(), args.model)
    golden = questions()
    if not args.no_ingest:
        ingest(settings)
    if args.ingest_only:
        return
    kinds = defaultdict(int)
    for q in golden:
        kinds[q.slice if q.answerable else "unanswerable"] += 1
    print(f"machine: {machine()}; {len(list((DEV_SET / 'pdfs').glob('*.pdf')))} filings, {len(golden)} questions "
          f"({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))}), {args.model}")
    if args.structure:
        structure_measures(settings)
    results = evaluate_all(settings, golden, plain=args.plain)
    for name, scored in results.items():
        print_table(name, summary(scored))
    print("\npaired differences (sign-flip permutation test; 'real' when p < 0.05):")
    for a, b in (("dense", "hybrid"), ("sparse (BM25)", "hybrid")):
        for label, metric in (("page hit@5", lambda r: r.hit(5)), ("MRR@10", Scored.mrr)):
            diff, p, changed = paired(results[a], results[b], metric)
            print(f"  {b} vs {a}, {label}: {diff:+.3f} (p={p:.4f}, {changed:.0%} of questions differ)"
                  f"{' real' if p < 0.05 else ' not significant'}")
    if args.compare:
        saved = {name: [Scored(**row) for row in rows] for name, rows in json.loads(args.compare.read_text()).items()}
        print(f"\nagainst {args.compare}:")
        for name in results:
            if name in saved:
                for label, metric in (("page hit@5", lambda r: r.hit(5)), ("MRR@10", Scored.mrr)):
                    diff, p, changed = paired(saved[name], results[name], metric)
                    print(f"  {name}, {label}: {diff:+.3f} (p={p:.4f}, {changed:.0%} differ)"
                          f"{' real' if p < 0.05 else ' not significant'}")
    if args.show_misses:
        by_id = {q.id: q for q in golden}
        for r in results["hybrid"]:
            if r.answerable and not r.hit(5):
                gold = "; ".join(f"{g.doc}#{','.join(map(str, g.pages))}" for g in by_id[r.id].gold)
                asked = re.sub(r"\s+", " ", by_id[r.id].question)[:160]
                print(f"- {r.id} [{r.kind}] rank {r.page_rank}; gold {gold}; top {r.top_pages[:3]}\n    {asked}")
    if args.ablation:
        ablation(settings, golden)
    if args.floors:
        abstention_sweep(settings, golden, [float(f) for f in args.floors.split(",")])
    if args.save:
        args.save.write_text(json.dumps({name: [dataclasses.asdict(r) for r in scored]
                                         for name, scored in results.items()}, indent=1))


if __name__ == "__main__":
    main()
