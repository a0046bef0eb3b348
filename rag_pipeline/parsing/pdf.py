"""PDF pages through pdfplumber (tier 1), streamed page by page so memory stays flat on long files: text in
reading order (columns found by their gutters), headings marked by font size, invisible text left out, tables
from ruled lines or aligned figures, and the structural signals the cascade judges each page by.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from rag_pipeline.parsing import forms, rtl
from rag_pipeline.parsing.columns import find_gutters, group_words_into_lines, spans_gutter
from rag_pipeline.parsing.fonts import unmapped_font_share, unmapped_scripts
from rag_pipeline.parsing.limits import ParseLimits, check_page_content_size
from rag_pipeline.parsing.pages import DeadLetter, ParsedPage, TextLayer, as_text_line
from rag_pipeline.parsing.pictures import page_pictures, picture_record
from rag_pipeline.parsing.ruled_tables import find_page_tables, ragged_ratio, table_block
from rag_pipeline.parsing.word_gaps import plain_words

log = logging.getLogger(__name__)
CID_GLYPH_RE = re.compile(r"\(cid:\d+\)")
UNMAPPED_RUN_RE = re.compile(r"(?:\(cid:\d+\)|\ufffd)+")  # glyphs in a row: a word the font could not map


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


def column_text(page: Any, words: list[dict[str, Any]] | None = None) -> tuple[str | None, int]:
    """Text of a multi-column page in reading order (column by column) and its column count;
    (None, 1) for a single-column page. `words`: the page's `extract_words()`, when read already."""
    if words is None:
        words = page.extract_words(keep_blank_chars=False, use_text_flow=False)
    lines = group_words_into_lines(words)
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
        if spans_gutter(line, gutters):
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
        if not all(c.get("upright", True) for c in line_chars):
            continue  # set sideways (a side tab, a margin stamp): each of its words would read as a heading
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
    out = []
    for line in text.split("\n"):
        level = levels.get(" ".join(line.split())) if levels else None
        if level:
            out.append(f"{'#' * level} {line.strip()}")
        else:
            out.append(as_text_line(line))  # the page's headings are those its type sizes mark
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


def _annotations(page: Any) -> tuple[list[str], dict[str, int]]:
    """Filled form fields and notes (rag_pipeline.parsing.forms); a malformed annotation loses them, not the page."""
    try:
        return forms.annotation_lines(forms.page_annotations(page.page_obj))
    except Exception:  # pdfminer raises a wide variety on malformed annotation dictionaries
        return [], {"annotation_errors": 1}


def _band_text(page: Any, top: float, bottom: float) -> str:
    def within(obj: dict[str, Any]) -> bool:
        return "top" not in obj or top <= (obj["top"] + obj["bottom"]) / 2 < bottom

    return page.filter(within).extract_text() or ""


def crop_box(page: Any) -> tuple[float, float, float, float]:
    """What a rendering of the page shows, its CropBox within its MediaBox, as pdfplumber measures them (both read
    through the page tree)."""
    crop, media = [float(v) for v in page.cropbox], [float(v) for v in page.mediabox]
    return max(crop[0], media[0]), max(crop[1], media[1]), min(crop[2], media[2]), min(crop[3], media[3])


def _pdf_page(page: Any) -> tuple[str, int, dict[str, Any], TextLayer]:
    all_chars = len(page.chars)
    for char in page.chars:
        char["text"] = rtl.visual_glyph(char["text"])
    invisible = sum(1 for c in page.chars if c.get("render_mode") == INVISIBLE_RENDER_MODE)
    if invisible:
        # Only what is drawn is the page's text; the hidden layer is counted, never extracted.
        page = page.filter(lambda obj: obj.get("render_mode") != INVISIBLE_RENDER_MODE)
    page, spacing = plain_words(page)  # words a pdfTeX layer sets apart by gaps alone; overprinted bold read once
    words = page.extract_words()
    tables, table_stats = find_page_tables(page, words)
    # charts, diagrams and images with the words drawn inside them: kept with the page, chunked as figures
    try:
        pictures = page_pictures(page, int(page.page_number), [t.bbox for t in tables], words)
    except Exception as exc:  # a page whose drawings cannot be read keeps its text: its pictures are lost, not it
        log.warning("pictures on page %s not read: %s: %s", page.page_number, type(exc).__name__, exc)
        pictures = []
    # A table's caption is read with the table (it travels with every chunk of it), not as text.
    boxes = [t.bbox for t in tables] + [t.caption_bbox for t in tables if t.caption_bbox]

    def outside_tables(obj: dict[str, Any]) -> bool:
        if "x0" not in obj:
            return True
        cx, cy = (obj["x0"] + obj["x1"]) / 2, (obj["top"] + obj["bottom"]) / 2
        return not any(x0 <= cx <= x1 and top <= cy <= bottom for x0, top, x1, bottom in boxes)

    text_page = page.filter(outside_tables) if boxes else page
    column_ordered, column_count = column_text(text_page, None if boxes else words)
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
        "chars": len(page.chars) - spacing["word_gaps_spaced"],  # drawn glyphs, each once
        "text_layer": bool(page.chars),
        "invisible_chars": invisible,
        "invisible_ratio": round(invisible / all_chars, 3) if all_chars else 0.0,
        "cid_glyphs": len(CID_GLYPH_RE.findall(text)),
        "unmapped_font_share": unmapped_font_share(page),
        "unmapped_scripts": unmapped_scripts(page.chars),
        "unmapped_run": max((len(CID_GLYPH_RE.findall(run)) for run in UNMAPPED_RUN_RE.findall(text)), default=0),
        "replacement_glyphs": text.count("\ufffd"),
        "bad_glyph_ratio": round(bad_glyphs / max(1, len(text)), 4),
        "image_coverage": round(min(1.0, image_area / page_area), 3),
        "ragged_table_ratio": max((ragged_ratio(rows) for rows in table_rows), default=0.0),
        "images": len(page.images),
        "rotation": int(page.rotation or 0),
        "crop_box": [round(v, 2) for v in crop_box(page)],  # where a picture's crop is cut from the page's rendering
        "headings": len(headings),
        "columns": column_count,
        "rtl_lines": sum(1 for line in markdown.split("\n") if rtl.has_rtl(line)),
    }
    if pictures:
        signals["pictures"] = [picture_record(replace(p, text=rtl.logical_text(p.text))) for p in pictures]
    signals.update(table_stats)
    signals.update(annotation_stats)
    signals.update(spacing)
    return markdown, len(table_blocks), signals, TextLayer(crop_box(page), int(page.rotation or 0), words)


def parse_pdf(path: Path, password: str | None, limits: ParseLimits = ParseLimits()) -> Iterator[ParsedPage]:
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
        metadata = document_metadata(pdf)
        for number in range(page_count):
            started = time.perf_counter()
            check_page_content_size(pdf.pages[number].page_obj, limits.max_page_content_bytes)
            try:
                page = render_aware(pdf.pages[number])
                markdown, tables, signals, text_layer = _pdf_page(page)
                page.close()  # drop pdfplumber's per-page caches: bounded memory on long files
            except Exception as exc:
                raise _pdf_failure(path, exc) from exc
            if number == 0 and metadata:
                signals["pdf_metadata"] = metadata  # what the document says it is (rag_pipeline.text.identity)
            yield ParsedPage(number + 1, "pdfplumber", markdown, time.perf_counter() - started, tables, signals,
                             text_layer)


METADATA_KEYS = ("Title", "Author", "Subject", "Company", "Keywords")
# a NUL would be refused by jsonb and lose the document; a terminal escape has no business in a title
CONTROL_CHARACTERS_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
MAX_METADATA_CHARS = 300


def document_metadata(pdf: Any) -> dict[str, str]:
    """The document-information fields that say what a PDF is, as text, each cut to 300 characters: untrusted
    input kept small. A dictionary pdfminer cannot read gives nothing, not a failed parse."""
    try:
        info = pdf.metadata or {}
    except Exception:  # a malformed info dictionary is not the page text's problem
        return {}
    kept = {}
    for key in METADATA_KEYS:
        value = info.get(key)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if isinstance(value, str):
            value = " ".join(CONTROL_CHARACTERS_RE.sub(" ", value).split())[:MAX_METADATA_CHARS]
            if value:
                kept[key] = value
    return kept


# --- Office and HTML (Docling) ---------------------------------------------------------------------
