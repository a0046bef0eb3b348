"""DOCX, PPTX, XLSX and HTML through Docling's native converters, which run offline."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

from rag_pipeline.parsing.pages import TABLE_SEPARATOR_RE, DeadLetter, ParsedPage

log = logging.getLogger(__name__)

# The converter is shared; Docling does not promise thread safety.
_converter_lock = threading.Lock()


@lru_cache(maxsize=1)
def _docling_converter() -> Any:
    from docling.datamodel.base_models import InputFormat
    from docling.document_converter import DocumentConverter

    # PDFs never reach Docling here: its PDF pipeline needs layout-model weights (the cascade issue adds it).
    return DocumentConverter(
        allowed_formats=[InputFormat.DOCX, InputFormat.PPTX, InputFormat.XLSX, InputFormat.HTML]
    )


# A slide's speaker notes follow its content in its page, said as such: what the presenter says about the slide is
# often what a question asks (Docling keeps them on a layer of their own, which its Markdown leaves out).
NOTES_LABEL = "Speaker notes:"


def speaker_notes(document: Any, path: Path) -> dict[int, str]:
    """The notes of each shown slide of a converted deck, by slide number, their lines joined. A slide marked hidden
    in the deck (`show="0"`) keeps its notes out with its content; a deck whose slides cannot be read for that
    gives no notes at all (what is hidden is never indexed)."""
    from docling_core.types.doc import ContentLayer

    try:
        hidden = hidden_slides(path)
    except Exception as exc:  # python-pptx raises a wide variety on a malformed deck
        log.warning("speaker notes of %s left out: its slides' visibility could not be read: %s", path.name, exc)
        return {}
    notes: dict[int, list[str]] = {}
    for item in document.texts:
        if item.content_layer == ContentLayer.NOTES and item.prov and item.text.strip():
            if item.prov[0].page_no not in hidden:
                notes.setdefault(item.prov[0].page_no, []).append(" ".join(item.text.split()))
    return {number: " ".join(lines) for number, lines in notes.items()}


def hidden_slides(path: Path) -> set[int]:
    """The numbers of the slides a deck marks hidden (PowerPoint's "Hide slide": `<p:sld show="0">`)."""
    from pptx import Presentation

    return {number for number, slide in enumerate(Presentation(str(path)).slides, 1)
            if slide._element.get("show") in ("0", "false")}


def parse_with_docling(path: Path) -> Iterator[ParsedPage]:
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
    notes = speaker_notes(document, path) if path.suffix.lower() == ".pptx" else {}
    for number in page_numbers:
        markdown = document.export_to_markdown(page_no=number) if number else document.export_to_markdown()
        if notes.get(number):
            markdown = f"{markdown.rstrip()}\n\n{NOTES_LABEL} {notes[number]}".lstrip()
        yield ParsedPage(
            page=number or 1,
            tier="docling",
            markdown=markdown,
            seconds=per_page,
            tables=len(TABLE_SEPARATOR_RE.findall(markdown)),
            signals={"chars": len(markdown), "format": path.suffix.lower().lstrip(".")},
        )
