"""What a parser yields: pages of Markdown, each with the tier that produced it and its signals, or a DeadLetter with a
specific reason; and the parser version that stamps stored pages.
"""

from __future__ import annotations

import importlib.metadata
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

TABLE_SEPARATOR_RE = re.compile(r"^\|(?:\s*:?-{3,}:?\s*\|)+\s*$", re.MULTILINE)
# A line of plain text (a text layer's, OCR's) that opens as Markdown would (a heading's "#", a quote's ">", a table
# row's "|": a comment in a code listing, "# train cars" on a slide) is escaped, so that the chunker reads it as
# text, not as a heading that would name every later section, nor as a table. Lines that open with "-" or "1." are
# left as they are: list items and numbered headings, as the chunker reads them. A line with right-to-left letters
# is left: in a text layer it is in visual order, and its start is only known once rtl.logical_text has reordered it.
MARKDOWN_START_RE = re.compile(r"^\s*(?:#{1,6}(?:\s|$)|>|\|)")


def as_text_line(line: str) -> str:
    """`line` of plain text, escaped where it would open as Markdown (MARKDOWN_START_RE)."""
    from rag_pipeline.parsing.rtl import has_rtl

    return "\\" + line.lstrip() if MARKDOWN_START_RE.match(line) and not has_rtl(line) else line


def as_text(text: str) -> str:
    """Plain text's lines, each as_text_line."""
    return "\n".join(as_text_line(line) for line in text.split("\n"))


# timeout, memory and crashed: the document's worker process went over its budget or died (rag_pipeline.workers.pool).
DEAD_LETTER_REASONS = ("empty", "truncated", "corrupt", "encrypted", "unsupported", "too_large", "parser_error",
                       "timeout", "memory", "crashed")


class DeadLetter(Exception):
    """A document that cannot be parsed, with one of DEAD_LETTER_REASONS and a human-readable detail."""

    def __init__(self, reason: str, detail: str = ""):
        assert reason in DEAD_LETTER_REASONS, reason
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class TextLayer:
    """What tier 1 read of a PDF page that the layout tier needs again: reading the page's content stream twice was
    half that tier's time. `words` are pdfplumber's, of what is drawn (hidden text is never read)."""
    crop: tuple[float, float, float, float]  # the CropBox (what a page's rendering shows), in pdfplumber's frame
    rotation: int
    words: list[dict[str, Any]]


@dataclass
class ParsedPage:
    page: int  # 1-based
    tier: str  # pdfplumber | docling | text
    markdown: str
    seconds: float
    tables: int = 0
    signals: dict[str, Any] = field(default_factory=dict)
    # Held only while the layout tier may read the page (rag_pipeline.parsing.cascade.parse_document drops it
    # otherwise); never written to the database nor sent between processes.
    text_layer: TextLayer | None = field(default=None, repr=False, compare=False)


# PDFs parsed by an older parser are parsed again once (what rp9 and rp10 keep beside the text, the pictures and a
# raster picture's words, is new; rp11 spaces glued words, reads stamped scans and framed pages; rp12 reads tables a
# grid of row rules alone held in one cell per row, and escapes text lines that opened as Markdown; rp13 keeps the
# captions and diagrams rp12 lost and the layout model's figures; rp14 escapes OCR's lines as rp12 did the text
# layer's, and keeps a PPTX deck's speaker notes, so decks are parsed again too): rag_pipeline.store.queue.requeue_for_parser
REPARSE_PDFS_BELOW = 14


@lru_cache(maxsize=1)
def parser_version() -> str:
    """Changes whenever a parser that shapes the text changes, so stored pages can be trusted."""
    versions = {name: importlib.metadata.version(name) for name in ("pdfplumber", "docling-slim", "markdown-it-py")}
    # rp5: Markdown read by markdown-it-py; a title over a paragraph over a table is no caption
    # rp6: a figure's lettered footnote marker ("444 (f)") stays in its cell instead of ending the row's figures;
    # a ruled grid more ragged than the aligned reading of the same table gives way to it
    # rp7: only a broken grid gives way, decided per grid; a marker is its figure's only when set close to it
    # rp8: the first page's signals carry the PDF's Title, Author, Subject, Company (document identity; a document
    # parsed before has its identity read from its pages and name alone until its file changes)
    # rp9: the first tier keeps each page's pictures (charts, diagrams, images: kind, box, caption, the words inside)
    # on its signals; chunking makes them figure chunks
    # rp10: a raster picture whose words are not in the text layer has them read by OCR of its region
    # rp11: a scan stamped with a line of text is read by OCR; a ruled grid none of whose rows fills two cells (a
    # page's frame) is prose, not a table; sideways words are no heading; words a text layer sets apart by gaps
    # alone are spaced, overprinted glyphs read once (rag_pipeline.parsing.word_gaps)
    # rp12: a ruled grid that holds most of an aligned table's rows each in one cell (rules under each row and none
    # between the columns) gives way to it; a line numbering a table is its caption, never a header line
    # (rag_pipeline.parsing.ruled_tables, tables); a text line that opens as Markdown would ("#", ">", "|") is
    # escaped unless its type size makes it a heading (rag_pipeline.parsing.pdf)
    # rp13: prose that refers to a figure ("Figure 3 shows …") is no caption, and a caption set within a picture's
    # margin is; a diagram the table finders read as a grid is a picture too when its caption names a figure; the
    # layout tier's figure regions are pictures where tier 1 found none (rag_pipeline.parsing.pictures)
    # rp14: a line OCR or the layout tier reads that opens as Markdown would is escaped as tier 1's are (a slide's
    # "# train cars" named every later slide's section); a PPTX slide's speaker notes follow its content
    return (f"rp14;pdfplumber={versions['pdfplumber']};docling={versions['docling-slim']};"
            f"markdown-it={versions['markdown-it-py']}")
