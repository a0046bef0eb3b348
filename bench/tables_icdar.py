"""Tables on real government documents: the parser against the cell structure of ../shared/icdar2013-eu
(ICDAR-2013 table competition, EU half: 27 PDFs, 76 tables), per half, tier 1 alone and the whole cascade.

    .venv/bin/python -m bench.tables_icdar [--tiers pdfplumber,cascade] [--documents] [--save run.json]
        [--compare before.json] [--folder ../shared/icdar2013-eu]

The halves, fixed here and in docs/parsing.md: by the file's number, odd "tune" (eu-001, eu-003, …), even
"held-out" (eu-002, eu-004, …). A parsing choice with a tunable part is made on "tune" and reported on both.

Scoring (the folder's README, followed as written so that the numbers compare with the ones the project is
measured by):
  * a table is detected when one table the parser produced on its page holds at least half of its non-empty cells'
    texts (as multisets); detection is the share of the truth's tables detected;
  * a produced table is spurious when fewer than half of its own non-empty cells are in any one truth table of its
    page (a paragraph read as a table, a table on a page whose truth has none);
  * cell precision and recall: the multiset of non-empty cell texts of every table produced in a document against
    the truth's, pooled over the half's documents (micro-averaged);
  * adjacency (the competition's structure measure): each non-empty cell and its nearest non-empty neighbour to the
    right and below, as (text, text, direction) relations; precision and recall of the produced relations against
    the truth's, pooled the same way. A table whose cells are all found but whose rows or columns are split, merged
    or shifted scores low here and not on cells.
Cell texts are compared as torture_set.harness compares them: case, spacing and dot leaders aside. Tables are read
from each page's Markdown as the parser produced it (before cleaning joins a table continued over a page break).
"""

from __future__ import annotations

import argparse
import json
import re
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.common import REPO, machine
from torture_set.harness import markdown_tables, normalised_cell

FOLDER = REPO.parent / "shared" / "icdar2013-eu"
TIERS = ("pdfplumber", "cascade")
DETECTED_SHARE = 0.5

Grid = list[list[str]]  # a table's rows of cell texts; a spanning cell's text in each slot it covers


@dataclass(frozen=True)
class TruthTable:
    page: int  # 1-based
    cells: tuple[tuple[int, int, int, int, str], ...]  # start row, start column, end row, end column, text

    def grid(self) -> Grid:
        rows = 1 + max((c[2] for c in self.cells), default=-1)
        cols = 1 + max((c[3] for c in self.cells), default=-1)
        out = [[""] * cols for _ in range(rows)]
        for r0, c0, r1, c1, text in self.cells:
            for r in range(r0, r1 + 1):
                for c in range(c0, c1 + 1):
                    out[r][c] = text
        return out

    def texts(self) -> Counter[str]:
        return Counter(t for t in (normalised_cell(c[4]) for c in self.cells) if t)


def read_truth(path: Path) -> list[TruthTable]:
    """The tables of an ICDAR-2013 structure file (`eu-NNN-str.xml`), one per region (a table over two pages is
    two, each on its page)."""
    tables = []
    for table in ET.parse(path).getroot().iter("table"):
        for region in table.iter("region"):
            cells = []
            for cell in region.iter("cell"):
                r0, c0 = int(cell.get("start-row", 0)), int(cell.get("start-col", 0))
                r1, c1 = int(cell.get("end-row", r0)), int(cell.get("end-col", c0))
                cells.append((r0, c0, max(r0, r1), max(c0, c1), cell.findtext("content") or ""))
            tables.append(TruthTable(int(region.get("page", 1)), tuple(cells)))
    return tables


def cell_texts(grid: Grid) -> Counter[str]:
    return Counter(t for t in (normalised_cell(c) for row in grid for c in row) if t)


def adjacency(grid: Grid) -> Counter[tuple[str, str, str]]:
    """Each non-empty cell's nearest non-empty neighbour to the right and below, as (text, text, "h" or "v"). Along
    a line, the same text in neighbouring slots is one cell (a spanning cell fills each slot it covers); a cell
    spanning lines is related to its neighbour on each of them."""
    relations: Counter[tuple[str, str, str]] = Counter()

    def along(lines: Iterable[Sequence[str]], direction: str) -> None:
        for line in lines:
            texts = [t for t in (normalised_cell(c) for c in line) if t]
            texts = [t for i, t in enumerate(texts) if i == 0 or t != texts[i - 1]]
            relations.update((a, b, direction) for a, b in zip(texts, texts[1:], strict=False))

    along(grid, "h")
    width = max((len(row) for row in grid), default=0)
    along(([row[c] if c < len(row) else "" for row in grid] for c in range(width)), "v")
    return relations


def _overlap(produced: Counter, expected: Counter) -> int:
    return sum(min(n, produced[k]) for k, n in expected.items())


@dataclass
class DocumentScore:
    file: str
    half: str
    tier: str
    pages: int = 0
    seconds: float = 0.0
    tables: int = 0
    detected: int = 0
    produced_tables: int = 0
    spurious: int = 0
    cells_expected: int = 0
    cells_produced: int = 0
    cells_found: int = 0
    relations_expected: int = 0
    relations_produced: int = 0
    relations_found: int = 0
    error: str | None = None
    missed_pages: list[int] = field(default_factory=list)


def score_document(file: str, half: str, tier: str, page_markdown: dict[int, str],
                   truth: Sequence[TruthTable]) -> DocumentScore:
    """One document's scores from its pages' Markdown (page number to text) and its truth tables."""
    score = DocumentScore(file, half, tier, pages=len(page_markdown), tables=len(truth))
    produced = {page: markdown_tables(text) for page, text in page_markdown.items()}
    for table in truth:
        want = table.texts()
        needed = DETECTED_SHARE * sum(want.values())
        if any(_overlap(cell_texts(grid), want) >= needed for grid in produced.get(table.page, ())):
            score.detected += 1
        else:
            score.missed_pages.append(table.page)
    for page, grids in produced.items():
        on_page = [t.texts() for t in truth if t.page == page]
        for grid in grids:
            own = cell_texts(grid)
            if not own:
                continue
            score.produced_tables += 1
            if not any(_overlap(own, want) >= DETECTED_SHARE * sum(own.values()) for want in on_page):
                score.spurious += 1
    produced_cells = sum((cell_texts(g) for grids in produced.values() for g in grids), Counter())
    expected_cells = sum((t.texts() for t in truth), Counter())
    score.cells_expected, score.cells_produced = sum(expected_cells.values()), sum(produced_cells.values())
    score.cells_found = _overlap(produced_cells, expected_cells)
    produced_relations = sum((adjacency(g) for grids in produced.values() for g in grids), Counter())
    expected_relations = sum((adjacency(t.grid()) for t in truth), Counter())
    score.relations_expected = sum(expected_relations.values())
    score.relations_produced = sum(produced_relations.values())
    score.relations_found = _overlap(produced_relations, expected_relations)
    return score


def half_of(path: Path) -> str:
    """The file's half by its number: eu-009a.pdf is 9, odd, "tune"."""
    found = re.search(r"\d+", path.stem)
    return "tune" if found and int(found.group()) % 2 else "held-out"


def _ratio(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def _f1(precision: float, recall: float) -> float:
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def summary(scores: Sequence[DocumentScore]) -> dict[str, float | int]:
    """Detection and pooled cell and adjacency precision, recall and F1 of a set of documents."""
    total = {name: sum(getattr(s, name) for s in scores) for name in (
        "tables", "detected", "produced_tables", "spurious", "cells_expected", "cells_produced", "cells_found",
        "relations_expected", "relations_produced", "relations_found", "pages")}
    cell_p = _ratio(total["cells_found"], total["cells_produced"])
    cell_r = _ratio(total["cells_found"], total["cells_expected"])
    adj_p = _ratio(total["relations_found"], total["relations_produced"])
    adj_r = _ratio(total["relations_found"], total["relations_expected"])
    return {"documents": len(scores), "tables": total["tables"], "pages": total["pages"],
            "detection": round(_ratio(total["detected"], total["tables"]), 3),
            "spurious": total["spurious"], "produced_tables": total["produced_tables"],
            "cell_precision": round(cell_p, 3), "cell_recall": round(cell_r, 3), "cell_f1": round(_f1(cell_p, cell_r), 3),
            "adjacency_precision": round(adj_p, 3), "adjacency_recall": round(adj_r, 3),
            "adjacency_f1": round(_f1(adj_p, adj_r), 3),
            "seconds": round(sum(s.seconds for s in scores), 1),
            "errors": sum(1 for s in scores if s.error)}


def parse_pages(path: Path, tier: str, cascade) -> dict[int, str]:
    from rag_pipeline.parsing.cascade import parse_document

    return {page.page: page.markdown for page in parse_document(path, None, cascade if tier == "cascade" else None)}


def run(folder: Path, tiers: Sequence[str]) -> list[DocumentScore]:
    from rag_pipeline.config import ParsingConfig
    from rag_pipeline.parsing.cascade import Cascade
    from rag_pipeline.parsing.pages import DeadLetter

    cascade = Cascade(ParsingConfig())
    out = []
    try:
        for pdf in sorted(folder.glob("eu-*.pdf")):
            truth = read_truth(pdf.with_name(f"{pdf.stem}-str.xml"))
            for tier in tiers:
                started = time.perf_counter()
                try:
                    pages = parse_pages(pdf, tier, cascade)
                    error = None
                except DeadLetter as exc:  # scored as finding nothing: a table the parser loses counts against it
                    pages, error = {}, str(exc)
                except Exception as exc:  # a parser crash is scored the same way and named, and the run goes on
                    pages, error = {}, f"crash: {type(exc).__name__}: {exc}"
                score = score_document(pdf.name, half_of(pdf), tier, pages, truth)
                score.seconds, score.error = round(time.perf_counter() - started, 2), error
                out.append(score)
    finally:
        cascade.close()
    return out


COLUMNS = ("documents", "tables", "detection", "spurious", "cell_precision", "cell_recall", "cell_f1",
           "adjacency_precision", "adjacency_recall", "adjacency_f1", "seconds")


def _pick(run: Sequence[DocumentScore], tier: str, half: str) -> list[DocumentScore]:
    return [s for s in run if s.tier == tier and half in ("both", s.half)]


def report(scores: Sequence[DocumentScore], before: Sequence[DocumentScore] | None) -> None:
    tiers = list(dict.fromkeys(s.tier for s in scores))
    print("| tier, half | " + " | ".join(c.replace("_", " ") for c in COLUMNS) + " |\n|---|" + "---|" * len(COLUMNS))
    for tier in tiers:
        for half in ("tune", "held-out", "both"):
            now = summary(_pick(scores, tier, half))
            then = summary(_pick(before, tier, half)) if before and _pick(before, tier, half) else None
            cells = []
            for column in COLUMNS:
                value = now[column]
                text = f"{value:.3f}" if isinstance(value, float) and column != "seconds" else str(value)
                if then is not None and column not in ("documents", "tables", "seconds") and then[column] != value:
                    old = then[column]
                    text = (f"{old:.3f} → {text}" if isinstance(old, float) else f"{old} → {text}")
                cells.append(text)
            print(f"| {tier}, {half} | " + " | ".join(cells) + " |")
    errors = [s for s in scores if s.error]
    for s in errors:
        print(f"- {s.file} ({s.tier}): {s.error}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", type=Path, default=FOLDER)
    parser.add_argument("--tiers", default=",".join(TIERS))
    parser.add_argument("--documents", action="store_true", help="also print each document's scores")
    parser.add_argument("--save", type=Path, help="write every document's scores here (JSON)")
    parser.add_argument("--compare", type=Path, help="a saved run (--save): before → after")
    args = parser.parse_args()
    tiers = [t for t in args.tiers.split(",") if t]
    unknown = sorted(set(tiers) - set(TIERS))
    if unknown:
        raise SystemExit(f"--tiers: unknown {', '.join(unknown)} (choose from {', '.join(TIERS)})")
    if not any(args.folder.glob("eu-*.pdf")):
        raise SystemExit(f"{args.folder}: no eu-*.pdf (this benchmark reads the real documents there)")
    print(f"machine: {machine()}; {args.folder}\n")
    scores = run(args.folder, tiers)
    before = ([DocumentScore(**row) for row in json.loads(args.compare.read_text())] if args.compare else None)
    if before is not None and {(s.file, s.tier) for s in before} != {(s.file, s.tier) for s in scores}:
        print(f"note: {args.compare} scored other documents or tiers; only the rows both cover compare\n")
        shared = {(s.file, s.tier) for s in before} & {(s.file, s.tier) for s in scores}
        before = [s for s in before if (s.file, s.tier) in shared]
    report(scores, before)
    if args.documents:
        print("\n| file | half | tier | tables | detected | spurious | cell recall | cell precision | adjacency F1 |"
              " missed on pages |\n|---|---|---|---|---|---|---|---|---|---|")
        for s in scores:
            one = summary([s])
            print(f"| {s.file} | {s.half} | {s.tier} | {s.tables} | {s.detected} | {s.spurious} | "
                  f"{one['cell_recall']:.2f} | {one['cell_precision']:.2f} | {one['adjacency_f1']:.2f} | "
                  f"{', '.join(map(str, s.missed_pages))} |")
    if args.save:
        args.save.write_text(json.dumps([asdict(s) for s in scores], indent=1))


if __name__ == "__main__":
    main()
