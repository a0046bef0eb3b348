"""Torture-set harness: run the parser over the hostile documents in ../shared/torture and score outcomes.

    .venv/bin/python -m torture_set.harness [--torture PATH] [--json]

Every document must end either parsed (with at least the expected pages and text) or dead-lettered with
its expected reason; nothing may crash. The per-tier scores (text recall, table cell F1, reading order)
come with the parser-cascade work.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rag_pipeline.parsing import DeadLetter, parse_file

HERE = Path(__file__).resolve().parent
DEFAULT_TORTURE = HERE.parent.parent / "shared" / "torture"


@dataclass
class Outcome:
    file: str
    outcome: str  # "ok" | "dead_letter:<reason>" | "crash:<exception>"
    pages: int
    chars: int
    tables: int
    seconds: float
    expected: str
    passed: bool


def manifest(torture: Path) -> list[str]:
    with (torture / "manifest.csv").open(newline="") as handle:
        return [row["file"] for row in csv.DictReader(handle)]


def run(torture: Path = DEFAULT_TORTURE) -> list[Outcome]:
    expectations = json.loads((HERE / "expectations.json").read_text())
    results = []
    for name in manifest(torture):
        expected = expectations.get(name, {"outcome": "ok"})
        started = time.perf_counter()
        pages = chars = tables = 0
        try:
            for page in parse_file(torture / name):
                pages += 1
                chars += len(page.markdown)
                tables += page.tables
            outcome = "ok"
        except DeadLetter as exc:
            outcome = f"dead_letter:{exc.reason}"
        except Exception as exc:  # the point of the harness: report it, never stop
            outcome = f"crash:{type(exc).__name__}: {exc}"
        passed = outcome == expected["outcome"] and (
            outcome != "ok" or (pages == expected.get("pages", pages) and chars >= expected.get("min_chars", 0))
        )
        results.append(
            Outcome(name, outcome, pages, chars, tables, round(time.perf_counter() - started, 3),
                    expected["outcome"], passed)
        )
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--torture", type=Path, default=DEFAULT_TORTURE)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = run(args.torture)
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
    else:
        print("| file | outcome | expected | pages | chars | tables | seconds | pass |")
        print("|---|---|---|---|---|---|---|---|")
        for r in results:
            print(f"| {r.file} | {r.outcome} | {r.expected} | {r.pages} | {r.chars} | {r.tables} | {r.seconds} |"
                  f" {'yes' if r.passed else 'NO'} |")
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
