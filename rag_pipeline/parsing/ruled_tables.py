"""Tables drawn with ruled lines, as pdfplumber finds them, to Markdown with their header row and caption."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from rag_pipeline.parsing.columns import find_gutters, group_words_into_lines


def _cell(value: Any) -> str:
    return " ".join(str(value or "").split()).replace("|", "\\|")


def table_to_markdown(rows: list[list[Any]], empty_header: bool = False) -> str:
    """Rows (first row = header) -> a Markdown table; ragged rows are padded. Empty rows are dropped, but with
    `empty_header` an empty first row stays: a table without a header must not promote its first row."""
    header = rows[:1] if empty_header and len(rows) > 1 else []
    rows = header + [r for r in rows[len(header):] if any(c not in (None, "") for c in r)]
    if len(rows) <= len(header):
        return ""
    width = max(len(r) for r in rows)
    padded = [[_cell(c) for c in r] + [""] * (width - len(r)) for r in rows]
    lines = ["| " + " | ".join(padded[0]) + " |", "|" + "---|" * width]
    lines += ["| " + " | ".join(r) + " |" for r in padded[1:]]
    return "\n".join(lines)


def _drop_empty_rows_and_columns(rows: list[list[Any]]) -> list[list[Any]]:
    rows = [r for r in rows if any(c not in (None, "") for c in r)]
    if not rows:
        return []
    width = max(len(r) for r in rows)
    keep = [j for j in range(width) if any(j < len(r) and r[j] not in (None, "") for r in rows)]
    return [[r[j] if j < len(r) else None for j in keep] for r in rows]


@dataclass
class PageTable:
    bbox: tuple[float, float, float, float]
    rows: list[list[Any]]
    caption: str = ""
    caption_bbox: tuple[float, float, float, float] | None = None  # the lines the caption was read from
    kind: str = "ruled"  # ruled | aligned
    row_boxes: list[tuple[float, float, float, float]] | None = None  # a ruled grid's rows, as pdfplumber cut them

    @property
    def top(self) -> float:
        return min(self.bbox[1], self.caption_bbox[1]) if self.caption_bbox else self.bbox[1]


def _filled(row: list[Any]) -> int:
    return sum(1 for cell in row if cell not in (None, ""))


def _is_real_table(rows: list[list[Any]]) -> bool:
    """Two rows and two columns at least, and a row that sets two values side by side. A ruled "table" of one row
    is an underlined line (a subtotal rule, a box around a note), and is read as text or as part of the aligned
    table around it; a grid none of whose rows fills two cells is a page's frame (a text box beside a sidebar or a
    side tab), whose prose is read as prose, column by column."""
    rows = _drop_empty_rows_and_columns(rows)
    return (len(rows) >= 2 and max(len(r) for r in rows) >= 2
            and any(_filled(row) >= 2 for row in rows))


# A grid this ragged is broken (the default of parsing.max_ragged_table_ratio, above which a page escalates): only
# then may the aligned reading replace it. Below it, a grid's sparse rows are more likely a text column the aligned
# reading would fold into the label.
BROKEN_GRID_RAGGEDNESS = 0.34


def ragged_ratio(rows: list[list[Any]]) -> float:
    """Share of a table's rows whose filled-cell count differs from most rows': a sign of broken structure.
    Rows with only their label filled are section rows ("Operating activities:"), not broken ones."""
    filled = [_filled(row) for row in rows[1:]]
    body = [n for n in filled if n > 1]
    if not body:
        return 0.0
    usual = max(set(body), key=body.count)
    return round(sum(1 for n in body if n != usual) / len(body), 3)


def rows_in_one_cell(grid: PageTable, table: PageTable) -> bool:
    """The grid holds most of the aligned table's rows each in one cell, where the aligned reading sets most of them
    in two cells or more: rules drawn under each row and none between the columns (statistical tables) leave a
    row's label and figures in one cell. Only the grid's rows within the aligned table count."""
    if not grid.row_boxes:
        return False
    inside = [row for row, box in zip(grid.rows, grid.row_boxes, strict=False)
              if table.bbox[1] <= (box[1] + box[3]) / 2 <= table.bbox[3] and _filled(row)]
    body = [row for row in table.rows[1:] if _filled(row)]
    return (bool(inside) and sum(1 for row in inside if _filled(row) == 1) > len(inside) / 2
            and sum(1 for row in body if _filled(row) >= 2) > len(body) / 2)


def _inside(box: tuple[float, float, float, float], outer: tuple[float, float, float, float]) -> bool:
    x0, top, x1, bottom = box
    cx, cy = (x0 + x1) / 2, (top + bottom) / 2
    return outer[0] - 1 <= cx <= outer[2] + 1 and outer[1] - 1 <= cy <= outer[3] + 1


def _overlaps(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return min(a[2], b[2]) > max(a[0], b[0]) and min(a[3], b[3]) > max(a[1], b[1])


def find_page_tables(page: Any, words: list[dict[str, Any]] | None = None
                     ) -> tuple[list[PageTable], dict[str, int]]:
    """The page's tables and how they were found.

    Aligned tables (figures sharing columns, see rag_pipeline.parsing.tables) and ruled tables are both looked for. A
    ruled table that holds an aligned table, resolves as many columns and is no more ragged keeps its ruled cells;
    any other ruled table that overlaps an aligned one (the rows between two subtotal rules, a grid of header rules
    only, a grid whose shaded rows split each row in two) gives way to it; a ruled table of one row is never a
    table. `words`: the page's `extract_words()`, when read already."""
    from rag_pipeline.parsing import tables as aligned_tables

    ruled_found = [(t.bbox, t.extract(), [row.bbox for row in t.rows]) for t in page.find_tables()]
    ruled = [PageTable(bbox, rows, row_boxes=boxes) for bbox, rows, boxes in ruled_found if _is_real_table(rows)]
    # Sideways words (a rotated margin stamp, a vertical axis title) belong to no row.
    words = [w for w in (page.extract_words() if words is None else words) if w.get("upright", True)]
    # Beside columns of prose, lines are read per column: a table in one column must not take the other's text.
    gutters = find_gutters(group_words_into_lines(words), float(page.width))
    bounds = [float("-inf"), *gutters, float("inf")]
    aligned = [PageTable(t.bbox, t.rows, t.caption, t.caption_bbox, "aligned")
               for lo, hi in zip(bounds, bounds[1:], strict=False)
               for t in aligned_tables.find_tables([w for w in words if lo <= (w["x0"] + w["x1"]) / 2 < hi])]
    def holds(grid: PageTable, table: PageTable) -> bool:
        """The grid has the better cells for the aligned table: it holds it, resolves as many columns, does not
        hold its rows each in one cell, and is not broken where the aligned reading holds together (rules drawn
        around shaded rows cut a grid that puts a row's label in one row and its figures in the next)."""
        grid_ragged = ragged_ratio(grid.rows)
        return (len(grid.rows) >= 3 and _inside(table.bbox, grid.bbox)
                and max(len(row) for row in grid.rows) >= len(table.rows[0])
                and not rows_in_one_cell(grid, table)
                and (grid_ragged <= BROKEN_GRID_RAGGEDNESS or grid_ragged <= ragged_ratio(table.rows)))

    # Decided per grid, so the answer does not depend on which aligned table is looked at first: a grid stays
    # if it has the better cells for every aligned table it overlaps, and gives way to all of them otherwise.
    ruled = [r for r in ruled if all(holds(r, t) for t in aligned if _overlaps(r.bbox, t.bbox))]
    kept_aligned = []
    for table in aligned:
        holders = [r for r in ruled if _overlaps(r.bbox, table.bbox)]
        if holders:
            if table.caption and not holders[0].caption:
                holders[0].caption, holders[0].caption_bbox = table.caption, table.caption_bbox
            continue
        kept_aligned.append(table)
    found = sorted(ruled + kept_aligned, key=lambda t: t.bbox[1])
    stray = [row for row in aligned_tables.figure_rows(words) if not any(_inside(row, t.bbox) for t in found)]
    stats = {"ruled_tables": len(ruled), "aligned_tables": len(kept_aligned),
             "one_row_rulings": sum(1 for _, rows, _ in ruled_found if not _is_real_table(rows)),
             "stray_figure_rows": len(stray)}
    return found, stats


SELF_NAMED_CAPTION_RE = re.compile(r"^(?:Table|Tabelle|Tableau)\b", re.IGNORECASE)


def table_block(table: PageTable) -> str:
    """A table's Markdown with its caption on the line above (`Table: ...` unless it names itself)."""
    markdown = table_to_markdown(table.rows, empty_header=table.kind == "aligned")
    if not markdown or not table.caption:
        return markdown
    caption = " ".join(table.caption.split())
    if not SELF_NAMED_CAPTION_RE.match(caption):
        caption = f"Table: {caption}"  # pandoc's caption line; the chunker keeps it with the table
    return f"{caption}\n{markdown}"
