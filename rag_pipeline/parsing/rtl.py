"""Right-to-left scripts (Arabic, Hebrew, Persian, Urdu, Syriac, Thaana) in logical order.

A PDF places glyphs where they are seen, and text read by position comes out in visual order: each Arabic or
Hebrew word reversed, the words of a right-to-left line in reverse. The Unicode bidirectional algorithm
(python-bidi) maps visual back to logical order for such lines: right-to-left runs are reversed, Latin words
and numbers inside them keep their order, mirrored brackets are restored. A line's base direction is that of
most of its letters. Arabic presentation forms (the shaped glyphs some fonts map to) become ordinary letters.
"""

from __future__ import annotations

import re
import unicodedata

RTL_RE = re.compile("[\u0590-\u08ff\ufb1d-\ufdff\ufe70-\ufefc]")
CELL_SEPARATOR_RE = re.compile(r"(?<!\\)\|")  # a pipe inside a cell is escaped (\|)
HEADING_MARK_RE = re.compile(r"^(#{1,6} )")
PRESENTATION_FORMS_RE = re.compile("[\ufb1d-\ufdff\ufe70-\ufefc]+")


def has_rtl(text: str) -> bool:
    return RTL_RE.search(text) is not None


def _base_direction(line: str) -> str:
    rtl = ltr = 0
    for ch in line:
        kind = unicodedata.bidirectional(ch)
        if kind in ("R", "AL"):
            rtl += 1
        elif kind == "L":
            ltr += 1
    return "R" if rtl >= ltr else "L"


def logical_line(line: str) -> str:
    """One line read in visual order -> logical order (unchanged when it has no right-to-left letter)."""
    if not has_rtl(line):
        return line
    from bidi import get_display

    line = PRESENTATION_FORMS_RE.sub(lambda m: unicodedata.normalize("NFKC", m.group()), line)
    return get_display(line, base_dir=_base_direction(line))


def logical_text(text: str) -> str:
    """Every line in logical order; in Markdown table rows each cell on its own (the row's pipes stay)."""
    if not has_rtl(text):
        return text
    out = []
    for line in text.split("\n"):
        if line.lstrip().startswith("|") and has_rtl(line):
            cells = CELL_SEPARATOR_RE.split(line.strip().removeprefix("|").removesuffix("|"))
            cells = [logical_line(cell.strip().replace("\\|", "|")).replace("|", "\\|") for cell in cells]
            out.append("| " + " | ".join(cells) + " |")
        else:
            heading = HEADING_MARK_RE.match(line)  # a Markdown heading mark stays in front
            out.append(heading.group(1) + logical_line(line[heading.end(1):]) if heading else logical_line(line))
    return "\n".join(out)


def visual_glyph(text: str) -> str:
    """The text of one glyph as it reads in visual order. A ligature glyph (Arabic lam-alef) maps to several
    letters in logical order; reversed here, it comes back in order when its line is reversed to logical."""
    return text[::-1] if len(text) > 1 and has_rtl(text) else text
