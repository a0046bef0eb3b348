"""Fusion weights tuned on one half of a golden set and reported on the other, so the number reported was not
fitted: the questions are split by a hash of their id; on the tuning half every (sparse weight, routing weight)
of a grid is scored by nDCG@k; the best is then compared, on the report half, with dense and sparse alone and
with equal weights, with paired significance.

    .venv/bin/python -m bench.tune_fusion --golden golden/pg_manual.jsonl --labels docs [--config rag.yaml]

It searches the index the configuration names (ingest the golden set's corpus there first).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
from pathlib import Path

from rag_pipeline.config import load_settings
from rag_pipeline.retrieval.evaluation import evaluate, load_golden, paired_differences
from rag_pipeline.retrieval.search import SearchOptions
from rag_pipeline.store.database import connect, resolve_urls

SPARSE_WEIGHTS = (0.0, 0.1, 0.25, 0.5, 0.75, 1.0)
ROUTING_WEIGHTS = (0.0, 0.5, 1.0)


def half(question_id: str) -> str:
    return "tune" if int(hashlib.sha256(question_id.encode()).hexdigest(), 16) % 2 == 0 else "report"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--golden", required=True)
    parser.add_argument("--labels", required=True)
    parser.add_argument("--config")
    parser.add_argument("-k", type=int, default=10)
    args = parser.parse_args()
    settings = load_settings(args.config)
    questions = load_golden(Path(args.golden))
    tune = [q for q in questions if half(q.id) == "tune"]
    report = [q for q in questions if half(q.id) == "report"]
    labels = args.labels.split(",")
    base = SearchOptions.from_settings(settings)

    def options(sparse: float, routing: float) -> SearchOptions:
        return dataclasses.replace(base, dense_weight=1.0, sparse_weight=sparse,
                                   routing=base.routing.model_copy(update={"enabled": routing > 0, "weight": routing}))

    with connect(resolve_urls(settings).index) as conn:
        grid = {}
        for sparse, routing in itertools.product(SPARSE_WEIGHTS, ROUTING_WEIGHTS):
            result = evaluate(conn, tune, labels, k=args.k, mode="hybrid", options=options(sparse, routing))
            grid[(sparse, routing)] = result.metrics["overall"]["ndcg@k"]
        best = max(grid, key=lambda key: (grid[key], -key[0], -key[1]))
        print(f"{len(tune)} tuning / {len(report)} report questions, k={args.k}")
        print("| sparse weight | routing weight | nDCG@k (tuning half) |\n|---|---|---|")
        for (sparse, routing), value in sorted(grid.items()):
            print(f"| {sparse} | {routing} | {value}{' **best**' if (sparse, routing) == best else ''} |")
        runs = {
            "dense": evaluate(conn, report, labels, k=args.k, mode="dense", options=options(0.0, 0.0)),
            "sparse": evaluate(conn, report, labels, k=args.k, mode="sparse", options=options(1.0, 0.0)),
            "hybrid 1:1": evaluate(conn, report, labels, k=args.k, mode="hybrid", options=options(1.0, 0.0)),
            f"hybrid tuned {best}": evaluate(conn, report, labels, k=args.k, mode="hybrid", options=options(*best)),
        }
    print("\nreport half:\n| ranking | hit@k | recall@k | MRR | nDCG@k |\n|---|---|---|---|---|")
    for name, result in runs.items():
        o = result.metrics["overall"]
        print(f"| {name} | {o['hit@k']} | {o['recall@k']} | {o['mrr']} | {o['ndcg@k']} |")
    tuned = runs[f"hybrid tuned {best}"]
    for other in ("dense", "sparse", "hybrid 1:1"):
        for d in paired_differences(runs[other].results, tuned.results):
            if d.metric in ("recall@k", "ndcg@k"):
                print(f"  tuned vs {other}: {d.describe()} {'real' if d.significant else 'not significant'}")


if __name__ == "__main__":
    main()
