"""Words a text layer sets apart by gaps alone, and glyphs printed twice over, made plain text.

pdfTeX and other producers draw no space characters: a word ends where the next glyph starts further right.
pdfplumber joins glyphs less than a fixed 3 points apart into one word, which in small or tightly justified type
glues whole lines into one token ("Thisisversion0.21oftheSharedMIME-info"), and BM25 and the embedding model see no
words. In such a line glyphs within a word sit within 0.05 em of each other (0.06 em in small capitals) and words
are 0.2 em apart or more (measured on the papers, manuals and journal articles of the long-document set): a space is
put into every gap wider than the line's own letter spacing (its first quartile of gaps) by WORD_GAP_EM of the type
size. A tracked heading, every letter set apart, keeps its words whole. Text drawn two or three times a hair apart
(bold faked by overprinting) is read once.
"""

from __future__ import annotations

from typing import Any

WORD_GAP_EM = 0.1
# pdfplumber starts a new word past this gap (its default x_tolerance); only narrower gaps glue words
PDFPLUMBER_X_TOLERANCE = 3.0
SAME_LINE_TOLERANCE = 3.0  # points between glyphs' tops on one line (pdfplumber's y_tolerance)
# A glyph repeated within a tenth of its type size (and half its width) is the same glyph printed again: fake bold
# a fraction of a point apart, a headline's shadow a point apart at 35 points.
OVERPRINT_EM = 0.1
OVERPRINT_CELL = 4.0  # points: the hashed grid's cells, the most any overprint may be apart


def _unspaced_script(ch: str) -> bool:
    """Chinese and Japanese are written without spaces between words: no gap there stands for one."""
    code = ord(ch[0]) if ch else 0
    return 0x2E80 <= code <= 0x9FFF or 0xF900 <= code <= 0xFAFF or 0xFF00 <= code <= 0xFFEF


def _lines(chars: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    lines: list[list[dict[str, Any]]] = []
    for char in sorted(chars, key=lambda c: (float(c["top"]), float(c["x0"]))):
        if lines and abs(float(char["top"]) - float(lines[-1][0]["top"])) <= SAME_LINE_TOLERANCE:
            lines[-1].append(char)
        else:
            lines.append([char])
    return [sorted(line, key=lambda c: float(c["x0"])) for line in lines]


def word_gap_spaces(chars: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The space characters the gaps between `chars` (pdfplumber's char dicts) stand for: (the glyph a space
    follows, the space as a char dict)."""
    upright = [c for c in chars if c.get("upright", True)]
    spaces: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for line in _lines(upright):
        gaps = []
        for a, b in zip(line, line[1:], strict=False):
            size = max(float(a.get("size") or 0), float(b.get("size") or 0))
            width = float(b["x0"]) - float(a["x1"])
            # a space the layer drew itself, a glyph without a size, or a gap pdfplumber splits at anyway
            if size > 0 and a["text"].strip() and b["text"].strip() and width <= PDFPLUMBER_X_TOLERANCE:
                gaps.append((a, b, width, width / size))
        if not gaps:
            continue
        # The line's own letter spacing, from its narrower gaps (most of a line's glyphs are inside words): about 0
        # in body type, 0.06 em in small capitals, more in a tracked heading.
        letter_spacing = max(0.0, sorted(em for *_, em in gaps)[len(gaps) // 4])  # kerned or overlapping: 0
        for a, b, width, em in gaps:
            if em >= letter_spacing + WORD_GAP_EM and not (_unspaced_script(a["text"]) or _unspaced_script(b["text"])):
                spaces.append((a, {**a, "text": " ", "x0": float(a["x1"]), "x1": float(b["x0"]), "width": width,
                                   "adv": width}))
    return spaces


def overprints_removed(chars: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`chars` less every glyph that repeats an earlier one (same text, font and size) within OVERPRINT_EM of its
    size. What pdfplumber's dedupe_chars does with a size-aware tolerance, in linear time: its clustering took
    1.6 s on a filing's page of 6,600 characters, a hashed grid takes milliseconds."""
    kept: list[dict[str, Any]] = []
    cells: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for char in chars:
        x, y = float(char["x0"]), float(char["top"])
        size = float(char.get("size") or 0)
        # at most half the glyph's width: two narrow letters in tiny type ("ll" at 4 points) are not one printed twice
        tolerance = min(OVERPRINT_EM * size, 0.5 * (float(char["x1"]) - x), OVERPRINT_CELL)
        key = (char["text"], char.get("fontname"), round(size, 2), char.get("upright", True))
        column, row = int(x // OVERPRINT_CELL), int(y // OVERPRINT_CELL)
        if any(abs(float(other["x0"]) - x) <= tolerance and abs(float(other["top"]) - y) <= tolerance
               for dx in (-1, 0, 1) for dy in (-1, 0, 1) for other in cells.get((*key, column + dx, row + dy), ())):
            continue
        kept.append(char)
        cells.setdefault((*key, column, row), []).append(char)
    return kept


def plain_words(page: Any) -> tuple[Any, dict[str, int]]:
    """The pdfplumber page with overprinted glyphs read once and word gaps spaced, and how many of each."""
    from pdfplumber.page import FilteredPage

    chars = overprints_removed(page.chars)
    spaces = word_gap_spaces(chars)
    stats = {"overprinted_glyphs": len(page.chars) - len(chars), "word_gaps_spaced": len(spaces)}
    if not stats["overprinted_glyphs"] and not spaces:
        return page, stats
    # Each space right after the glyph it follows: pdfplumber groups a page's characters into runs of one
    # orientation in their order, and spaces appended after a sideways stamp would join no upright line.
    after = {id(glyph): space for glyph, space in spaces}
    plain = FilteredPage(page, lambda obj: True)
    plain._objects = {**page.objects, "char": [c for char in chars for c in (char, after.get(id(char))) if c]}
    return plain, stats
