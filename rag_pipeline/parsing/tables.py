"""Tables found by the alignment of their numbers, whatever rules are drawn in them.

Financial statements, statistical abstracts and most report tables are borderless: a stub column of row labels
(indented to show hierarchy, often with dot leaders) and columns of right-aligned figures under a header of
periods or categories, sometimes several header lines deep. Rules, where drawn, underline subtotals; a
rule-based finder sees each underlined row as a table of its own and the rest as prose. Here a table is a run
of lines whose figures share columns: columns come from the horizontal overlap of figures across rows, the
header from the lines above the first row of figures (merged per column, phrases that span columns repeated
over each), the caption from the short block of lines above that. Lines with only a label inside the run are
section rows ("Operating activities:"); the run ends at its last row of figures, so footnotes stay text.

Input is words as pdfplumber gives them (`text`, `x0`, `x1`, `top`, `bottom`); nothing here reads a PDF.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

Word = Mapping[str, Any]

# A figure: optional sign, currency and parentheses around digits with separators; a percent or a footnote
# star may follow. Placeholders stand for "zero", "not applicable" or "not meaningful".
FIGURE_RE = re.compile(r"^[(\[]?[-+−–]?[$€£¥]?\s?\(?\d[\d,.\s]*\)?\s?%?\)?[\])]?\*?$")
PLACEHOLDERS = frozenset({"-", "–", "—", "−", "(X)", "X", "NA", "N/A", "n/a", "NM", "nm", "n.m.", "*", "**", "(NA)",
                          "(D)", "(Z)", "(S)", "—%", "-%", "–%"})
CURRENCY = frozenset({"$", "€", "£", "¥", "US$"})
# Lettered footnote markers a figure may carry ("444 (f)", "— (c)", "5,405 (c)(d)"): part of the figure's cell.
# Numbered ones are left alone: "(1)" is minus one in a statement. Bounded: re.sub tries every "(" of a word.
FOOTNOTE_MARKS_RE = re.compile(r"^(?:\([a-z]{1,3}\)){1,4}$")
TRAILING_MARKS_RE = re.compile(r"(?:\s?\([a-z]{1,3}\)){1,4}$")
# Dot leaders inside or after a label. Each alternative starts at a dot: a pattern that starts with \s* would try
# every space of a long run and backtrack over the rest (quadratic).
LEADER_RE = re.compile(r"(?:\.\s*){3,}|(?:\.\s*){2,}$")
TITLE_RE = re.compile(r"^(?:Table|Tabelle|Tableau|Exhibit|Schedule|Statement|Note)\s+[\w.-]+", re.IGNORECASE)
# A line that numbers a table ("Table 8.19 - Coffee ...", "Exhibit 4"): its caption, never a line of its header (a
# header may start with "Note" or "Statement", or "Table" followed by a word: "Table name | Rows")
NUMBERED_TABLE_RE = re.compile(r"^(?:Table|Tabelle|Tableau|Exhibit)\s+[A-Z]?\d[\w.]*", re.IGNORECASE)
YEARISH_RE = re.compile(r"^(?:19|20)\d\d$|^(?:Q[1-4]|FY)\s?\d{2,4}$", re.IGNORECASE)

MAX_HEADER_LINES = 5
MAX_CAPTION_LINES = 6
MAX_CAPTION_CHARS = 600
PROSE_CHARS = 100  # below a title, this much text ending a sentence is a paragraph, not the title's notes


@dataclass
class Cell:
    text: str
    x0: float
    x1: float
    top: float
    bottom: float
    closed: bool = False  # a dot leader ended it: nothing more joins it

    @property
    def is_figure(self) -> bool:
        return is_figure(self.text)


@dataclass
class Line:
    cells: list[Cell]
    top: float
    bottom: float

    @property
    def x0(self) -> float:
        return self.cells[0].x0

    @property
    def x1(self) -> float:
        return self.cells[-1].x1

    @property
    def text(self) -> str:
        return " ".join(c.text for c in self.cells)

    def figures(self) -> list[Cell]:
        """The figures that end the line: the row's values (a label may itself contain a number)."""
        values: list[Cell] = []
        for cell in reversed(self.cells):
            if not cell.is_figure:
                break
            values.insert(0, cell)
        return values

    def label(self) -> str:
        values = len(self.figures())
        return " ".join(c.text for c in self.cells[: len(self.cells) - values])


@dataclass
class Table:
    """One table: rows[0] is its header (stub header first), then one row per line; bbox covers header and
    rows; caption is the title and notes above it, on one line, or ''."""

    rows: list[list[str]]
    bbox: tuple[float, float, float, float]
    caption: str = ""
    caption_bbox: tuple[float, float, float, float] | None = None  # the lines the caption was read from
    header_lines: int = 0  # 0: rows[0] is an empty header (the table has none)


def is_figure(text: str) -> bool:
    text = text.strip()
    if not FOOTNOTE_MARKS_RE.match(text):
        text = TRAILING_MARKS_RE.sub("", text)
    if text in PLACEHOLDERS:
        return True
    return bool(FIGURE_RE.match(text)) and any(ch.isdigit() for ch in text)


def _strip_leaders(text: str) -> str:
    return " ".join(LEADER_RE.sub(" ", text).split())


def group_lines(words: Sequence[Word]) -> list[list[Word]]:
    """Words -> lines, top to bottom, each left to right. A word joins the line whose first word's vertical
    centre is within half a line height of its own (zero-height words at the same height included). Words
    more than three times the usual height (a rotated margin stamp, a brace) would chain lines together: they
    are left out, as they are of no table."""
    heights = sorted(float(w["bottom"]) - float(w["top"]) for w in words)
    usual = heights[len(heights) // 2] if heights else 0.0
    lines: list[list[Word]] = []
    reference: tuple[float, float] = (0.0, 0.0)  # centre and height of the current line's first word
    for word in sorted(words, key=lambda w: (float(w["top"]), float(w["x0"]))):
        height = float(word["bottom"]) - float(word["top"])
        if usual and height > 3 * usual:
            continue
        centre = (float(word["top"]) + float(word["bottom"])) / 2
        if lines and abs(centre - reference[0]) <= 0.5 * max(reference[1], height, 1.0):
            lines[-1].append(word)
            continue
        lines.append([word])
        reference = (centre, height)
    return [sorted(line, key=lambda w: float(w["x0"])) for line in lines]


def _cells(line: list[Word], gap: float) -> list[Cell]:
    """Words -> cells: a gap wider than `gap` separates cells; a lone currency sign joins the figure after it;
    dot leaders end a label and are dropped."""
    cells: list[Cell] = []
    for word in line:
        text = str(word["text"])
        x0, x1 = float(word["x0"]), float(word["x1"])
        top, bottom = float(word["top"]), float(word["bottom"])
        if set(text) <= {".", "…", " "} and len(text.strip()) >= 1 and cells and not cells[-1].is_figure:
            cells[-1].x1 = max(cells[-1].x1, x1)  # a leader belongs to the label before it
            cells[-1].closed = True
            continue
        previous = cells[-1] if cells else None
        if previous is not None and previous.is_figure and FOOTNOTE_MARKS_RE.match(text) \
                and x0 - previous.x1 <= 2 * gap:
            # Its figure's marker (farther off, it is a value of its own column, as "(s)" for "under 0.5" is). The
            # figure keeps its own box: a marker that sticks out to the right widens no column, and the next
            # figure is measured from the figure, not the marker.
            previous.text = f"{previous.text} {text}"
            continue
        joins = previous is not None and x0 - previous.x1 <= gap and not previous.closed
        # A decimal part split from its number by kerning ("11,062 .6") belongs to it.
        decimal = previous is not None and previous.is_figure and re.fullmatch(r"\.\d+", text) is not None \
            and x0 - previous.x1 <= 2 * gap
        currency = previous is not None and previous.text in CURRENCY and is_figure(text)
        if previous is not None and (joins or decimal or currency):
            separator = "" if currency or (decimal and not joins) or re.fullmatch(r"\.\d+", text) else " "
            previous.text = f"{previous.text}{separator}{text}"
            previous.x1, previous.bottom = max(previous.x1, x1), max(previous.bottom, bottom)
            previous.top = min(previous.top, top)
        else:
            cells.append(Cell(text, x0, x1, top, bottom))
    for cell in cells:
        cell.text = _strip_leaders(cell.text)
    return [c for c in cells if c.text]


def _cell_gap(lines: list[list[Word]]) -> float:
    """The widest gap that still separates words of one phrase: a little over the page's word spacing."""
    heights = [float(w["bottom"]) - float(w["top"]) for line in lines for w in line]
    em = median(heights) if heights else 10.0
    spaces = sorted(float(b["x0"]) - float(a["x1"]) for line in lines for a, b in zip(line, line[1:], strict=False)
                    if 0 < float(b["x0"]) - float(a["x1"]) < em)
    space = spaces[len(spaces) // 4] if spaces else 0.25 * em  # a low quantile: most gaps in prose are spaces
    return max(1.8 * space, 0.45 * em)


def _is_data_row(line: Line, gap: float) -> bool:
    figures = line.figures()
    if not figures:
        return False
    if len(figures) == len(line.cells):
        return True
    # A label and its figures: in prose a number sits inside a sentence at ordinary word spacing.
    first = figures[0]
    before = line.cells[len(line.cells) - len(figures) - 1]
    return first.x0 - before.x1 > gap or before.closed


def _columns(cells: list[Cell]) -> list[tuple[float, float]]:
    """Column spans from figures that overlap horizontally across rows (right-, centre- or left-aligned)."""
    spans: list[list[float]] = []
    for cell in sorted(cells, key=lambda c: c.x0):
        if spans and cell.x0 <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], cell.x1)
        else:
            spans.append([cell.x0, cell.x1])
    return [(a, b) for a, b in spans]


def _column_of(cell: Cell, columns: list[tuple[float, float]]) -> int:
    centre = (cell.x0 + cell.x1) / 2
    best, distance = 0, float("inf")
    for index, (a, b) in enumerate(columns):
        d = 0.0 if a <= centre <= b else min(abs(centre - a), abs(centre - b))
        if d < distance:
            best, distance = index, d
    return best


def _overlapped_columns(cell: Cell, columns: list[tuple[float, float]]) -> list[int]:
    covered = [i for i, (a, b) in enumerate(columns) if min(b, cell.x1) - max(a, cell.x0) > 0.3 * min(b - a, 1e9)]
    return covered or [_column_of(cell, columns)]


def _pitch(lines: list[Line]) -> float:
    steps = [b.top - a.top for a, b in zip(lines, lines[1:], strict=False) if b.top > a.top]
    return median(steps) if steps else 12.0


def figure_rows(words: Sequence[Word]) -> list[tuple[float, float, float, float]]:
    """Boxes of the lines that read as a table row (a worded label, then two figures or more set apart from
    it): outside any table found, they are numbers a table finder missed."""
    raw = group_lines(words)
    if not raw:
        return []
    gap = _cell_gap(raw)
    boxes = []
    for cells in (_cells(line, gap) for line in raw):
        if not cells:
            continue
        line = Line(cells, min(c.top for c in cells), max(c.bottom for c in cells))
        figures = line.figures()
        # A worded label and a figure of two digits or more: sub- and superscripts of formulas are neither.
        worded = sum(ch.isalpha() for ch in line.label()) >= 3
        if len(figures) >= 2 and worded and any(sum(ch.isdigit() for ch in c.text) >= 2 for c in figures) \
                and _is_data_row(line, gap):
            boxes.append((line.x0, line.top, line.x1, line.bottom))
    return boxes


def find_tables(words: Sequence[Word], min_columns: int = 2) -> list[Table]:
    """Tables of aligned figures on one page (words of the page, in any order)."""
    raw = group_lines(words)
    if len(raw) < 2:
        return []
    gap = _cell_gap(raw)
    lines = [Line(cells, min(c.top for c in cells), max(c.bottom for c in cells))
             for cells in (_cells(line, gap) for line in raw) if cells]
    pitch = _pitch(lines)
    data = [_is_data_row(line, gap) for line in lines]
    tables: list[Table] = []
    used_until = -1
    index = 0
    budget = 20 * len(lines)  # a backstop on lines read by runs that fail, whatever a hostile page holds
    while index < len(lines) and budget > 0:
        if not data[index] or index <= used_until:
            index += 1
            continue
        run = _grow_run(lines, data, index, pitch)
        budget -= len(run)
        table = _table_from_run(lines, data, run, pitch, gap, used_until, min_columns)
        if isinstance(table, Table):
            tables.append(table)
            used_until = run[-1]
            index = run[-1] + 1
        elif table == "too few columns":
            # The figures of any run starting later in this one are a subset: they cannot make more columns.
            index = run[-1] + 1
        else:
            index += 1
    return tables


def _grow_run(lines: list[Line], data: list[bool], start: int, pitch: float) -> list[int]:
    """Line indexes from a row of figures down to the last row of figures that continues it: label-only lines
    (section rows, wrapped labels) may sit between rows of figures; a wide gap or a line running across the
    figures' columns ends the run."""
    run = [start]
    figures_left = min(c.x0 for c in lines[start].figures())
    pending: list[int] = []
    for index in range(start + 1, len(lines)):
        line, previous = lines[index], lines[(pending or run)[-1]]
        if line.top - previous.bottom > 2.2 * pitch:
            break
        if data[index]:
            run.extend(pending)
            pending = []
            run.append(index)
            figures_left = min(figures_left, min(c.x0 for c in line.figures()))
        elif len(line.cells) <= 2 and line.x1 <= figures_left + 2 and len(pending) < 3:
            pending.append(index)
        else:
            break
    return run


def _table_from_run(lines: list[Line], data: list[bool], run: list[int], pitch: float, gap: float,
                    used_until: int, min_columns: int) -> Table | str:
    """The table a run of lines makes, or why it makes none."""
    body = [lines[i] for i in run]
    figures = [c for line in body for c in line.figures()]
    columns = _columns(figures)
    supported = [span for span in columns if sum(1 for c in figures if span[0] <= (c.x0 + c.x1) / 2 <= span[1]) >= 2]
    if len(columns) < min_columns or len(supported) < min_columns:
        return "too few columns"
    # Leading rows of periods ("2023 2022", or "Sector 2022 2023" with the stub's header) are header lines.
    header_figure_rows = 0
    for line in body:
        if (line.label() and header_figure_rows) or not all(YEARISH_RE.match(TRAILING_MARKS_RE.sub("", c.text)) for c in line.figures()):
            break
        header_figure_rows += 1
    data_rows = [line for line in body[header_figure_rows:] if line.figures()]
    if not data_rows:
        return "no row of data"  # years under years: an axis or a list of editions
    labels_left = min(line.x0 for line in body)
    header = _header_lines(lines, run[0], columns, labels_left, pitch, used_until)
    header += [body[i] for i in range(header_figure_rows)]
    if len(data_rows) < 2 and not header:
        return "a lone row"  # a lone row of figures without a header is not a table
    body = body[header_figure_rows:]
    rows = [_header_row(header, columns)]
    for line in body:
        row = [line.label()] + [""] * len(columns)
        for cell in line.figures():
            column = _column_of(cell, columns) + 1
            row[column] = f"{row[column]} {cell.text}".strip()
        rows.append(row)
    x0 = min(line.x0 for line in header + body)
    x1 = max(line.x1 for line in header + body)
    bbox = (x0, min(line.top for line in header + body), x1, max(line.bottom for line in body))
    caption, caption_bbox = _caption(lines, lines.index((header + body)[0]), pitch, used_until, x1 - x0)
    return Table(rows, bbox, caption, caption_bbox, len(header))


def _header_lines(lines: list[Line], first: int, columns: list[tuple[float, float]], labels_left: float,
                  pitch: float, used_until: int) -> list[Line]:
    """Lines above the first row of figures with phrases over the columns (and perhaps a stub header such as
    "Offense charged" left of them). A phrase that starts in the stub and runs into the columns (a title
    centred on the page, a note), or a line that numbers a table (its caption, set over the columns), ends the
    header."""
    figures_left = columns[0][0]
    stub_reach = labels_left + 0.25 * (figures_left - labels_left)
    header: list[Line] = []
    for line in _lines_above(lines, first, used_until, MAX_HEADER_LINES, 1.6 * pitch):
        over_columns = [c for c in line.cells if (c.x0 + c.x1) / 2 >= figures_left - 2 and c.x0 > stub_reach]
        in_stub = [c for c in line.cells if c.x1 < figures_left]
        if (not over_columns or len(over_columns) + len(in_stub) < len(line.cells)
                or NUMBERED_TABLE_RE.match(line.text)):
            break
        header.insert(0, line)
    return header


def _lines_above(lines: list[Line], first: int, used_until: int, most: int, max_gap: float) -> Iterator[Line]:
    """The lines above lines[first], nearest first, while each is within max_gap of the one below it; at most
    `most`, and none at or above line `used_until` (the previous table's)."""
    below = lines[first]
    for index in range(first - 1, max(used_until, first - 1 - most), -1):
        line = lines[index]
        if below.top - line.bottom > max_gap:
            return
        yield line
        below = line


def _header_row(header: list[Line], columns: list[tuple[float, float]]) -> list[str]:
    """One header row from several header lines, per column top to bottom. A line with a phrase for at most
    every other column is a group line ("Year Ended December 31,", "Male | Female"): each of its phrases heads
    the columns nearer to it than to its neighbours; on other lines a phrase heads the columns it overlaps."""
    figures_left = columns[0][0]
    head = [""] * (len(columns) + 1)
    centres = [(a + b) / 2 for a, b in columns]
    for line in header:
        phrases = [c for c in line.cells if (c.x0 + c.x1) / 2 >= figures_left - 2]
        for cell in line.cells:
            if cell not in phrases:
                head[0] = f"{head[0]} {cell.text}".strip()
        group_line = len(phrases) <= len(columns) / 2
        for position, cell in enumerate(phrases):
            if group_line:
                left = (phrases[position - 1].x1 + cell.x0) / 2 if position else float("-inf")
                right = (cell.x1 + phrases[position + 1].x0) / 2 if position + 1 < len(phrases) else float("inf")
                owned = [i for i, centre in enumerate(centres) if left <= centre < right]
            else:
                owned = _overlapped_columns(cell, columns)
            for column in owned:
                head[column + 1] = f"{head[column + 1]} {cell.text}".strip()
    return head


def _caption(lines: list[Line], first: int, pitch: float, used_until: int,
             table_width: float) -> tuple[str, tuple[float, float, float, float] | None]:
    """The short block of lines right above the table (title, units, notes) when it starts with a title: a
    line naming a table, set in capitals, or short beside the table and not a sentence's end. Returns its text
    on one line and the box of the lines it took (a block too long for a caption gives only its title)."""
    block = list(_lines_above(lines, first, used_until, MAX_CAPTION_LINES, 1.2 * pitch))[::-1]
    # Notes of what came before may run into the title: the block starts at its last line that names a
    # table or is set in capitals, else at its first line when that one reads like a title.
    starts = [i for i, line in enumerate(block) if TITLE_RE.match(line.text) or _capitals(line.text)]
    if starts:
        block = block[starts[-1]:]
    if not block:
        return "", None
    title = block[0].text
    short = len(title) <= 80 and (block[0].x1 - block[0].x0) <= 0.7 * max(table_width, 1.0)
    if not (starts or short) or title.endswith((".", ",", ";", ":")) and not TITLE_RE.match(title):
        return "", None  # the end of a paragraph, not a title
    if not TITLE_RE.match(title) and _prose(block[1:]):
        return "", None  # a heading over a paragraph over the table: the heading and the text stay on the page
    text = " ".join(_strip_leaders(line.text) for line in block)
    if len(text) > MAX_CAPTION_CHARS:
        block, text = block[:1], title
    return text, (min(line.x0 for line in block), block[0].top, max(line.x1 for line in block), block[-1].bottom)


def _prose(lines: list[Line]) -> bool:
    """Sentences rather than a caption's notes (units, periods, sources): a paragraph's worth of text that ends
    a sentence."""
    text = " ".join(line.text for line in lines).strip()
    return len(text) >= PROSE_CHARS and text.endswith((".", "!", "?"))


def _capitals(text: str) -> bool:
    letters = [ch for ch in text if ch.isalpha()]
    return len(letters) >= 6 and all(ch.isupper() for ch in letters)
