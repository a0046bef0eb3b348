"""Which parser reads a file, by its type: PDFs page by page through pdfplumber (rag_pipeline.parsing.pdf); DOCX,
PPTX, XLSX and HTML through Docling's native converters (rag_pipeline.parsing.docling_adapter); Markdown as Markdown
(rag_pipeline.parsing.markdown); plain text as it is. Files that cannot be parsed raise `DeadLetter` with a specific reason; the caller records it and
moves on.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

from rag_pipeline.parsing.docling_adapter import parse_with_docling
from rag_pipeline.parsing.limits import ParseLimits, check_unpacked_size
from rag_pipeline.parsing.markdown import parse_markdown
from rag_pipeline.parsing.pages import DeadLetter, ParsedPage
from rag_pipeline.parsing.pdf import parse_pdf

PDF_SUFFIXES = {".pdf"}
DOCLING_SUFFIXES = {".docx", ".pptx", ".xlsx", ".html", ".htm"}
MARKDOWN_SUFFIXES = {".md"}
TEXT_SUFFIXES = {".txt"}
SUPPORTED_SUFFIXES = PDF_SUFFIXES | DOCLING_SUFFIXES | MARKDOWN_SUFFIXES | TEXT_SUFFIXES
ZIPPED_SUFFIXES = {".docx", ".pptx", ".xlsx"}


def parse_file(path: Path, password: str | None = None, limits: ParseLimits = ParseLimits()) -> Iterator[ParsedPage]:
    """Yield the pages of one file. Raises DeadLetter for files that cannot be parsed."""
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        raise DeadLetter("unsupported", f"no parser for {suffix or 'files without an extension'}")
    if path.stat().st_size == 0:
        raise DeadLetter("empty", "zero-byte file")
    if suffix in PDF_SUFFIXES:
        yield from parse_pdf(path, password, limits)
    elif suffix in MARKDOWN_SUFFIXES:
        yield from parse_markdown(path)
    elif suffix in DOCLING_SUFFIXES:
        if suffix in ZIPPED_SUFFIXES:
            check_unpacked_size(path, limits.max_unpacked_bytes)
        yield from parse_with_docling(path)
    else:
        started = time.perf_counter()
        text = path.read_bytes().decode("utf-8", errors="replace")
        yield ParsedPage(1, "text", text, time.perf_counter() - started, signals={"chars": len(text)})


# --- PDF (pdfplumber) -------------------------------------------------------------------------------

