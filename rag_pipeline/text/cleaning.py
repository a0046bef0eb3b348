"""Text normalisation applied to every page before hashing and chunking.

Kept deliberately conservative: it must never change meaning, only representation, because
`content_hash` is computed on its output and decides whether a document is re-chunked and re-embedded.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable

_CONTROL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# Every Unicode whitespace but the newline (\u2028, \u2029, \x85, \u1680 and the rest), and the zero-width space:
# long runs of any of them must reach later patterns as one space.
_SPACES_RE = re.compile(r"(?:[^\S\n]|\u200b)+")
# Inside a Latin word a zero-width space breaks nothing a reader sees (Latin scripts separate words with spaces):
# removed, so "Ign\u200bore" is read, flagged and searched as the "Ignore" it shows. Elsewhere (Thai, Khmer) it
# separates words and becomes a space above.
_ZWSP_IN_LATIN_WORD_RE = re.compile(r"(?<=[A-Za-z\u00c0-\u024f])\u200b+(?=[A-Za-z\u00c0-\u024f])")
_BLANK_LINES_RE = re.compile(r"\n{3,}")
# Glyphs a font could not map to text: never content, and noise to every index (pages that have many are read
# by OCR first; what no tier could read is removed here).
_UNMAPPED_GLYPH_RE = re.compile(r"\(cid:\d+\)|\ufffd")
PAGE_SEPARATOR = "\n\f\n"


def clean_text(text: str) -> str:
    """Unicode NFKC, no control characters, single spaces, no trailing blanks, at most one empty line."""
    text = unicodedata.normalize("NFKC", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = _CONTROL_RE.sub("", text)
    text = _ZWSP_IN_LATIN_WORD_RE.sub("", text)
    lines = [_SPACES_RE.sub(" ", line).strip() for line in text.split("\n")]
    return _BLANK_LINES_RE.sub("\n\n", "\n".join(lines)).strip()


def content_hash(pages: Iterable[str]) -> str:
    """sha256 of the cleaned text of all pages, in order: equal text means equal hash, whatever the bytes."""
    digest = hashlib.sha256()
    for index, page in enumerate(pages):
        if index:
            digest.update(PAGE_SEPARATOR.encode())
        digest.update(page.encode("utf-8"))
    return digest.hexdigest()


# --- page furniture -------------------------------------------------------------------------------

EDGE_LINES = 8  # running headers/footers (and margin notes) live in the first/last lines of a page
_DIGITS_RE = re.compile(r"\d+")
_PAGE_NUMBER_RE = re.compile(
    r"^(?:page\s+)?(?:\d{1,5}|[ivxlcdm]{1,7})(?:\s*(?:of|/)\s*\d{1,5})?$|^[-–—]\s*\d{1,5}\s*[-–—]$", re.IGNORECASE
)
_PAGE_REFERENCE_RE = re.compile(r"(?:\d{1,5}|[ivxlcdm]{1,7})$", re.IGNORECASE)
LEADER_CHARS = frozenset(".·")


def is_toc_leader_line(line: str) -> bool:
    """'Introduction . . . . 5': text, a leader of four dots or more, a page number. Read from the end in one pass
    (a pattern with `.*` before a repeated group is quadratic on a long run of '. ')."""
    text = line.rstrip()
    reference = _PAGE_REFERENCE_RE.search(text[-8:])
    if reference is None:
        return False
    end = len(text) - (len(text[-8:]) - reference.start())
    dots = 0
    while end > 0 and (text[end - 1] in LEADER_CHARS or text[end - 1].isspace()):
        dots += text[end - 1] in LEADER_CHARS
        end -= 1
    return (dots >= 4 and end > 0) or dots >= 5  # a leader alone (a wrapped entry's second line) counts too


_HYPHEN_BREAK_RE = re.compile(r"(?<=[a-zà-öø-ÿ]{2})-\n(?=[a-zà-öø-ÿ]{2})")


def _furniture_key(line: str) -> str:
    """Lines equal up to their numbers (page numbers, dates) and spacing count as the same furniture."""
    return " ".join(_DIGITS_RE.sub("0", line.lstrip("#")).lower().split())


def _is_watermark(line: str) -> bool:
    letters = [c for c in line if c.isalpha()]
    return 0 < len(line) <= 40 and len(line.split()) <= 5 and len(letters) >= 4 and all(c.isupper() for c in letters)


def clean_document(pages: list[str]) -> tuple[list[str], dict[str, int]]:
    """Normalise every page, then strip what repeats across pages and is not content.

    Returns the cleaned pages and the characters each rule removed. Markdown table rows are never
    treated as furniture: a table continuing across pages repeats its header legitimately.
    """
    removed = dict.fromkeys(("unmapped_glyphs", "normalisation", "running_header_footer", "page_number",
                             "toc_leader", "watermark", "hyphenation"), 0)
    readable = [_UNMAPPED_GLYPH_RE.sub("", page) for page in pages]
    removed["unmapped_glyphs"] = sum(len(a) - len(b) for a, b in zip(pages, readable, strict=True))
    pages = readable
    normalised = [clean_text(page) for page in pages]
    # Net characters removed by normalisation (NFKC can lengthen text, e.g. ligatures, so this may be < 0).
    removed["normalisation"] = sum(len(a) for a in pages) - sum(len(b) for b in normalised)
    page_lines = [page.split("\n") for page in normalised]

    edge_counts: dict[str, int] = {}
    watermark_counts: dict[str, int] = {}
    def edge_size(lines: list[str]) -> int:
        # Short pages have short margins: never let the "edge" reach into the body of a page.
        return max(1, min(EDGE_LINES, len(lines) // 4))

    for lines in page_lines:
        edge = edge_size(lines)
        edges = {_furniture_key(line) for line in lines[:edge] + lines[-edge:] if line.strip()}
        for key in edges:
            edge_counts[key] = edge_counts.get(key, 0) + 1
        for key in {_furniture_key(line) for line in lines if _is_watermark(line)}:
            watermark_counts[key] = watermark_counts.get(key, 0) + 1
    page_count = len(pages)
    # Repeated on at least 30% of pages (and on 3 of them), or on every page of a 2-3 page document.
    needed = page_count if page_count < 4 else max(3, int(0.3 * page_count + 0.5))
    running = {k for k, n in edge_counts.items() if n >= needed and page_count >= 2}
    watermarks = {k for k, n in watermark_counts.items() if n >= needed and page_count >= 2}

    cleaned: list[str] = []
    for lines in page_lines:
        kept: list[str] = []
        edge = edge_size(lines)
        for index, line in enumerate(lines):
            at_edge = index < edge or index >= len(lines) - edge
            rule = None
            if line.lstrip().startswith("|"):
                rule = None
            elif at_edge and _furniture_key(line) in running:
                rule = "running_header_footer"
            elif at_edge and _PAGE_NUMBER_RE.match(line.lstrip("#").strip()):
                rule = "page_number"
            elif is_toc_leader_line(line):
                rule = "toc_leader"
            elif _furniture_key(line) in watermarks and _is_watermark(line):
                rule = "watermark"
            if rule:
                removed[rule] += len(line) + 1
            else:
                kept.append(line)
        text = "\n".join(kept)
        repaired = _HYPHEN_BREAK_RE.sub("", text)
        removed["hyphenation"] += len(text) - len(repaired)
        cleaned.append(clean_text(repaired))
    return cleaned, removed


# --- tables split by page breaks --------------------------------------------------------------------


def _blocks(text: str) -> list[list[str]]:
    """Consecutive non-empty lines, split where table lines meet non-table lines or a blank line."""
    blocks: list[list[str]] = []
    for line in text.split("\n"):
        if not line.strip():
            blocks.append([])
            continue
        is_table = line.lstrip().startswith("|")
        if blocks and blocks[-1] and blocks[-1][-1].lstrip().startswith("|") == is_table:
            blocks[-1].append(line)
        else:
            blocks.append([line])
    return [b for b in blocks if b]


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def _is_separator(row: str) -> bool:
    return bool(re.fullmatch(r"\|(\s*:?-{3,}:?\s*\|)+", row.strip()))


def join_continued_tables(pages: list[str]) -> tuple[list[str], dict[int, int]]:
    """Join a table that runs over a page break into one table on the page where it starts.

    A page ending in a table followed by a page starting with a table of the same width is a continuation:
    a repeated header row is dropped; otherwise the next page's first row (which the tier-1 parser took for
    a header) becomes a data row. Returns the pages and, by 0-based page index, the last page each joined
    table reaches.
    """
    texts = list(pages)
    reaches: dict[int, int] = {}
    owner: int | None = None  # page holding a table that may go on over the next break
    for index in range(1, len(texts)):
        previous = owner if owner is not None else index - 1
        owner = None
        before, after = _blocks(texts[previous]), _blocks(texts[index])
        if not before or not after:
            continue
        tail, head = before[-1], after[0]
        if not (tail[0].lstrip().startswith("|") and head[0].lstrip().startswith("|")):
            continue
        if len(_cells(tail[0])) != len(_cells(head[0])):
            continue
        rows = head[2:] if len(head) > 1 and _is_separator(head[1]) else head
        if _cells(head[0]) != _cells(tail[0]) and rows is not head:
            rows = [head[0], *rows]  # no repeated header: the first row is data
        before[-1] = tail + rows
        texts[previous] = "\n\n".join("\n".join(block) for block in before)
        texts[index] = "\n\n".join("\n".join(block) for block in after[1:])
        reaches[previous] = index
        if not after[1:]:
            owner = previous  # the whole page was table: it may continue further
    return texts, reaches


def clean_parsed_pages(pages: list) -> dict[str, int]:
    """Clean a parsed document in place (furniture, normalisation, tables joined over page breaks).

    `pages` are parsing.ParsedPage objects; a page where a joined table starts records the last page it
    reaches in its signals (`table_continues_to`). Returns the characters each cleaning rule removed.
    """
    texts, removed = clean_document([page.markdown for page in pages])
    texts, reaches = join_continued_tables(texts)
    for index, (page, text) in enumerate(zip(pages, texts, strict=True)):
        unreadable = len(_UNMAPPED_GLYPH_RE.findall(page.markdown))
        page.markdown = text
        if unreadable:
            page.signals = {**page.signals, "unmapped_glyphs_removed": unreadable}
        if index in reaches:
            page.signals = {**page.signals, "table_continues_to": pages[reaches[index]].page}
    return removed
