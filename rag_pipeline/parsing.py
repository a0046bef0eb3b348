"""Parsing documents into per-page Markdown.

PDFs go through pdfplumber page by page (streamed, so memory stays flat on long files); DOCX, PPTX,
XLSX, HTML and Markdown go through Docling's native converters, which run offline. Files that cannot
be parsed raise `DeadLetter` with a specific reason; the caller records it and moves on.
"""

from __future__ import annotations

import importlib.metadata
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from rag_pipeline import forms, rtl

PDF_SUFFIXES = {".pdf"}
DOCLING_SUFFIXES = {".docx", ".pptx", ".xlsx", ".html", ".htm", ".md"}
TEXT_SUFFIXES = {".txt"}
SUPPORTED_SUFFIXES = PDF_SUFFIXES | DOCLING_SUFFIXES | TEXT_SUFFIXES

CID_GLYPH_RE = re.compile(r"\(cid:\d+\)")
UNMAPPED_RUN_RE = re.compile(r"(?:\(cid:\d+\)|\ufffd)+")  # glyphs in a row: a word the font could not map
TABLE_SEPARATOR_RE = re.compile(r"^\|(?:\s*:?-{3,}:?\s*\|)+\s*$", re.MULTILINE)

ZIPPED_SUFFIXES = {".docx", ".pptx", ".xlsx"}
MAX_ZIP_ENTRIES = 50_000

# timeout, memory and crashed: the document's worker process went over its budget or died (rag_pipeline.isolation).
DEAD_LETTER_REASONS = ("empty", "truncated", "corrupt", "encrypted", "unsupported", "too_large", "parser_error",
                       "timeout", "memory", "crashed")


class DeadLetter(Exception):
    """A document that cannot be parsed, with one of DEAD_LETTER_REASONS and a human-readable detail."""

    def __init__(self, reason: str, detail: str = ""):
        assert reason in DEAD_LETTER_REASONS, reason
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass
class ParsedPage:
    page: int  # 1-based
    tier: str  # pdfplumber | docling | text
    markdown: str
    seconds: float
    tables: int = 0
    signals: dict[str, Any] = field(default_factory=dict)


@lru_cache(maxsize=1)
def parser_version() -> str:
    """Changes whenever a parser that shapes the text changes, so stored pages can be trusted."""
    versions = {name: importlib.metadata.version(name) for name in ("pdfplumber", "docling-slim")}
    return f"rp3;pdfplumber={versions['pdfplumber']};docling={versions['docling-slim']}"


@dataclass(frozen=True)
class ParseLimits:
    """What a file may unpack to (parsing.max_pages, max_page_content_bytes, max_unpacked_bytes): a small file
    can expand without bound, so each is checked before the parser spends memory on it."""

    max_pages: int = 5000
    max_page_content_bytes: int = 64 * 1024 * 1024
    max_unpacked_bytes: int = 512 * 1024 * 1024


def parse_file(path: Path, password: str | None = None, limits: ParseLimits = ParseLimits()) -> Iterator[ParsedPage]:
    """Yield the pages of one file. Raises DeadLetter for files that cannot be parsed."""
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        raise DeadLetter("unsupported", f"no parser for {suffix or 'files without an extension'}")
    if path.stat().st_size == 0:
        raise DeadLetter("empty", "zero-byte file")
    if suffix in PDF_SUFFIXES:
        yield from _parse_pdf(path, password, limits)
    elif suffix in DOCLING_SUFFIXES:
        if suffix in ZIPPED_SUFFIXES:
            check_unpacked_size(path, limits.max_unpacked_bytes)
        yield from _parse_with_docling(path)
    else:
        started = time.perf_counter()
        text = path.read_bytes().decode("utf-8", errors="replace")
        yield ParsedPage(1, "text", text, time.perf_counter() - started, signals={"chars": len(text)})


# --- PDF (pdfplumber) -------------------------------------------------------------------------------


def _pdf_failure(path: Path, exc: Exception) -> DeadLetter:
    from pdfminer.pdfdocument import PDFEncryptionError, PDFPasswordIncorrect
    from pdfminer.psparser import PSEOF

    cause = exc.args[0] if exc.args and isinstance(exc.args[0], Exception) else exc
    if isinstance(cause, PDFPasswordIncorrect | PDFEncryptionError):
        return DeadLetter("encrypted", "encrypted PDF and no (or a wrong) password in its sidecar metadata")
    with path.open("rb") as handle:
        handle.seek(max(0, path.stat().st_size - 2048))
        has_eof_marker = b"%%EOF" in handle.read()
    if isinstance(cause, PSEOF) or not has_eof_marker:
        return DeadLetter("truncated", f"file ends early ({type(cause).__name__}: {cause})")
    return DeadLetter("corrupt", f"{type(cause).__name__}: {cause}")


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


def _group_lines(words: list[dict[str, Any]], tolerance: float = 3.0) -> list[list[dict[str, Any]]]:
    """Words -> lines (by baseline proximity), top to bottom, each sorted left to right."""
    lines: list[list[dict[str, Any]]] = []
    for word in sorted(words, key=lambda w: (w["top"], w["x0"])):
        if lines and abs(lines[-1][0]["top"] - word["top"]) <= tolerance:
            lines[-1].append(word)
        else:
            lines.append([word])
    return [sorted(line, key=lambda w: w["x0"]) for line in lines]


MAX_PAGE_POINTS = 14_400.0  # 200 inches, the largest page size PDF 1.7 allows


def find_gutters(lines: list[list[dict[str, Any]]], width: float) -> list[float]:
    """x positions of vertical gutters between text columns (empty for single-column pages).

    A gutter is a band at least 5pt wide that almost no line covers, with prose on both sides:
    every column must hold enough lines of several words, which rules out borderless tables.
    """
    if len(lines) < 6:
        return []
    # The page's width comes from the file: the coverage array is bounded by the largest page PDF allows.
    width = max(0.0, min(width, MAX_PAGE_POINTS))
    coverage = [0] * (int(width) + 2)
    for line in lines:
        covered = set()
        for word in line:
            covered.update(range(max(0, int(word["x0"])), min(len(coverage), int(word["x1"]) + 1)))
        for x in covered:
            coverage[x] += 1
    left = max(0, min(int(w["x0"]) for line in lines for w in line))
    right = min(len(coverage) - 1, max(int(w["x1"]) for line in lines for w in line))
    quiet = int(0.05 * len(lines))  # a few lines (titles, headers) may cross a gutter; none on a short page
    gutters: list[float] = []
    x = left + int(0.15 * (right - left))
    while x < left + int(0.85 * (right - left)):
        if coverage[x] <= quiet:
            start = x
            while x < right and coverage[x] <= quiet:
                x += 1
            if x - start >= 5:
                gutters.append((start + x) / 2)
        x += 1
    if not gutters:
        return []
    bounds = [left - 1, *gutters, right + 1]
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        column_lines = [
            [w for w in line if lo <= (w["x0"] + w["x1"]) / 2 < hi] for line in lines
        ]
        prose = [cl for cl in column_lines if len(cl) >= 4]
        if len(prose) < 3:
            return []
    return gutters


def _spans_gutter(line: list[dict[str, Any]], gutters: list[float]) -> bool:
    """A line that runs across a gutter with ordinary word spacing (a title, a running header)."""
    for gutter in gutters:
        for a, b in zip(line, line[1:], strict=False):
            if a["x0"] < gutter < a["x1"]:
                return True
            if a["x1"] <= gutter <= b["x0"] and b["x0"] - a["x1"] < 4:
                return True
    return False


def column_text(page: Any) -> tuple[str | None, int]:
    """Text of a multi-column page in reading order (column by column) and its column count;
    (None, 1) for a single-column page."""
    words = page.extract_words(keep_blank_chars=False, use_text_flow=False)
    lines = _group_lines(words)
    gutters = find_gutters(lines, float(page.width))
    if not gutters:
        return None, 1
    bounds = [float("-inf"), *gutters, float("inf")]
    out: list[str] = []
    columns: list[list[str]] = [[] for _ in gutters] + [[]]

    def flush() -> None:
        for column in columns:
            out.extend(column)
            column.clear()

    for line in lines:
        if _spans_gutter(line, gutters):
            flush()
            out.append(" ".join(w["text"] for w in line))
            continue
        for index, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
            part = [w["text"] for w in line if lo <= (w["x0"] + w["x1"]) / 2 < hi]
            if part:
                columns[index].append(" ".join(part))
    flush()
    return "\n".join(out), len(gutters) + 1


def heading_levels(page: Any) -> dict[str, int]:
    """Lines set in a larger (or bold, standalone) font than the page's body text -> Markdown heading level.

    Levels come from the size ratio, not from a per-page ranking, so they agree across pages.
    """
    chars = [c for c in page.chars if c.get("text", "").strip()]
    if len(chars) < 20:
        return {}
    sizes = sorted(round(float(c["size"]), 1) for c in chars)
    body = sizes[len(sizes) // 2]
    levels: dict[str, int] = {}
    for line in page.extract_text_lines(return_chars=True, strip=True):
        text = " ".join(line["text"].split())
        words = text.split()
        line_chars = [c for c in line["chars"] if c["text"].strip()]
        if not line_chars or not 1 <= len(words) <= 12 or len(text) > 90 or text.endswith((".", ",", ";")):
            continue
        size = max(float(c["size"]) for c in line_chars)
        bold = all("bold" in str(c.get("fontname", "")).lower() for c in line_chars)
        ratio = size / body if body else 1.0
        if ratio >= 1.5:
            levels[text] = 1
        elif ratio >= 1.2:
            levels[text] = 2
        elif (ratio >= 1.1 or bold) and len(words) <= 8 and any(ch.isalpha() for ch in text):
            levels[text] = 3
    return levels


def _mark_headings(text: str, levels: dict[str, int]) -> str:
    if not levels:
        return text
    out = []
    for line in text.split("\n"):
        level = levels.get(" ".join(line.split()))
        out.append(f"{'#' * level} {line.strip()}" if level else line)
    return "\n".join(out)


# --- render modes ---------------------------------------------------------------------------------------
# pdfplumber does not expose a character's text render mode, and mode 3 ("neither fill nor stroke") is text a
# reader never sees: an OCR layer under a scan, or hidden text planted for a machine to read. The device
# below records the mode on every character; the page class hands it to pdfplumber's character dicts.

INVISIBLE_RENDER_MODE = 3


@lru_cache(maxsize=1)
def _render_aware_page_class() -> type:
    from pdfminer.pdfinterp import PDFPageInterpreter
    from pdfplumber.page import Page, PDFPageAggregatorWithMarkedContent
    from pdfplumber.utils.exceptions import PdfminerException

    class RenderModeAggregator(PDFPageAggregatorWithMarkedContent):
        render_mode = 0

        def render_string(self, textstate: Any, *args: Any, **kwargs: Any) -> None:
            self.render_mode = textstate.render
            super().render_string(textstate, *args, **kwargs)

        def render_char(self, *args: Any, **kwargs: Any) -> float:
            advance = super().render_char(*args, **kwargs)
            if self.cur_item._objs:
                self.cur_item._objs[-1].render_mode = self.render_mode
            return advance

    class RenderAwarePage(Page):
        @property
        def layout(self) -> Any:
            if hasattr(self, "_layout"):
                return self._layout
            device = RenderModeAggregator(self.pdf.rsrcmgr, pageno=self.page_number, laparams=self.pdf.laparams)
            try:
                PDFPageInterpreter(self.pdf.rsrcmgr, device).process_page(self.page_obj)
            except Exception as exc:
                raise PdfminerException(exc) from exc
            self._layout = device.get_result()
            return self._layout

        def process_object(self, obj: Any) -> dict[str, Any]:
            attributes = super().process_object(obj)
            if hasattr(obj, "render_mode"):
                attributes["render_mode"] = obj.render_mode
            return attributes

    return RenderAwarePage


def render_aware(page: Any) -> Any:
    """The same pdfplumber page, with `render_mode` on every character."""
    return _render_aware_page_class()(page.pdf, page.page_obj, page_number=page.page_number,
                                      initial_doctop=page.initial_doctop)


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

    @property
    def top(self) -> float:
        return min(self.bbox[1], self.caption_bbox[1]) if self.caption_bbox else self.bbox[1]


def _is_real_table(rows: list[list[Any]]) -> bool:
    """Two rows and two columns at least: a ruled "table" of one row is an underlined line (a subtotal rule,
    a box around a note), and is read as text or as part of the aligned table around it."""
    rows = _drop_empty_rows_and_columns(rows)
    return len(rows) >= 2 and max(len(r) for r in rows) >= 2


def _inside(box: tuple[float, float, float, float], outer: tuple[float, float, float, float]) -> bool:
    x0, top, x1, bottom = box
    cx, cy = (x0 + x1) / 2, (top + bottom) / 2
    return outer[0] - 1 <= cx <= outer[2] + 1 and outer[1] - 1 <= cy <= outer[3] + 1


def _overlaps(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return min(a[2], b[2]) > max(a[0], b[0]) and min(a[3], b[3]) > max(a[1], b[1])


def find_page_tables(page: Any) -> tuple[list[PageTable], dict[str, int]]:
    """The page's tables and how they were found.

    Aligned tables (figures sharing columns, see rag_pipeline.tables) and ruled tables are both looked for. A
    ruled table that holds an aligned table and resolves as many columns keeps its ruled cells; any other ruled
    table that overlaps an aligned one (the rows between two subtotal rules, a grid of header rules only) gives
    way to it; a ruled table of one row is never a table."""
    from rag_pipeline import tables as aligned_tables

    ruled_found = [(t.bbox, t.extract()) for t in page.find_tables()]
    ruled = [PageTable(bbox, rows) for bbox, rows in ruled_found if _is_real_table(rows)]
    # Sideways words (a rotated margin stamp, a vertical axis title) belong to no row.
    words = [w for w in page.extract_words() if w.get("upright", True)]
    # Beside columns of prose, lines are read per column: a table in one column must not take the other's text.
    gutters = find_gutters(_group_lines(words), float(page.width))
    bounds = [float("-inf"), *gutters, float("inf")]
    aligned = [PageTable(t.bbox, t.rows, t.caption, t.caption_bbox, "aligned")
               for lo, hi in zip(bounds, bounds[1:], strict=False)
               for t in aligned_tables.find_tables([w for w in words if lo <= (w["x0"] + w["x1"]) / 2 < hi])]
    kept_aligned = []
    for table in aligned:
        # A ruled grid that holds the aligned table and resolves as many columns has the better cells.
        holders = [r for r in ruled if len(r.rows) >= 3 and _inside(table.bbox, r.bbox)
                   and max(len(row) for row in r.rows) >= len(table.rows[0])]
        if holders:
            if table.caption and not holders[0].caption:
                holders[0].caption, holders[0].caption_bbox = table.caption, table.caption_bbox
            continue
        ruled = [r for r in ruled if not _overlaps(r.bbox, table.bbox)]
        kept_aligned.append(table)
    found = sorted(ruled + kept_aligned, key=lambda t: t.bbox[1])
    stray = [row for row in aligned_tables.figure_rows(words) if not any(_inside(row, t.bbox) for t in found)]
    stats = {"ruled_tables": len(ruled), "aligned_tables": len(kept_aligned),
             "one_row_rulings": sum(1 for _, rows in ruled_found if not _is_real_table(rows)),
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


# CJK fonts and CMaps name their script: the OCR tier can then say whether its models read it.
SCRIPT_HINTS = (("Korean", ("KSC", "UniKS", "Batang", "Gulim", "Dotum", "Malgun", "HYGoThic", "HYSMyeongJo", "Nanum")),
                ("Japanese", ("UniJIS", "90ms", "Mincho", "MS-Gothic", "HeiseiMin", "HeiseiKaku", "KozMin", "Meiryo")),
                ("Chinese", ("GBK", "GB-EUC", "UniGB", "UniCNS", "B5pc", "SimSun", "SimHei", "MingLiU", "STSong")))


def fonts_without_unicode_map(page_obj: Any) -> set[str]:
    """Names of the page's composite fonts that address glyphs by id (Identity-H/V) and carry no /ToUnicode: the
    text read from them is a guess (pdfminer falls back on the embedded font's tables, which subsetting often
    scrambles into plausible but wrong characters), so it cannot be trusted whatever it looks like."""
    from pdfminer.pdftypes import resolve1

    try:
        fonts = resolve1(resolve1(page_obj.resources or {}).get("Font")) or {}
    except Exception:  # a malformed resource dictionary: no verdict
        return set()
    names = set()
    for ref in list(fonts.values())[:500] if isinstance(fonts, dict) else []:
        font = resolve1(ref)
        if not isinstance(font, dict) or font.get("ToUnicode") is not None:
            continue
        subtype, encoding = resolve1(font.get("Subtype")), resolve1(font.get("Encoding"))
        if getattr(subtype, "name", None) == "Type0" and getattr(encoding, "name", "") in ("Identity-H", "Identity-V"):
            base = resolve1(font.get("BaseFont"))
            names.add(str(getattr(base, "name", base)))
    return names


def unmapped_scripts(chars: list[dict[str, Any]]) -> list[str]:
    """Scripts named by the fonts of glyphs without a Unicode map ((cid:N) characters)."""
    fonts = {str(c.get("fontname", "")) for c in chars if str(c.get("text", "")).startswith("(cid:")}
    return [script for script, hints in SCRIPT_HINTS if any(h.lower() in f.lower() for f in fonts for h in hints)]


def _ragged_ratio(rows: list[list[Any]]) -> float:
    """Share of a table's rows whose filled-cell count differs from most rows': a sign of broken structure.
    Rows with only their label filled are section rows ("Operating activities:"), not broken ones."""
    filled = [sum(1 for c in row if c not in (None, "")) for row in rows[1:]]
    body = [n for n in filled if n > 1]
    if not body:
        return 0.0
    usual = max(set(body), key=body.count)
    return round(sum(1 for n in body if n != usual) / len(body), 3)


def _unmapped_font_share(page: Any) -> float:
    unmapped = fonts_without_unicode_map(page.page_obj)
    if not unmapped or not page.chars:
        return 0.0
    return round(sum(1 for c in page.chars if c.get("fontname") in unmapped) / len(page.chars), 3)


def _annotations(page: Any) -> tuple[list[str], dict[str, int]]:
    """Filled form fields and notes (rag_pipeline.forms); a malformed annotation loses them, not the page."""
    try:
        return forms.annotation_lines(forms.page_annotations(page.page_obj))
    except Exception:  # pdfminer raises a wide variety on malformed annotation dictionaries
        return [], {"annotation_errors": 1}


def _band_text(page: Any, top: float, bottom: float) -> str:
    def within(obj: dict[str, Any]) -> bool:
        return "top" not in obj or top <= (obj["top"] + obj["bottom"]) / 2 < bottom

    return page.filter(within).extract_text() or ""


def _pdf_page(page: Any) -> tuple[str, int, dict[str, Any]]:
    all_chars = len(page.chars)
    for char in page.chars:
        char["text"] = rtl.visual_glyph(char["text"])
    invisible = sum(1 for c in page.chars if c.get("render_mode") == INVISIBLE_RENDER_MODE)
    if invisible:
        # Only what is drawn is the page's text; the hidden layer is counted, never extracted.
        page = page.filter(lambda obj: obj.get("render_mode") != INVISIBLE_RENDER_MODE)
    tables, table_stats = find_page_tables(page)
    # A table's caption is read with the table (it travels with every chunk of it), not as text.
    boxes = [t.bbox for t in tables] + [t.caption_bbox for t in tables if t.caption_bbox]

    def outside_tables(obj: dict[str, Any]) -> bool:
        if "x0" not in obj:
            return True
        cx, cy = (obj["x0"] + obj["x1"]) / 2, (obj["top"] + obj["bottom"]) / 2
        return not any(x0 <= cx <= x1 and top <= cy <= bottom for x0, top, x1, bottom in boxes)

    text_page = page.filter(outside_tables) if boxes else page
    column_ordered, column_count = column_text(text_page)
    headings = heading_levels(text_page)
    table_blocks = [block for block in (table_block(t) for t in tables) if block]
    if column_ordered is not None or not tables:
        # Several columns: text in column order, tables after it (a table's place in columns is not kept).
        text = column_ordered if column_ordered is not None else (text_page.extract_text() or "")
        parts = [_mark_headings(text, headings).strip(), *table_blocks]
    else:
        # One column: each table where it stands between the lines of text above and below it; text beside
        # a table (a note to its right) follows it.
        parts, bands, above = [], [], float("-inf")
        for table in tables:
            top, bottom = max(above, table.top), max(above, table.bbox[3])
            bands.append(_mark_headings(_band_text(text_page, above, top), headings).strip())
            beside = _mark_headings(_band_text(text_page, top, bottom), headings).strip()
            parts += [bands[-1], table_block(table), beside]
            bands.append(beside)
            above = bottom
        bands.append(_mark_headings(_band_text(text_page, above, float("inf")), headings).strip())
        parts.append(bands[-1])
        text = "\n".join(bands)
    annotations, annotation_stats = _annotations(page)
    markdown = rtl.logical_text("\n\n".join(part for part in [*parts, "\n".join(annotations)] if part))
    table_rows = [t.rows for t in tables]
    bad_glyphs = len(CID_GLYPH_RE.findall(text)) + sum(
        1 for ch in text if ch == "\ufffd" or 0xE000 <= ord(ch) <= 0xF8FF
    )
    page_area = float(page.width) * float(page.height) or 1.0
    image_area = sum(
        max(0.0, float(i["x1"]) - float(i["x0"])) * max(0.0, float(i["bottom"]) - float(i["top"])) for i in page.images
    )
    signals = {
        "chars": len(page.chars),
        "text_layer": bool(page.chars),
        "invisible_chars": invisible,
        "invisible_ratio": round(invisible / all_chars, 3) if all_chars else 0.0,
        "cid_glyphs": len(CID_GLYPH_RE.findall(text)),
        "unmapped_font_share": _unmapped_font_share(page),
        "unmapped_scripts": unmapped_scripts(page.chars),
        "unmapped_run": max((len(CID_GLYPH_RE.findall(run)) for run in UNMAPPED_RUN_RE.findall(text)), default=0),
        "replacement_glyphs": text.count("\ufffd"),
        "bad_glyph_ratio": round(bad_glyphs / max(1, len(text)), 4),
        "image_coverage": round(min(1.0, image_area / page_area), 3),
        "ragged_table_ratio": max((_ragged_ratio(rows) for rows in table_rows), default=0.0),
        "images": len(page.images),
        "rotation": int(page.rotation or 0),
        "headings": len(headings),
        "columns": column_count,
        "rtl_lines": sum(1 for line in markdown.split("\n") if rtl.has_rtl(line)),
    }
    signals.update(table_stats)
    signals.update(annotation_stats)
    return markdown, len(table_blocks), signals


def check_unpacked_size(path: Path, limit: int) -> None:
    """An Office file is a zip: refuse one whose entries unpack to more than `limit` bytes (a zip bomb) or
    that holds more entries than any document needs. Declared sizes are checked, and Docling's unzipping
    stops at them."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise DeadLetter("corrupt", f"not a readable Office (zip) file: {exc}") from None
    if len(entries) > MAX_ZIP_ENTRIES:
        raise DeadLetter("too_large", f"{len(entries):,} zip entries (at most {MAX_ZIP_ENTRIES:,})")
    unpacked = sum(entry.file_size for entry in entries)
    if unpacked > limit:
        raise DeadLetter("too_large", f"unpacks to {unpacked:,} bytes; parsing.max_unpacked_bytes is {limit:,}")


def check_page_content_size(page_obj: Any, limit: int) -> None:
    """Decompress a page's Flate content streams with a cap before pdfminer decodes them whole: a stream bomb
    (kilobytes that inflate to gigabytes) is dead-lettered instead of exhausting memory. Streams with other
    filters are left to pdfminer."""
    import zlib

    from pdfminer.pdftypes import PDFStream, resolve1

    streams = resolve1(getattr(page_obj, "contents", None)) or []
    total = 0
    for stream in streams if isinstance(streams, list) else [streams]:
        stream = resolve1(stream)
        if not isinstance(stream, PDFStream) or stream.rawdata is None:
            continue
        if [str(getattr(name, "name", name)) for name, _ in stream.get_filters()] not in (["FlateDecode"], ["Fl"]):
            continue
        inflater = zlib.decompressobj()
        data = stream.rawdata
        try:
            while data and total <= limit:
                total += len(inflater.decompress(data, limit + 1 - total))
                data = inflater.unconsumed_tail
        except zlib.error:
            continue  # pdfminer has its own way with broken streams
        if total > limit:
            raise DeadLetter("too_large", f"a page's content streams unpack to more than {limit:,} bytes "
                                          "(parsing.max_page_content_bytes)")


def _parse_pdf(path: Path, password: str | None, limits: ParseLimits = ParseLimits()) -> Iterator[ParsedPage]:
    import pdfplumber
    from pdfplumber.utils.exceptions import PdfminerException

    try:
        pdf = pdfplumber.open(path, password=password or "")
    except PdfminerException as exc:
        raise _pdf_failure(path, exc) from exc
    except Exception as exc:  # pdfminer raises a wide variety on malformed input
        raise _pdf_failure(path, exc) from exc
    with pdf:
        try:
            page_count = len(pdf.pages)
        except Exception as exc:
            raise _pdf_failure(path, exc) from exc
        if page_count > limits.max_pages:
            raise DeadLetter("too_large", f"{page_count:,} pages; parsing.max_pages is {limits.max_pages:,}")
        for number in range(page_count):
            started = time.perf_counter()
            check_page_content_size(pdf.pages[number].page_obj, limits.max_page_content_bytes)
            try:
                page = render_aware(pdf.pages[number])
                markdown, tables, signals = _pdf_page(page)
                page.close()  # drop pdfplumber's per-page caches: bounded memory on long files
            except Exception as exc:
                raise _pdf_failure(path, exc) from exc
            yield ParsedPage(number + 1, "pdfplumber", markdown, time.perf_counter() - started, tables, signals)


# --- Office, HTML, Markdown (Docling) ---------------------------------------------------------------

_converter_lock = threading.Lock()


@lru_cache(maxsize=1)
def _docling_converter() -> Any:
    from docling.datamodel.base_models import InputFormat
    from docling.document_converter import DocumentConverter

    # PDFs never reach Docling here: its PDF pipeline needs layout-model weights (the cascade issue adds it).
    return DocumentConverter(
        allowed_formats=[InputFormat.DOCX, InputFormat.PPTX, InputFormat.XLSX, InputFormat.HTML, InputFormat.MD]
    )


def _parse_with_docling(path: Path) -> Iterator[ParsedPage]:
    from docling.datamodel.base_models import ConversionStatus

    started = time.perf_counter()
    with _converter_lock:  # the converter is shared; Docling does not promise thread safety
        try:
            result = _docling_converter().convert(path, raises_on_error=False)
        except Exception as exc:
            raise DeadLetter("corrupt", f"{type(exc).__name__}: {exc}") from exc
    if result.status not in (ConversionStatus.SUCCESS, ConversionStatus.PARTIAL_SUCCESS):
        errors = "; ".join(e.error_message for e in result.errors) or str(result.status)
        raise DeadLetter("corrupt", errors)
    document = result.document
    elapsed = time.perf_counter() - started
    page_numbers = sorted(document.pages) or [None]
    per_page = elapsed / len(page_numbers)
    for number in page_numbers:
        markdown = document.export_to_markdown(page_no=number) if number else document.export_to_markdown()
        yield ParsedPage(
            page=number or 1,
            tier="docling",
            markdown=markdown,
            seconds=per_page,
            tables=len(TABLE_SEPARATOR_RE.findall(markdown)),
            signals={"chars": len(markdown), "format": path.suffix.lower().lstrip(".")},
        )
