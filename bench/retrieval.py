"""Retrieval on both development sets, each split in two halves: the decisions are made on one, reported on both.

    .venv/bin/python -m bench.retrieval [--sets financebench,mmlongbench] [--workdir .bench/retrieval]
        [--save run.json] [--compare before.json] [--no-ingest] [--vocabulary] [--identity] [--misses]

The sets (never copied into the repository):
  * financebench: ../shared/financebench-dev, 21 SEC filings of nine companies; FinanceBench's 23 questions
    (third-party) and the project's 197 (golden/financebench_dev_extra.jsonl, written for the project: reported
    apart). `--vocabulary` also ranks with the shipped financial-statements vocabulary.
  * mmlongbench: ../shared/mmlongbench-dev, 44 long documents of seven kinds and their 349 third-party questions
    (74 unanswerable), with the evidence's source (plain text, layout text, table, chart, figure).

The halves, fixed here and in docs/retrieval.md ("How ranking decisions are made"):
  * financebench by company: the companies in alphabetical order of their file names' first part, alternately
    "tune" (AMD, COCACOLA, JPMORGAN, LOCKHEEDMARTIN, WALMART) and "held-out" (AMERICANWATERWORKS, GENERALMILLS,
    KRAFTHEINZ, NIKE);
  * mmlongbench by document, stratified by kind: within each kind the documents in order of file name,
    alternately tune and held-out; an unanswerable question (it names no document) by its id's number, even tune,
    odd held-out.
A weight, a threshold or a rule is chosen on "tune" and reported on both; "held-out" is the number that counts.

Each set has an index of its own (an embedded PostgreSQL under --workdir/<set>, kept between runs: a second run
parses nothing that has not changed). Page hit@k: an evidence page among the first k distinct pages of the ranking
(a chunk spanning pages counts for each); document hit@1: the first document ranked holds evidence; abstention: the
share of unanswerable questions with nothing returned. Paired differences are sign-flip permutation tests over the
answerable questions both rankings answered. `--identity` prints how often the title, organisation, kind and
period stored on a document are right, against golden/document_identity.jsonl (checked by hand).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import yaml

from bench.common import REPO, machine
from bench.financebench import DEPTH, paired, score
from rag_pipeline.retrieval.evaluation import GoldQuestion, load_golden

SHARED = REPO.parent / "shared"
LABELS = ["analysts"]
KS = (1, 5, 10)
IDENTITY_TRUTH = REPO / "golden" / "document_identity.jsonl"


@dataclasses.dataclass(frozen=True)
class DevSet:
    name: str
    source: str  # the source's name in the index's configuration
    folder: Path
    question_files: tuple[Path, ...]

    @property
    def pdfs(self) -> Path:
        return self.folder / "pdfs"


SETS = {
    "financebench": DevSet("financebench", "filings", SHARED / "financebench-dev",
                           (SHARED / "financebench-dev" / "golden_dev.jsonl",
                            REPO / "golden" / "financebench_dev_extra.jsonl")),
    "mmlongbench": DevSet("mmlongbench", "documents", SHARED / "mmlongbench-dev", (SHARED / "mmlongbench-dev" / "golden.jsonl",)),
}
PROJECT_WRITTEN = REPO / "golden" / "financebench_dev_extra.jsonl"


@dataclasses.dataclass(frozen=True)
class Question:
    gold: GoldQuestion
    half: str  # "tune" or "held-out"
    origin: str  # "third-party" or "project"
    sources: tuple[str, ...]  # where the evidence is (mmlongbench's evidence_sources), () when not given


def company(doc: str) -> str:
    return doc.split("_", 1)[0]


def halves(devset: DevSet, raw: Sequence[dict]) -> dict[str, str]:
    """Each document's half (see the module's head)."""
    documents = sorted({g["doc"] for q in raw for g in q.get("gold", ())}
                       | {p.name for p in devset.pdfs.glob("*.pdf")})
    if devset.name == "financebench":
        companies = sorted({company(d) for d in documents})
        side = {c: ("tune", "held-out")[i % 2] for i, c in enumerate(companies)}
        return {d: side[company(d)] for d in documents}
    kind_of = {g["doc"]: q["slice"] for q in raw for g in q.get("gold", ()) if q.get("answerable", True)}
    by_kind: dict[str, list[str]] = defaultdict(list)
    for doc in documents:
        by_kind[kind_of.get(doc, "(no question)")].append(doc)
    return {doc: ("tune", "held-out")[i % 2] for docs in by_kind.values() for i, doc in enumerate(sorted(docs))}


def load_questions(devset: DevSet) -> tuple[list[Question], dict[str, str]]:
    raw = [json.loads(line) for path in devset.question_files if path.exists()
           for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    side = halves(devset, raw)
    golden = [q for path in devset.question_files if path.exists() for q in load_golden(path)]
    if len({q.id for q in golden}) != len(golden):
        raise SystemExit(f"{devset.name}: question ids repeat across {devset.question_files}")
    project = {q.id for q in load_golden(PROJECT_WRITTEN)} if PROJECT_WRITTEN.exists() else set()
    extra = {r["id"]: r for r in raw}
    questions = []
    for q in golden:
        if q.gold:
            half = side[q.gold[0].doc]
        else:
            number = int(re.sub(r"\D", "", q.id) or 0)
            half = ("tune", "held-out")[number % 2]
        questions.append(Question(q, half, "project" if q.id in project else "third-party",
                                  tuple(extra[q.id].get("evidence_sources", ()))))
    return questions, side


def settings_for(devset: DevSet, workdir: Path, model: str, vocabulary: bool):
    from rag_pipeline.config import load_settings

    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "rag.yaml"
    query = {"synonyms_file": "builtin:financial_statements"} if vocabulary else {}
    config.write_text(yaml.safe_dump({
        "data_dir": str(workdir / "data"),
        "embedding": {"model": model, "models_dir": str(REPO / ".models")},
        "sources": [{"name": devset.source, "root": str(devset.pdfs), "acl_labels": LABELS}],
        "retrieval": {"query": query},
    }))
    return load_settings(config)


def ingest(settings, name: str) -> None:
    from dagster import DagsterInstance

    from rag_pipeline.defs.runs import run_ingest

    started = time.perf_counter()
    with DagsterInstance.ephemeral() as instance:
        summary = run_ingest(settings, instance=instance, log_level="WARNING")
    if not summary["success"]:
        raise SystemExit(f"{name}: ingest failed: {summary.get('errors')}")
    print(f"{name}: ingest {time.perf_counter() - started:.0f} s")


@dataclasses.dataclass
class Result:
    """One question under one ranking (bench.financebench.Scored with where it belongs)."""

    id: str
    half: str
    origin: str
    kind: str
    sources: list[str]
    answerable: bool
    page_rank: int | None
    doc_rank: int | None
    abstained: bool
    top_pages: list[str]

    def hit(self, k: int) -> float:
        return float(self.page_rank is not None and self.page_rank <= k)

    def mrr(self, k: int = 10) -> float:
        return 1.0 / self.page_rank if self.page_rank and self.page_rank <= k else 0.0


def rankings(settings, vocabulary: bool) -> dict[str, tuple[str, object]]:
    from rag_pipeline.retrieval.search import SearchOptions

    configured = SearchOptions.from_settings(settings)
    plain = dataclasses.replace(configured, query=configured.query.model_copy(update={"synonyms_file": None}))
    named = {"dense": ("dense", plain), "BM25": ("sparse", plain), "hybrid": ("hybrid", plain)}
    if vocabulary:
        named["hybrid + vocabulary"] = ("hybrid", configured)
    return named


def evaluate(settings, questions: Sequence[Question], vocabulary: bool) -> dict[str, list[Result]]:
    from rag_pipeline.retrieval.search import search
    from rag_pipeline.store.database import connect, resolve_urls

    results: dict[str, list[Result]] = {}
    with connect(resolve_urls(settings).index) as conn:
        for name, (mode, options) in rankings(settings, vocabulary).items():
            started = time.perf_counter()
            rows = []
            for q in questions:
                scored = score(q.gold, search(conn, q.gold.question, LABELS, k=DEPTH, mode=mode, options=options))
                rows.append(Result(q.gold.id, q.half, q.origin, q.gold.slice, list(q.sources), q.gold.answerable,
                                   scored.page_rank, scored.doc_rank, scored.abstained, scored.top_pages))
            results[name] = rows
            print(f"  {name}: {len(questions)} questions in {time.perf_counter() - started:.1f} s")
    return results


def variants(settings) -> dict[str, object]:
    """Hybrid with one choice changed at a time from the configured ranking (--sweep): the candidates a default is
    chosen from, on the tune half."""
    from rag_pipeline.retrieval.search import SearchOptions

    base = SearchOptions.from_settings(settings)
    base = dataclasses.replace(base, query=base.query.model_copy(update={"synonyms_file": None}))
    routing = base.routing
    out = {"configured": base}
    for weight in (1.5, 2.0):
        out[f"dense_weight {weight}"] = dataclasses.replace(base, dense_weight=weight)
    for weight in (0.5, 0.75):
        out[f"sparse_weight {weight}"] = dataclasses.replace(base, sparse_weight=weight)
    for offset in (10.0, 30.0):
        out[f"rrf_k {offset:g}"] = dataclasses.replace(base, rrf_k=offset)
    for weight in (0.0, 0.5, 2.0):
        out[f"routing.weight {weight}"] = dataclasses.replace(base, routing=routing.model_copy(update={"weight": weight}))
    for share in (0.3, 1.0):
        out[f"routing.max_share {share}"] = dataclasses.replace(
            base, routing=routing.model_copy(update={"max_share": share}))
    for weight in (0.25, 0.5):
        out[f"page_weight {weight}"] = dataclasses.replace(base, page_weight=weight)
    for depth in (80, 150):
        out[f"candidates {depth}"] = dataclasses.replace(base, candidates=depth)
    out["no abstention rules"] = dataclasses.replace(base, abstention=base.abstention.model_copy(
        update={"unknown_names": False, "period_lookback_years": None}))
    return out


def sweep(settings, questions: Sequence[Question], name: str) -> None:
    """Each variant's page hit@5 (answerable) and abstention (unanswerable), per half and origin, with the paired
    difference against the configured ranking on the tune half."""
    from rag_pipeline.retrieval.search import search
    from rag_pipeline.store.database import connect, resolve_urls

    results: dict[str, list[Result]] = {}
    with connect(resolve_urls(settings).index) as conn:
        for label, options in variants(settings).items():
            rows = []
            for q in questions:
                scored = score(q.gold, search(conn, q.gold.question, LABELS, k=DEPTH, mode="hybrid", options=options))
                rows.append(Result(q.gold.id, q.half, q.origin, q.gold.slice, list(q.sources), q.gold.answerable,
                                   scored.page_rank, scored.doc_rank, scored.abstained, scored.top_pages))
            results[label] = rows
    cells = [(h, o) for h in ("tune", "held-out") for o in ("third-party", "project")
             if any(r.half == h and r.origin == o for r in results["configured"])]
    print(f"\n{name}: hybrid variants, page hit@5 / abstention; decide on tune, report held-out\n| variant | "
          + " | ".join(f"{h} {o}" for h, o in cells) + " | tune vs configured |\n|---|" + "---|" * (len(cells) + 1))
    for label, rows in results.items():
        row = []
        for h, o in cells:
            m = metrics([r for r in rows if r.half == h and r.origin == o])
            row.append(f"{m.get('hit@5', 0):.3f}" + (f" / {m['abstention']:.2f}" if "abstention" in m else ""))
        tune = [r for r in rows if r.half == "tune"]
        row.append(significance([r for r in results["configured"] if r.half == "tune"], tune))
        print(f"| {label} | " + " | ".join(row) + " |")


def floors(settings, questions: Sequence[Question], name: str) -> None:
    """Cosine floors (retrieval.min_similarity) against abstention and page hit@5, from one search per question
    (approximately: the floor applied after fusion, where the SQL applies it to the fused candidates)."""
    from rag_pipeline.retrieval.search import SearchOptions, search
    from rag_pipeline.store.database import connect, resolve_urls

    options = dataclasses.replace(SearchOptions.from_settings(settings), min_similarity=None)
    options = dataclasses.replace(options, query=options.query.model_copy(update={"synonyms_file": None}))
    with connect(resolve_urls(settings).index) as conn:
        fetched = [(q, search(conn, q.gold.question, LABELS, k=DEPTH, mode="hybrid", options=options))
                   for q in questions]
    print(f"\n{name}: score floor, page hit@5 / abstention per half\n| floor | tune | held-out |\n|---|---|---|")
    for floor in (None, 0.2, 0.25, 0.3, 0.35, 0.4):
        cells = []
        for half in ("tune", "held-out"):
            rows = []
            for q, hits in fetched:
                if q.half != half:
                    continue
                # as retrieval.min_similarity ranks: only chunks at least that similar (none: abstain)
                kept = hits if floor is None else [h for h in hits if (h.similarity or 0.0) >= floor]
                scored = score(q.gold, kept)
                rows.append(Result(q.gold.id, q.half, q.origin, q.gold.slice, [], q.gold.answerable,
                                   scored.page_rank, scored.doc_rank, scored.abstained, []))
            m = metrics(rows)
            cells.append(f"{m.get('hit@5', 0):.3f} / {m.get('abstention', 0):.2f}")
        print(f"| {floor} | " + " | ".join(cells) + " |")


def metrics(rows: Sequence[Result]) -> dict[str, float]:
    answerable = [r for r in rows if r.answerable]
    row: dict[str, float] = {"n": len(answerable)}
    if answerable:
        for k in KS:
            row[f"hit@{k}"] = float(np.mean([r.hit(k) for r in answerable]))
        row["MRR@10"] = float(np.mean([r.mrr() for r in answerable]))
        row["doc hit@1"] = float(np.mean([r.doc_rank == 1 for r in answerable]))
    unanswerable = [r for r in rows if not r.answerable]
    if unanswerable:
        row["unanswerable"] = len(unanswerable)
        row["abstention"] = float(np.mean([r.abstained for r in unanswerable]))
    return row


COLUMNS = ("n", "hit@1", "hit@5", "hit@10", "MRR@10", "doc hit@1", "unanswerable", "abstention")


def print_rows(title: str, rows: dict[str, dict[str, float]]) -> None:
    columns = [c for c in COLUMNS if any(c in row for row in rows.values())]
    print(f"\n{title}\n| | " + " | ".join(columns) + " |\n|---|" + "---|" * len(columns))
    for name, row in rows.items():
        cells = [(f"{row[c]:.0f}" if c in ("n", "unanswerable") else f"{row[c]:.3f}") if c in row else ""
                 for c in columns]
        print(f"| {name} | " + " | ".join(cells) + " |")


def groups(rows: Sequence[Result]) -> dict[str, list[Result]]:
    """The slices a set is reported in: each half by origin, then per kind and per evidence source."""
    out: dict[str, list[Result]] = defaultdict(list)
    for r in rows:
        out[f"{r.half}, {r.origin}"].append(r)
    for r in rows:
        out[f"{r.half}, kind {r.kind if r.answerable else 'unanswerable'}"].append(r)
        for source in r.sources:
            out[f"{r.half}, evidence {source}"].append(r)
    return dict(sorted(out.items(), key=lambda item: (item[0].split(",")[0] != "held-out", item[0])))


def significance(a: Sequence[Result], b: Sequence[Result]) -> str:
    diff, p, _ = paired(a, b, lambda r: r.hit(5))
    return f"{diff:+.3f} (p={p:.3f}{', real' if p < 0.05 else ''})"


def report(name: str, results: dict[str, list[Result]], before: dict[str, list[Result]] | None) -> None:
    for ranking, rows in results.items():
        print_rows(f"{name}, {ranking}", {label: metrics(members) for label, members in groups(rows).items()})
    print(f"\n{name}: paired page hit@5 differences")
    header = ["hybrid - dense", "hybrid - BM25"] + ([f"{r}: now - before" for r in results if r in before]
                                                    if before else [])
    print("| slice | " + " | ".join(header) + " |\n|---|" + "---|" * len(header))
    slices: dict[str, Callable[[Result], bool]] = {
        f"{half}, {origin}": (lambda r, h=half, o=origin: r.half == h and r.origin == o)
        for half in ("tune", "held-out") for origin in ("third-party", "project")}
    # where the evidence is (a chart, a figure, a table, layout or plain text), each half apart
    sources = sorted({source for r in results["hybrid"] for source in r.sources})
    slices |= {f"{half}, evidence {source}": (lambda r, h=half, s=source: r.half == h and s in r.sources)
               for half in ("tune", "held-out") for source in sources}
    slices["both halves, all"] = lambda r: True
    for label, keep in slices.items():
        subset = {ranking: [r for r in rows if keep(r)] for ranking, rows in results.items()}
        if not any(r.answerable for r in subset["hybrid"]):
            continue
        cells = [significance(subset["dense"], subset["hybrid"]), significance(subset["BM25"], subset["hybrid"])]
        if before:
            cells += [significance([r for r in before[ranking] if keep(r)], subset[ranking])
                      for ranking in results if ranking in before]
        print(f"| {label} | " + " | ".join(cells) + " |")


def identity_accuracy(settings_by_set: dict[str, object]) -> None:
    """The share of hand-checked documents whose stored title, organisation, kind and period are right."""
    import psycopg

    from rag_pipeline.store.database import resolve_urls

    if not IDENTITY_TRUTH.exists():
        print(f"\nidentity: {IDENTITY_TRUTH} is missing")
        return
    truth = [json.loads(line) for line in IDENTITY_TRUTH.read_text().splitlines() if line.strip()]
    fields = ("title", "organisation", "kind", "period")
    print("\ndocument identity against golden/document_identity.jsonl (checked by hand)\n| set | documents | "
          + " | ".join(fields) + " |\n|---|---|" + "---|" * len(fields))
    for set_name, settings in settings_by_set.items():
        wanted = [t for t in truth if t["set"] == set_name]
        if not wanted:
            continue
        with psycopg.connect(resolve_urls(settings, start=False).index) as conn:
            stored = {path: identity for path, identity in conn.execute(
                "SELECT rel_path, rag.document_identity(title, metadata, identity) FROM documents")}
        right = {f: 0 for f in fields}
        for t in wanted:
            got = stored.get(t["doc"]) or {}
            for f in fields:
                right[f] += identity_matches(f, t.get(f), got)
        print(f"| {set_name} | {len(wanted)} | " + " | ".join(f"{right[f] / len(wanted):.2f}" for f in fields) + " |")


def _words(text: str | None) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", (text or "").lower()))


def identity_matches(field: str, expected, got: dict) -> bool:
    """Title and organisation: the stored value holds the expected one's words (case and punctuation aside);
    kind: equal; period: the fiscal year and quarter equal (a document with no period expects none)."""
    if field == "period":
        expected = expected or {}
        return (got.get("fiscal_year"), got.get("quarter")) == (expected.get("fiscal_year"), expected.get("quarter"))
    if expected is None:
        return not got.get(field)
    if field == "kind":
        return got.get("kind") == expected
    return bool(_words(expected)) and _words(expected) <= _words(got.get(field))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", default="financebench,mmlongbench")
    parser.add_argument("--workdir", type=Path, default=REPO / ".bench" / "retrieval")
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--no-ingest", action="store_true", help="evaluate the indexes as they are")
    parser.add_argument("--vocabulary", action="store_true", help="financebench: also rank with the shipped "
                        "financial-statements vocabulary")
    parser.add_argument("--identity", action="store_true", help="also score the documents' stored identity")
    parser.add_argument("--save", type=Path, help="write every question's ranks here (JSON)")
    parser.add_argument("--compare", type=Path, help="a saved run (--save): paired differences against it")
    parser.add_argument("--misses", action="store_true", help="list held-out questions hybrid misses at 5")
    parser.add_argument("--sweep", action="store_true", help="hybrid with one choice changed at a time, per half")
    parser.add_argument("--floors", action="store_true", help="abstention and page hit@5 against a score floor "
                        "on the best hit")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    chosen = [SETS[name] for name in args.sets.split(",")]
    missing = [str(s.pdfs) for s in chosen if not s.pdfs.is_dir()]
    if missing:
        raise SystemExit(f"missing: {', '.join(missing)} (this benchmark reads the real documents there)")
    before = json.loads(args.compare.read_text()) if args.compare else {}
    print(f"machine: {machine()}; {args.model}")
    saved: dict[str, dict[str, list[dict]]] = {}
    settings_by_set = {}
    for devset in chosen:
        questions, side = load_questions(devset)
        settings = settings_for(devset, args.workdir.resolve() / devset.name, args.model,
                                args.vocabulary and devset.name == "financebench")
        settings_by_set[devset.name] = settings
        if not args.no_ingest:
            ingest(settings, devset.name)
        count = defaultdict(int)
        for q in questions:
            count[(q.half, q.origin, q.gold.answerable)] += 1
        print(f"\n## {devset.name}: {len(side)} documents (tune {sum(v == 'tune' for v in side.values())}), "
              f"{len(questions)} questions: " + ", ".join(
                  f"{h} {o} {'answerable' if a else 'unanswerable'} {n}" for (h, o, a), n in sorted(count.items())))
        if args.sweep or args.floors:
            if args.sweep:
                sweep(settings, questions, devset.name)
            if args.floors:
                floors(settings, questions, devset.name)
            continue
        results = evaluate(settings, questions, args.vocabulary and devset.name == "financebench")
        earlier = {ranking: [Result(**row) for row in rows]
                   for ranking, rows in before.get(devset.name, {}).items()}
        report(devset.name, results, earlier or None)
        saved[devset.name] = {ranking: [dataclasses.asdict(r) for r in rows] for ranking, rows in results.items()}
        if args.misses:
            by_id = {q.gold.id: q.gold for q in questions}
            for r in results["hybrid"]:
                if r.half == "held-out" and r.answerable and not r.hit(5):
                    gold = "; ".join(f"{g.doc}#{','.join(map(str, g.pages))}" for g in by_id[r.id].gold)
                    asked = " ".join(by_id[r.id].question.split())[:160]
                    print(f"- {r.id} [{r.kind}; {','.join(r.sources)}] rank {r.page_rank}; gold {gold}; "
                          f"top {r.top_pages[:3]}\n    {asked}")
    if args.identity:
        identity_accuracy(settings_by_set)
    if args.save:
        args.save.write_text(json.dumps(saved, indent=1))


if __name__ == "__main__":
    main()
