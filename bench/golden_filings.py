"""Look-alike filings: generated annual reports of made-up companies, one per company and fiscal year, written from
one template (as 10-Ks are), with analyst questions that name the company and the period, and the filing each
question must be answered from. Prints hit@1, hit@5 and MRR (document level) for each ranking, with document
routing on and off, and paired significance of routing.

    .venv/bin/python -m bench.golden_filings [--companies 12] [--years 2019,2020,2021] [--model all-MiniLM-L6-v2]

The question a user asks of forty filings ("What is the FY2019 capital expenditure of 3M?") has its answer's
words in every filing: only the company and the period tell which. This measures whether the index finds the
filing the question names. The generator is not any benchmark's data: it exercises the mechanism (names in file
names and text, periods in tables and comparatives), not a corpus's vocabulary.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
from pathlib import Path

import yaml
from dagster import DagsterInstance

from bench.common import REPO, machine, throwaway_database
from rag_pipeline.config import load_settings
from rag_pipeline.evaluation import evaluate, load_golden, paired_differences
from rag_pipeline.retrieval import SearchOptions
from rag_pipeline.runs import run_ingest
from rag_pipeline.store.database import connect, resolve_urls

# (name as the text says it, what it does); file names squash the name, as EDGAR-derived sets do (COCACOLA_2021_10K)
COMPANIES = [
    ("Globex", "specialty chemical coatings for ships and bridges"),
    ("Blue Harbor", "container shipping between Asia and Europe"),
    ("Acu-Tek", "payroll and workforce software for hospitals"),
    ("Northwind Traders", "wholesale food distribution to restaurants"),
    ("Vandelay Industries", "latex gloves and medical disposables"),
    ("Stark Dynamics", "avionics and flight-control systems"),
    ("Umbra Energy", "natural gas pipelines and storage"),
    ("Kestrel", "regional airline service"),
    ("Pioneer Mills", "flour, pasta and baking mixes"),
    ("Helix Bio", "contract manufacturing of biologic drugs"),
    ("Orbital Freight", "satellite launch and logistics services"),
    ("Cinder Retail", "discount home-improvement stores"),
    ("Tessellate", "semiconductor design tools"),
    ("Marlow & Finch", "insurance brokerage for small businesses"),
    ("Quanta Rail", "freight railcars and leasing"),
    ("Sable Foods", "frozen meals and snacks"),
]
RISKS = (
    "Our results depend on general economic conditions. A downturn could reduce demand for our products and "
    "services and increase the credit risk of our customers. We face intense competition, and competitors may "
    "develop products that are cheaper or better than ours. Changes in tax law, trade policy or interest rates "
    "could reduce our earnings. Cyber attacks on our systems could disrupt operations and expose confidential data."
)
QUESTIONS = (
    ("cash flow", "What is the FY{year} capital expenditure amount (in USD millions) for {company}? Give a response "
                  "to the question by relying on the details shown in the cash flow statement."),
    ("income statement", "What was {company}'s total revenue in FY{year}?"),
    ("income statement", "Using the income statement, what was the operating income of {company} for fiscal year "
                         "{year}?"),
    ("business", "How many people did {company} employ at the end of {year}?"),
    ("balance sheet", "What were {company}'s total assets at the end of FY{year}, per the balance sheet?"),
    ("md&a", "According to management's discussion, why did {company}'s net sales change in {year}?"),
)


def file_name(company: str, year: int) -> str:
    return f"{''.join(ch for ch in company.upper() if ch.isalnum())}_{year}_10K.md"


def filing(company: str, business: str, year: int, rng: random.Random) -> str:
    revenue = {y: rng.randint(800, 40_000) for y in (year - 2, year - 1, year)}
    rows = {
        "Total revenue": revenue,
        "Cost of sales": {y: int(v * rng.uniform(0.5, 0.7)) for y, v in revenue.items()},
        "Operating income": {y: int(v * rng.uniform(0.05, 0.2)) for y, v in revenue.items()},
        "Net income": {y: int(v * rng.uniform(0.02, 0.12)) for y, v in revenue.items()},
    }
    cash = {
        "Net cash provided by operating activities": {y: int(v * rng.uniform(0.08, 0.2)) for y, v in revenue.items()},
        "Capital expenditures": {y: -int(v * rng.uniform(0.02, 0.09)) for y, v in revenue.items()},
        "Dividends paid": {y: -int(v * rng.uniform(0.0, 0.03)) for y, v in revenue.items()},
    }
    assets = {y: int(v * rng.uniform(1.0, 2.5)) for y, v in revenue.items() if y >= year - 1}
    balance = {"Cash and cash equivalents": {y: int(v * 0.1) for y, v in assets.items()},
               "Total assets": assets,
               "Total liabilities": {y: int(v * rng.uniform(0.4, 0.8)) for y, v in assets.items()}}

    def table(title: str, body: dict[str, dict[int, int]]) -> str:
        years = sorted(next(iter(body.values())), reverse=True)
        lines = [f"### {title}", "", "(in millions of USD) | " + " | ".join(f"FY{y}" for y in years),
                 "---|" + "---|" * len(years)]
        lines += [f"{label} | " + " | ".join(f"{values[y]:,}" for y in years) for label, values in body.items()]
        return "\n".join(lines)

    change = (revenue[year] - revenue[year - 1]) / revenue[year - 1]
    reason = rng.choice(["higher volumes", "price increases", "the acquisition of a competitor",
                         "lower demand in Europe", "the loss of a large customer", "currency movements"])
    return "\n\n".join([
        f"# {company} annual report on Form 10-K for fiscal year {year}",
        "## Item 1. Business",
        f"{company} provides {business}. As of December 31, {year}, {company} employed "
        f"{rng.randint(1, 90) * 100:,} people in {rng.randint(3, 40)} countries.",
        "## Item 1A. Risk factors", RISKS,
        "## Item 7. Management's discussion and analysis",
        f"Net sales were ${revenue[year]:,} million in {year}, compared with ${revenue[year - 1]:,} million in "
        f"{year - 1}, a change of {change:+.1%}, mainly because of {reason}. Operating income was "
        f"${rows['Operating income'][year]:,} million.",
        "## Item 8. Financial statements",
        table("Consolidated statements of income", rows),
        table("Consolidated statements of cash flows", cash),
        table("Consolidated balance sheets", balance),
    ]) + "\n"


def generate(folder: Path, companies: int, years: list[int], seed: int = 11) -> list[dict]:
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    golden = []
    for company, business in COMPANIES[:companies]:
        for year in years:
            (folder / file_name(company, year)).write_text(filing(company, business, year, rng))
            for number, (slice_, template) in enumerate(rng.sample(QUESTIONS, 3)):
                golden.append({"id": f"{file_name(company, year)}#{number}", "slice": slice_,
                               "question": template.format(company=company, year=year),
                               "gold": [{"doc": file_name(company, year)}], "answerable": True})
    return golden


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--companies", type=int, default=12, help=f"at most {len(COMPANIES)}")
    parser.add_argument("--years", default="2019,2020,2021")
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    args = parser.parse_args()
    years = [int(y) for y in args.years.split(",")]
    with throwaway_database() as database:
        corpus = database.workdir / "filings"
        golden = generate(corpus, min(args.companies, len(COMPANIES)), years)
        golden_path = database.workdir / "filings.jsonl"
        golden_path.write_text("".join(json.dumps(q) + "\n" for q in golden))
        config = database.workdir / "rag.yaml"
        config.write_text(yaml.safe_dump({
            "database_url": database.create("bench_filings"), "data_dir": str(database.workdir / "data"),
            "embedding": {"model": args.model, "models_dir": str(REPO / ".models")},
            "sources": [{"name": "filings", "root": str(corpus), "acl_labels": ["analysts"]}],
        }))
        settings = load_settings(config)
        with DagsterInstance.ephemeral() as instance:
            summary = run_ingest(settings, instance=instance)
            assert summary["success"], summary.get("errors")
        questions = load_golden(golden_path)
        print(f"machine: {machine()}; {len(list(corpus.iterdir()))} filings, {summary['chunks_written']} chunks, "
              f"{len(questions)} questions, {args.model}")
        base = SearchOptions.from_settings(settings)
        routed = dataclasses.replace(base, routing=base.routing.model_copy(update={"enabled": True}))
        unrouted = dataclasses.replace(base, routing=base.routing.model_copy(update={"enabled": False}))
        rankings = {"dense": ("dense", unrouted), "sparse (BM25)": ("sparse", unrouted),
                    "hybrid, no routing": ("hybrid", unrouted), "hybrid + document routing (default)":
                    ("hybrid", routed), "dense + document routing": ("dense", routed)}
        reports = {}
        print("\n| ranking | hit@1 | hit@5 | MRR@5 |\n|---|---|---|---|")
        with connect(resolve_urls(settings).index) as conn:
            for name, (mode, options) in rankings.items():
                at1 = evaluate(conn, questions, ["analysts"], k=1, mode=mode, options=options)
                reports[name] = at5 = evaluate(conn, questions, ["analysts"], k=5, mode=mode, options=options)
                print(f"| {name} | {at1.metrics['overall']['hit@k']:.3f} | {at5.metrics['overall']['hit@k']:.3f} | "
                      f"{at5.metrics['overall']['mrr']:.3f} |")
        print("\npaired differences at k=5:")
        for a, b in (("hybrid, no routing", "hybrid + document routing (default)"),
                     ("dense", "hybrid + document routing (default)"), ("dense", "hybrid, no routing")):
            for d in paired_differences(reports[a].results, reports[b].results):
                if d.metric in ("hit@k", "mrr"):
                    print(f"  {b} vs {a}: {d.describe()}{' real' if d.significant else ' not significant'}")


if __name__ == "__main__":
    main()
