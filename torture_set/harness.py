"""Torture-set harness: every hostile document through each parser tier, scored against ground truth.

    .venv/bin/python -m torture_set.harness [--torture PATH] [--tiers pdfplumber,cascade,ocr] [--json]
    make torture   (the same, writing torture_set/SCOREBOARD.md)

Documents: the manifest of ../shared/torture plus the ones `torture_set.generate` makes with exactly known
ground truth. Per document and tier: outcome (ok / dead-letter reason, against the expected one), text
recall, table cell F1, header rows preserved, reading-order errors, seconds per page. Pages are cleaned as
ingestion cleans them (furniture removed, tables joined over page breaks) before scoring.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import json
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rag_pipeline.config import ParsingConfig
from rag_pipeline.parsing.cascade import Cascade, ocr_page, parse_document
from rag_pipeline.parsing.formats import PDF_SUFFIXES, parse_file
from rag_pipeline.parsing.pages import DeadLetter, ParsedPage
from rag_pipeline.text.cleaning import clean_parsed_pages
from torture_set.generate import generate

HERE = Path(__file__).resolve().parent
DEFAULT_TORTURE = HERE.parent.parent / "shared" / "torture"
TIERS = ("pdfplumber", "cascade", "ocr")
OCR_ALONE_MAX_PAGES = 20  # OCR of every page of a long text PDF measures nothing new and takes minutes
_WORD_RE = re.compile(r"\w+", re.UNICODE)


@dataclass
class Score:
    file: str
    tier: str
    outcome: str  # ok | dead_letter:<reason> | crash:<error> | not_run:<why>
    expected: str
    outcome_ok: bool
    pages: int = 0
    seconds_per_page: float = 0.0
    text_recall: float | None = None
    table_cell_f1: float | None = None
    table_cell_recall: float | None = None
    lone_row_tables: int | None = None  # tables of one row (no header, or a header alone): never wanted
    cid_tokens: int | None = None  # "(cid:N)" left in the cleaned text, which chunks and BM25 would get
    header_rows_preserved: float | None = None
    reading_order_errors: int | None = None
    must_contain: float | None = None
    must_be_absent: float | None = None  # share of furniture strings that are gone
    single_table: bool | None = None
    picture_text_recall: float | None = None  # of the words the document's pictures show, those their records hold


# --- metrics ---------------------------------------------------------------------------------------


def words(text: str) -> list[str]:
    return [w.lower() for w in _WORD_RE.findall(text)]


def text_recall(output: str, truth: str) -> float:
    expected = Counter(words(truth))
    found = Counter(words(output))
    total = sum(expected.values())
    return round(sum(min(n, found[w]) for w, n in expected.items()) / total, 4) if total else 1.0


def reading_order_errors(output: str, truth: str, stride: int = 6) -> int:
    """Anchor trigrams that occur once in the truth, located in the output: how many are out of order
    (the anchors found, less the longest run of them that appears in the truth's order)."""
    out = " ".join(words(output))
    truth_words = words(truth)
    trigrams = [" ".join(truth_words[i : i + 3]) for i in range(max(0, len(truth_words) - 2))]
    counts = Counter(trigrams)
    positions = []
    for anchor in trigrams[::stride]:
        if counts[anchor] == 1 and out.count(anchor) == 1:
            positions.append(out.find(anchor))
    tails: list[int] = []  # patience sorting: length of the longest increasing subsequence
    for position in positions:
        index = bisect.bisect_left(tails, position)
        tails[index : index + 1] = [position]
    return len(positions) - len(tails)


def normalised_cell(cell: str) -> str:
    """Cells compared by their text: case, spacing and dot leaders ("Total . . . .") aside."""
    return re.sub(r"\s+", "", re.sub(r"(?:\s*\.){2,}", "", str(cell))).lower()


def markdown_tables(text: str) -> list[list[list[str]]]:
    tables: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line in text.split("\n") + [""]:
        if line.lstrip().startswith("|"):
            if not re.fullmatch(r"\s*\|(\s*:?-{3,}:?\s*\|)+\s*", line):
                current.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif current:
            tables.append(current)
            current = []
    return tables


def _cell_hits(output_tables: list[list[list[str]]], truth_tables: list[list[list[str]]]) -> tuple[int, int, int]:
    produced = Counter(normalised_cell(c) for t in output_tables for r in t for c in r if normalised_cell(c))
    expected = Counter(normalised_cell(c) for t in truth_tables for r in t for c in r if normalised_cell(c))
    return sum(min(n, produced[c]) for c, n in expected.items()), sum(produced.values()), sum(expected.values())


def table_cell_f1(output_tables: list[list[list[str]]], truth_tables: list[list[list[str]]]) -> float:
    hits, produced, expected = _cell_hits(output_tables, truth_tables)
    if not hits:
        return 0.0
    precision, recall = hits / produced, hits / expected
    return round(2 * precision * recall / (precision + recall), 4)


def table_cell_recall(output_tables: list[list[list[str]]], truth_tables: list[list[list[str]]]) -> float:
    """Share of the truth's cells found (by text) in some output table."""
    hits, _, expected = _cell_hits(output_tables, truth_tables)
    return round(hits / expected, 4) if expected else 1.0


def header_row(table: list[list[str]]) -> list[str]:
    """The first row that fills at least half the columns (titles and notes above a table are skipped)."""
    width = max(len(r) for r in table)
    for row in table:
        if sum(1 for c in row if str(c).strip()) >= width / 2:
            return [normalised_cell(c) for c in row if normalised_cell(c)]
    return []


def headers_preserved(output_tables: list[list[list[str]]], truth_tables: list[list[list[str]]]) -> float:
    produced_rows = [[normalised_cell(c) for c in row if normalised_cell(c)] for t in output_tables for row in t]
    wanted = [header_row(t) for t in truth_tables]
    return round(sum(1 for h in wanted if h in produced_rows) / len(wanted), 4) if wanted else 1.0


# --- running ---------------------------------------------------------------------------------------


def _parse_with(tier: str, path: Path, password: str | None, cascade: Cascade) -> list[ParsedPage]:
    if tier == "pdfplumber":
        return list(parse_file(path, password))
    if tier == "cascade":
        return parse_document(path, password, cascade)
    pages = list(parse_file(path, password))  # OCR alone: every page rendered and read
    return [
        ParsedPage(p.page, "ocr", ocr_page(path, p.page, cascade.config, password), p.seconds, 0, {})
        for p in pages
    ]


def score_document(name: str, path: Path, truth: dict[str, Any], tier: str, cascade: Cascade) -> Score:
    expected = truth.get("outcome", "ok")
    if tier != "pdfplumber" and path.suffix.lower() not in PDF_SUFFIXES:
        return Score(name, tier, "not_run:not a PDF", expected, True)
    if tier == "ocr" and truth.get("pages", 0) > OCR_ALONE_MAX_PAGES:
        return Score(name, tier, f"not_run:more than {OCR_ALONE_MAX_PAGES} pages", expected, True)
    password = truth.get("password") if expected == "ok" else None
    started = time.perf_counter()
    try:
        pages = _parse_with(tier, path, password, cascade)
        outcome = "ok"
    except DeadLetter as exc:
        pages, outcome = [], f"dead_letter:{exc.reason}"
    except Exception as exc:  # the harness reports crashes; it never stops on one
        pages, outcome = [], f"crash:{type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - started
    score = Score(name, tier, outcome, expected, outcome == expected, len(pages),
                  round(seconds / max(1, len(pages)), 4))
    if outcome != "ok":
        return score
    clean_parsed_pages(pages)
    text = "\n\n".join(p.markdown for p in pages)
    if "text" in truth:
        score.text_recall = text_recall(text, truth["text"])
        # Right-to-left text: every trigram is an anchor, so a reversed word or line shows as an order error.
        score.reading_order_errors = reading_order_errors(text, truth["text"], stride=1 if truth.get("rtl") else 6)
    if "tables" in truth:
        tables = markdown_tables(text)
        score.table_cell_f1 = table_cell_f1(tables, truth["tables"])
        score.table_cell_recall = table_cell_recall(tables, truth["tables"])
        score.header_rows_preserved = headers_preserved(tables, truth["tables"])
        if truth.get("single_table"):
            score.single_table = len(tables) == 1
    if "tables" in truth or truth.get("statements"):
        score.lone_row_tables = sum(1 for t in markdown_tables(text) if len(t) < 2)
    score.cid_tokens = text.count("(cid:")
    if "picture_text" in truth:
        said = "\n".join(f"{r.get('caption') or ''}\n{r.get('text', '')}" for p in pages
                         for r in p.signals.get("pictures") or [] if isinstance(r, dict))
        score.picture_text_recall = text_recall(said, truth["picture_text"])
    if "must_contain" in truth:
        score.must_contain = round(sum(1 for s in truth["must_contain"] if s in text) / len(truth["must_contain"]), 4)
    if "absent" in truth:
        score.must_be_absent = round(sum(1 for s in truth["absent"] if s not in text) / len(truth["absent"]), 4)
    return score


def _read_truth(torture: Path, entry: dict[str, Any]) -> dict[str, Any]:
    """Resolve ground-truth file references of expectations.json into values."""
    truth = {k: v for k, v in entry.items() if not k.endswith("_file") and k != "tables_csv"}
    if "text_file" in entry:
        truth["text"] = (torture / entry["text_file"]).read_text(encoding="utf-8")
    if "tables_csv" in entry:
        truth["tables"] = [
            list(csv.reader((torture / name).read_text(encoding="utf-8").splitlines())) for name in entry["tables_csv"]
        ]
    if "pictures_docling_file" in entry:
        truth["picture_text"] = docling_picture_text(json.loads((torture / entry["pictures_docling_file"]).read_text()))
    return truth


def docling_picture_text(document: dict[str, Any]) -> str:
    """The words of a Docling document's captioned pictures (a figure, not a logo or a cover's art): each caption
    and the texts Docling placed inside the picture, as its own tests' reference conversion gives them."""
    texts = {t.get("self_ref"): t.get("text", "") for t in document.get("texts", [])}
    said: list[str] = []
    for picture in document.get("pictures", []):
        captions = [texts.get(c.get("$ref"), "") for c in picture.get("captions", [])]
        if not any(captions):
            continue
        inside = [texts.get(c.get("$ref"), "") for c in picture.get("children", [])]
        said += captions + [text for text in inside if text not in captions]
    return "\n".join(said)


def documents(torture: Path, generated_dir: Path) -> list[tuple[str, Path, dict[str, Any]]]:
    expectations = json.loads((HERE / "expectations.json").read_text())
    docs: list[tuple[str, Path, dict[str, Any]]] = []
    manifest = torture / "manifest.csv"
    if manifest.exists():
        with manifest.open(newline="") as handle:
            for row in csv.DictReader(handle):
                entry = expectations.get(row["file"], {"outcome": "ok"})
                docs.append((row["file"], torture / row["file"], _read_truth(torture, entry)))
    for name, truth in generate(generated_dir).items():
        docs.append((f"generated/{name}", generated_dir / name, truth))
    return docs


def run(torture: Path = DEFAULT_TORTURE, tiers: tuple[str, ...] = TIERS) -> list[Score]:
    cascade = Cascade(ParsingConfig())
    scores: list[Score] = []
    with tempfile.TemporaryDirectory(prefix="torture-gen-") as generated:
        for name, path, truth in documents(torture, Path(generated)):
            for tier in tiers:
                scores.append(score_document(name, path, truth, tier, cascade))
    cascade.close()
    return scores


def markdown_scoreboard(scores: list[Score]) -> str:
    def show(value: Any) -> str:
        return "" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)

    lines = [
        "| document | tier | outcome | pages | s/page | text recall | table F1 | cell recall | headers | lone rows"
        " | order errors | checks |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in scores:
        if s.outcome.startswith("not_run"):
            continue
        checks = " ".join(
            f"{label}={show(value)}"
            for label, value in (("contains", s.must_contain), ("absent", s.must_be_absent),
                                 ("one_table", s.single_table), ("cid", s.cid_tokens or None),
                                 ("pictures", s.picture_text_recall))
            if value is not None
        )
        outcome = s.outcome if s.outcome_ok else f"**{s.outcome}** (expected {s.expected})"
        lines.append(
            f"| {s.file} | {s.tier} | {outcome} | {s.pages} | {s.seconds_per_page:.3f} | {show(s.text_recall)} |"
            f" {show(s.table_cell_f1)} | {show(s.table_cell_recall)} | {show(s.header_rows_preserved)} |"
            f" {show(s.lone_row_tables)} | {show(s.reading_order_errors)} | {checks} |"
        )
    return "\n".join(lines)


PINNED = HERE / "pinned_scores.json"
PINNED_TIERS = ("pdfplumber", "cascade")
HIGHER_IS_BETTER = ("text_recall", "table_cell_f1", "table_cell_recall", "header_rows_preserved", "must_contain",
                    "must_be_absent", "picture_text_recall")
LOWER_IS_BETTER = ("reading_order_errors", "lone_row_tables", "cid_tokens")


def pins(scores: list[Score]) -> dict[str, dict[str, Any]]:
    """The scores reached now, as the floor a later run must reach (order errors: the ceiling)."""
    pinned: dict[str, dict[str, Any]] = {}
    for s in scores:
        if s.outcome.startswith("not_run") or s.tier not in PINNED_TIERS:
            continue
        entry: dict[str, Any] = {"outcome": s.outcome}
        for metric in HIGHER_IS_BETTER:
            value = getattr(s, metric)
            if value is not None:
                entry[metric] = int(value * 100) / 100  # floor to 2 decimals: noise-tolerant, still a regression gate
        for metric in LOWER_IS_BETTER:
            if getattr(s, metric) is not None:
                entry[metric] = getattr(s, metric)
        if s.single_table is not None:
            entry["single_table"] = s.single_table
        pinned[f"{s.file}|{s.tier}"] = entry
    return pinned


def regressions(scores: list[Score], pinned: dict[str, dict[str, Any]]) -> list[str]:
    found = []
    by_key = {f"{s.file}|{s.tier}": s for s in scores}
    for key, floor in pinned.items():
        score = by_key.get(key)
        if score is None:
            found.append(f"{key}: not scored")
            continue
        if score.outcome != floor["outcome"]:
            found.append(f"{key}: outcome {score.outcome} != {floor['outcome']}")
        for metric in HIGHER_IS_BETTER:
            if metric in floor and (getattr(score, metric) or 0.0) < floor[metric]:
                found.append(f"{key}: {metric} {getattr(score, metric)} < {floor[metric]}")
        for metric in LOWER_IS_BETTER:
            if metric in floor and (getattr(score, metric) or 0) > floor[metric]:
                found.append(f"{key}: {metric} {getattr(score, metric)} > {floor[metric]}")
        if "single_table" in floor and score.single_table != floor["single_table"]:
            found.append(f"{key}: single_table {score.single_table}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--torture", type=Path, default=DEFAULT_TORTURE)
    parser.add_argument("--tiers", default=",".join(TIERS))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--markdown", type=Path, help="also write the scoreboard as Markdown to this file")
    parser.add_argument("--pin", action="store_true", help=f"record these scores as the floor in {PINNED.name}")
    args = parser.parse_args(argv)
    scores = run(args.torture, tuple(t for t in args.tiers.split(",") if t))
    if args.pin:
        PINNED.write_text(json.dumps(pins(scores), indent=1, ensure_ascii=False, sort_keys=True) + "\n")
    board = markdown_scoreboard(scores)
    if args.markdown:
        args.markdown.write_text("# Torture-set scoreboard\n\nMade by `make torture`.\n\n" + board + "\n")
    print(json.dumps([asdict(s) for s in scores], indent=2) if args.json else board)
    return 0 if all(s.outcome_ok for s in scores) else 1


if __name__ == "__main__":
    sys.exit(main())
