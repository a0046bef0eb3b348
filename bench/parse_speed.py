"""Parsing at the machine's speed: tier 1 and the whole cascade against pdfplumber's own `extract_text`, per file,
side by side in one run, with the pages and seconds of each tier.

    .venv/bin/python -m bench.parse_speed [FILE.pdf ...]

Default files: two statement-heavy real filings of ../shared/financebench-dev (many of their pages escalate to the
layout-and-table tier). The cascade is timed with its models loaded (a worker loads them once per run).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

from bench.common import REPO, machine

DEFAULT_FILES = [REPO.parent / "shared" / "financebench-dev" / "pdfs" / name
                 for name in ("NIKE_2018_10K.pdf", "JPMORGAN_2022Q2_10Q.pdf")]


def pdfplumber_seconds(path: Path) -> float:
    import pdfplumber

    started = time.perf_counter()
    with pdfplumber.open(path) as pdf:
        for page in pdf.pages:
            page.extract_text()
            page.close()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", type=Path, default=DEFAULT_FILES)
    args = parser.parse_args()

    from rag_pipeline.config import ParsingConfig
    from rag_pipeline.parsing.cascade import Cascade, parse_document

    cascade = Cascade(ParsingConfig())
    parse_document(args.files[0], None, cascade)  # the tiers' models load once, as in a worker
    for path in args.files:
        pdfplumber_seconds(path)  # every file read once before timing: no file pays for a cold cache
    print(f"machine: {machine()}\n")
    print("| file | pages | pdfplumber extract_text s | tier 1 s | ratio | cascade s | ratio | pages per tier | "
          "seconds by final tier (an escalated page's include its tier-1 time) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for path in args.files:
        plain = pdfplumber_seconds(path)
        started = time.perf_counter()
        parse_document(path, None, None)  # tier 1 alone, as a run without the cascade parses
        tier1 = time.perf_counter() - started
        started = time.perf_counter()
        pages = parse_document(path, None, cascade)
        whole = time.perf_counter() - started
        count: dict[str, int] = defaultdict(int)
        seconds: dict[str, float] = defaultdict(float)
        for page in pages:
            count[page.tier] += 1
            seconds[page.tier] += page.seconds
        print(f"| {path.name} | {len(pages)} | {plain:.1f} | {tier1:.1f} | {tier1 / plain:.2f}× | {whole:.1f} | "
              f"{whole / plain:.2f}× | {', '.join(f'{t} {n}' for t, n in sorted(count.items()))} | "
              f"{', '.join(f'{t} {s:.1f}' for t, s in sorted(seconds.items()))} |")
    print("\ngoals: tier 1 ≤ 1.5×, cascade ≤ 2× pdfplumber's extract_text on statement-heavy filings")


if __name__ == "__main__":
    main()
