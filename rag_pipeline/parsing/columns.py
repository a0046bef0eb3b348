"""Columns of a PDF page found by their gutters: vertical bands that no line of words crosses."""

from __future__ import annotations

from typing import Any


def group_words_into_lines(words: list[dict[str, Any]], tolerance: float = 3.0) -> list[list[dict[str, Any]]]:
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


def spans_gutter(line: list[dict[str, Any]], gutters: list[float]) -> bool:
    """A line that runs across a gutter with ordinary word spacing (a title, a running header)."""
    for gutter in gutters:
        for a, b in zip(line, line[1:], strict=False):
            if a["x0"] < gutter < a["x1"]:
                return True
            if a["x1"] <= gutter <= b["x0"] and b["x0"] - a["x1"] < 4:
                return True
    return False
