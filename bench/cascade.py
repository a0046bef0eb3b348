"""Parser-cascade cost: cascade wall time / pdfplumber-only wall time on the same text-layer PDFs, and peak
resident memory while parsing the 117-page torture document.

    .venv/bin/python -m bench.cascade [--torture ../shared/torture] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rag_pipeline.cascade import Cascade, _rapidocr, parse_document  # noqa: E402
from rag_pipeline.config import ParsingConfig  # noqa: E402
from rag_pipeline.parsing import parse_file  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TEXT_LAYER = [
    "fedreg_2020-17221_3col.pdf",
    "camelot_12s0324_borderless_2tables.pdf",
    "pdfplumber_WARN_report_16p_table.pdf",
    "pdfplumber_nics_rotated.pdf",
    "docling_redp5110_sampled.pdf",
    "pypdf_multilang.pdf",
]

MEMORY_PROBE = """
import json, sys, time
from pathlib import Path
from rag_pipeline.cascade import Cascade, parse_document
from rag_pipeline.config import ParsingConfig
started = time.perf_counter()
cascade = Cascade(ParsingConfig()) if sys.argv[2] == "cascade" else None
pages = parse_document(Path(sys.argv[1]), None, cascade)
# VmHWM, not ru_maxrss: on Linux ru_maxrss keeps the parent's high-water mark across exec.
peak_kb = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"pages": len(pages), "seconds": time.perf_counter() - started, "max_rss_mb": peak_kb / 1024}))
"""


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--torture", type=Path, default=REPO.parent / "shared" / "torture")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    docs = [args.torture / "docs" / name for name in TEXT_LAYER]
    docs += sorted((REPO / "sample_corpus").rglob("*.pdf"))
    docs = [d for d in docs if d.exists() and "scanned-contract" not in d.name]
    cascade = Cascade(ParsingConfig())
    parse_document(docs[0], None, cascade)  # warm imports outside the timings
    _rapidocr()  # and the OCR models, which a long-running worker loads once

    tier1 = cascaded = 0.0
    clean_tier1 = clean_cascaded = 0.0  # documents whose every page stays in tier 1
    escalated = resolved = pages = 0
    for _ in range(args.repeat):
        for doc in docs:
            plain = timed(lambda d=doc: list(parse_file(d)))
            result: list = []
            cascade_seconds = timed(lambda d=doc, out=result: out.extend(parse_document(d, None, cascade)))
            tier1 += plain
            cascaded += cascade_seconds
            pages += len(result)
            escalated += sum(1 for p in result if "escalation" in p.signals)
            resolved += sum(1 for p in result if p.tier != "pdfplumber")
            if all(p.tier == "pdfplumber" for p in result):
                clean_tier1 += plain
                clean_cascaded += cascade_seconds
    print(f"text-layer corpus: {len(docs)} PDFs, {pages // args.repeat} pages; {escalated // args.repeat} pages fail "
          f"the structural check, {resolved // args.repeat} of them re-read by a later tier (OCR here)")
    print("| measurement | value | goal |")
    print("|---|---|---|")
    print(f"| pdfplumber only | {tier1 / args.repeat:.2f} s | |")
    print(f"| cascade | {cascaded / args.repeat:.2f} s | |")
    print(f"| cascade / pdfplumber, documents whose pages all pass or stay in tier 1 | "
          f"{clean_cascaded / clean_tier1:.3f} | <= 1.15 |")
    print(f"| cascade / pdfplumber, all documents (includes re-reading broken pages) | {cascaded / tier1:.3f} | |")

    long_doc = args.torture / "docs" / "pysample_GeoTopo_117p.pdf"
    if long_doc.exists():
        for mode in ("pdfplumber", "cascade"):
            probe = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(long_doc), mode], capture_output=True,
                                   text=True, check=True)
            stats = json.loads(probe.stdout.strip().splitlines()[-1])
            print(f"| peak RSS, {stats['pages']}-page PDF, {mode} | {stats['max_rss_mb']:.0f} MB"
                  f" ({stats['seconds']:.1f} s) | bounded |")


if __name__ == "__main__":
    main()
