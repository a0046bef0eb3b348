"""Look-alike filings: generated thirteen-page annual reports (PDF) of made-up companies, one per company and fiscal
year, written from one template (as 10-Ks are), with analyst questions that name the company and the period, and
the pages of the filing that answer them. Prints page hit@1, hit@5 and MRR for each ranking, with document
routing on and off, and paired significance.

    .venv/bin/python -m bench.golden_filings [--companies 12] [--years 2019,2020,2021] [--model all-MiniLM-L6-v2]
        [--seed 11]

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
from fpdf import FPDF

from bench.common import REPO, machine, throwaway_database
from rag_pipeline.config import load_settings
from rag_pipeline.defs.runs import run_ingest
from rag_pipeline.retrieval.evaluation import evaluate, load_golden, paired_differences
from rag_pipeline.retrieval.search import SearchOptions
from rag_pipeline.store.database import connect, resolve_urls

# (name as the text says it, the short name analysts also use, what it does); file names squash the name, as
# EDGAR-derived sets do (COCACOLA_2021_10K, MGMRESORTS_2022_10K), and questions say either name ("MGM")
COMPANIES = [
    ("Globex", None, "specialty chemical coatings for ships and bridges"),
    ("Blue Harbor", None, "container shipping between Asia and Europe"),
    ("Acu-Tek", None, "payroll and workforce software for hospitals"),
    ("Northwind Traders", "Northwind", "wholesale food distribution to restaurants"),
    ("Vandelay Industries", "Vandelay", "latex gloves and medical disposables"),
    ("Stark Dynamics", "Stark", "avionics and flight-control systems"),
    ("Umbra Energy", "Umbra", "natural gas pipelines and storage"),
    ("Kestrel", None, "regional airline service"),
    ("Pioneer Mills", "Pioneer", "flour, pasta and baking mixes"),
    ("Helix Bio", "Helix", "contract manufacturing of biologic drugs"),
    ("Orbital Freight", "Orbital", "satellite launch and logistics services"),
    ("Cinder Retail", "Cinder", "discount home-improvement stores"),
    ("Tessellate", None, "semiconductor design tools"),
    ("Marlow & Finch", "Marlow", "insurance brokerage for small businesses"),
    ("Quanta Rail", "Quanta", "freight railcars and leasing"),
    ("Sable Foods", "Sable", "frozen meals and snacks"),
]
# how questions write a fiscal year
PERIODS = ("FY{year}", "FY{yy}", "fiscal {year}", "fiscal year {year}")
RISKS = [
    "Our results depend on general economic conditions. A downturn could reduce demand for our products and "
    "services and increase the credit risk of our customers.",
    "We face intense competition, and competitors may develop products that are cheaper or better than ours.",
    "Changes in tax law, trade policy or interest rates could reduce our earnings and cash flows.",
    "Cyber attacks on our systems, or those of our suppliers, could disrupt operations and expose confidential data.",
    "We depend on a limited number of suppliers for some materials, and shortages could raise our costs.",
    "Litigation, product liability claims and regulatory investigations could result in significant expenses.",
    "Our indebtedness could limit our flexibility and require us to use cash flow to pay interest.",
    "Climate change and related regulation could increase our costs and affect demand for our products.",
    "We may not realise the benefits we expect from acquisitions, and integrating them may disrupt the business.",
    "Fluctuations in foreign currency exchange rates could reduce our reported revenue and operating income.",
]
NOTES = [
    "Revenue is recognised when control of the promised goods or services transfers to customers, in an amount "
    "that reflects the consideration the Company expects to receive.",
    "Leases are recognised as right-of-use assets and lease liabilities at the present value of the payments.",
    "Goodwill is tested for impairment annually in the fourth quarter and whenever events indicate that the "
    "carrying amount may not be recoverable.",
    "Inventories are stated at the lower of cost and net realisable value, cost being determined on a first-in, "
    "first-out basis.",
    "Income taxes are accounted for under the asset and liability method; deferred tax assets are reduced by a "
    "valuation allowance when it is more likely than not that they will not be realised.",
]
# (slice, question, the pages holding its answer); pages as laid out by filing()
QUESTIONS = (
    ("cash flow", "What is the {period} capital expenditure amount (in USD millions) for {company}? Give a response "
                  "to the question by relying on the details shown in the cash flow statement.", (9,)),
    ("income statement", "What was {company}'s total revenue in {period}?", (5, 7)),
    ("income statement", "Using the income statement, what was the operating income of {company} for "
                         "{period}?", (7,)),
    ("business", "How many people did {company} employ at the end of {year}?", (2,)),
    ("balance sheet", "What were {company}'s total assets at the end of {period}, per the balance sheet?", (8,)),
    ("md&a", "According to management's discussion, why did {company}'s net sales change in {year}?", (5,)),
    ("cash flow", "How much did {company} pay in dividends in {period}?", (9,)),
)


def file_name(company: str, year: int) -> str:
    return f"{''.join(ch for ch in company.upper() if ch.isalnum())}_{year}_10K.pdf"


def _text_page(pdf: FPDF, heading: str, paragraphs: list[str]) -> None:
    pdf.add_page()
    pdf.set_font("Helvetica", style="B", size=13)
    pdf.set_xy(15, 15)
    pdf.multi_cell(180, 7, heading)
    pdf.set_font("Helvetica", size=10)
    pdf.ln(4)
    for text in paragraphs:
        pdf.set_x(15)
        pdf.multi_cell(180, 5, text)
        pdf.ln(3)


def _statement_page(pdf: FPDF, owner: str, title: str, body: dict[str, dict[int, int]]) -> None:
    pdf.add_page()
    pdf.set_font("Helvetica", style="B", size=11)
    for y, line in ((15, owner), (22, title), (29, "(in millions of USD)")):
        pdf.set_xy(15, y)
        pdf.cell(180, 6, line)
    years = sorted(next(iter(body.values())), reverse=True)
    pdf.set_font("Helvetica", style="B", size=9)
    for column, year in enumerate(years):
        pdf.set_xy(110 + column * 28, 42)
        pdf.cell(24, 5, str(year), align="R")
    pdf.set_font("Helvetica", size=9)
    for row, (label, values) in enumerate(body.items()):
        y = 50 + 7 * row
        pdf.set_xy(15, y)
        pdf.cell(90, 5, label)
        for column, year in enumerate(years):
            pdf.set_xy(110 + column * 28, y)
            value = values[year]
            pdf.cell(24, 5, f"({-value:,})" if value < 0 else f"{value:,}", align="R")


def filing(path: Path, company: str, business: str, year: int, rng: random.Random) -> None:
    """Thirteen pages in a 10-K's order: cover, business, risks (2), MD&A, liquidity, income statement, balance
    sheet, cash flows, notes, segment note, quarterly data, controls. Only the cover, the business section, MD&A
    and the statements' heading name the company; the statements show three fiscal years (two on the balance
    sheet), so each year also appears in later filings. The liquidity page, the segment note and the quarterly data
    use the questions' words (capital expenditures, dividends, revenue, operating income) without their answers,
    as a real filing's other pages do."""
    periods = (year - 2, year - 1, year)
    revenue = {y: rng.randint(800, 40_000) for y in periods}
    income = {
        "Total revenue": revenue,
        "Cost of sales": {y: int(v * rng.uniform(0.5, 0.7)) for y, v in revenue.items()},
        "Selling, general and administrative expenses": {y: int(v * rng.uniform(0.1, 0.2)) for y, v in revenue.items()},
        "Operating income": {y: int(v * rng.uniform(0.05, 0.2)) for y, v in revenue.items()},
        "Interest expense": {y: int(v * rng.uniform(0.005, 0.02)) for y, v in revenue.items()},
        "Net income": {y: int(v * rng.uniform(0.02, 0.12)) for y, v in revenue.items()},
    }
    assets = {y: int(revenue[y] * rng.uniform(1.0, 2.5)) for y in periods[1:]}
    balance = {
        "Cash and cash equivalents": {y: int(v * rng.uniform(0.05, 0.15)) for y, v in assets.items()},
        "Inventories": {y: int(v * rng.uniform(0.05, 0.2)) for y, v in assets.items()},
        "Property, plant and equipment, net": {y: int(v * rng.uniform(0.2, 0.4)) for y, v in assets.items()},
        "Total assets": assets,
        "Long-term debt": {y: int(v * rng.uniform(0.1, 0.4)) for y, v in assets.items()},
        "Total liabilities": {y: int(v * rng.uniform(0.4, 0.8)) for y, v in assets.items()},
    }
    cash = {
        "Net cash provided by operating activities": {y: int(v * rng.uniform(0.08, 0.2)) for y, v in revenue.items()},
        "Capital expenditures": {y: -int(v * rng.uniform(0.02, 0.09)) for y, v in revenue.items()},
        "Acquisitions, net of cash acquired": {y: -int(v * rng.uniform(0.0, 0.05)) for y, v in revenue.items()},
        "Dividends paid": {y: -int(v * rng.uniform(0.005, 0.03)) for y, v in revenue.items()},
        "Repurchases of common stock": {y: -int(v * rng.uniform(0.0, 0.04)) for y, v in revenue.items()},
    }
    change = (revenue[year] - revenue[year - 1]) / revenue[year - 1]
    reason = rng.choice(["higher volumes", "price increases", "the acquisition of a competitor",
                         "lower demand in Europe", "the loss of a large customer", "currency movements"])
    owner = f"{company} and Subsidiaries"
    pdf = FPDF(format="A4")
    pdf.set_auto_page_break(auto=False)
    _text_page(pdf, f"{company}\nAnnual Report on Form 10-K\nFor the fiscal year ended December 31, {year}",
               ["Securities registered pursuant to Section 12(b) of the Act: common stock, par value $0.01 per share."])
    _text_page(pdf, "Item 1. Business", [
        f"{company} provides {business}. The Company sells through its own sales force and through distributors.",
        f"As of December 31, {year}, {company} employed {rng.randint(1, 90) * 100:,} people in "
        f"{rng.randint(3, 40)} countries."])
    risks = rng.sample(RISKS, len(RISKS))
    _text_page(pdf, "Item 1A. Risk Factors", risks[:5])
    _text_page(pdf, "Item 1A. Risk Factors (continued)", risks[5:])
    _text_page(pdf, "Item 7. Management's Discussion and Analysis of Financial Condition and Results of Operations", [
        f"Net sales of {company} were ${revenue[year]:,} million in {year}, compared with ${revenue[year - 1]:,} "
        f"million in {year - 1}, a change of {change:+.1%}, mainly because of {reason}.",
        f"Operating income was ${income['Operating income'][year]:,} million. We expect capital spending to "
        "remain in line with depreciation."])
    _text_page(pdf, "Liquidity and Capital Resources", [
        f"We expect capital expenditures of about ${rng.randint(50, 900):,} million in {year + 1}, mainly for "
        "capacity and information systems, funded from operating cash flow.",
        f"In {year + 1} the Board intends to keep paying quarterly dividends and may repurchase shares under the "
        f"${rng.randint(100, 2000):,} million program. Revenue growth and operating income are expected to fund "
        "both."])
    _statement_page(pdf, owner, "Consolidated Statements of Income", income)
    _statement_page(pdf, owner, "Consolidated Balance Sheets", balance)
    _statement_page(pdf, owner, "Consolidated Statements of Cash Flows", cash)
    _text_page(pdf, "Notes to Consolidated Financial Statements", rng.sample(NOTES, 4))
    share = rng.uniform(0.3, 0.7)
    _statement_page(pdf, owner, "Note 12. Segment Information", {
        f"{segment} {line}": {y: int(total[y] * part) for y in periods}
        for segment, part in (("Americas", share), ("International", 1 - share))
        for line, total in (("revenue", revenue), ("operating income", income["Operating income"]),
                            ("capital expenditures", {y: -v for y, v in cash["Capital expenditures"].items()}))})
    quarters = [rng.uniform(0.2, 0.3) for _ in range(4)]
    _statement_page(pdf, owner, f"Quarterly Financial Data (unaudited), fiscal {year}", {
        f"{line}, quarter {q + 1}": {y: int(total[y] * quarters[q]) for y in periods}
        for q in range(4) for line, total in (("Revenue", revenue), ("Operating income", income["Operating income"]))})
    _text_page(pdf, "Item 9A. Controls and Procedures", [
        "Management evaluated the effectiveness of the Company's disclosure controls and procedures as of the end "
        "of the period covered by this report and concluded that they were effective.",
        "There were no changes in internal control over financial reporting during the fourth quarter that "
        "materially affected, or are reasonably likely to materially affect, it."])
    pdf.output(str(path))


def generate(folder: Path, companies: int, years: list[int], seed: int = 11) -> list[dict]:
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    golden = []
    for company, short, business in COMPANIES[:companies]:
        for year in years:
            name = file_name(company, year)
            filing(folder / name, company, business, year, rng)
            for number, (slice_, template, pages) in enumerate(rng.sample(QUESTIONS, 3)):
                said = rng.choice([company, short or company])
                period = rng.choice(PERIODS).format(year=year, yy=f"{year % 100:02d}")
                golden.append({"id": f"{name}#{number}", "slice": slice_,
                               "question": template.format(company=said, year=year, period=period),
                               "gold": [{"doc": name, "pages": list(pages)}], "answerable": True})
    return golden


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--companies", type=int, default=12, help=f"at most {len(COMPANIES)}")
    parser.add_argument("--years", default="2019,2020,2021")
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--seed", type=int, default=11, help="another seed: other figures, questions and wordings")
    args = parser.parse_args()
    years = [int(y) for y in args.years.split(",")]
    with throwaway_database() as database:
        corpus = database.workdir / "filings"
        golden = generate(corpus, min(args.companies, len(COMPANIES)), years, seed=args.seed)
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
