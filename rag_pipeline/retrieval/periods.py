"""Periods in questions: "FY2022", "Q3 2022", "3Q22", "fiscal 2024", "as of 2021", "the latest report".

Document routing (sql/functions/60_routing.sql) prefers, among the documents a query names, those whose own period
(rag_pipeline.text.identity) is the one asked for, or the newest for "latest". This module reads the same periods
in Python, so that a search whose results hold no document of the period asked for says so instead of answering
from another period in silence.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# One word, its surrounding punctuation off, in lower case; an amount ("$2,050") is not a period. The same
# patterns as rag.asked_periods (sql/functions/60_routing.sql).
YEAR = r"(?:19|20)[0-9][0-9]"
ASCII_SPACE_RE = re.compile(r"[ \t\n\r\f\v]+")  # as PostgreSQL's \s splits a query into words
YEAR_RES = (re.compile(rf"^(?:fy)?({YEAR})$"), re.compile(rf"^(?:q[1-4]|[1-4]q)[-/]?(?:fy)?({YEAR})$"),
            re.compile(rf"^({YEAR})[-/]?q[1-4]$"))
# a period code with a two-digit year ("FY22", "Q3FY23", "1Q22", "H1-22"): as rag.period_year reads it
SHORT_PERIOD_RE = re.compile(r"^(?:fy|q[1-4]|h[12]|[1-4]q|[12]h)(?:fy)?([0-9][0-9])$")
QUARTER_RES = (re.compile(rf"^q([1-4])(?:[-/]?(?:fy)?(?:[0-9][0-9]|{YEAR}))?$"),
               re.compile(rf"^([1-4])q(?:[-/]?(?:fy)?(?:[0-9][0-9]|{YEAR}))?$"), re.compile(rf"^{YEAR}[-/]?q([1-4])$"))
AMOUNT_RE = re.compile(r"[$€£¥,]")
LATEST_WORDS = frozenset({"latest", "newest"})


@dataclass(frozen=True)
class AskedPeriod:
    years: frozenset[int] = frozenset()
    quarters: frozenset[int] = frozenset()
    latest: bool = False

    def __bool__(self) -> bool:
        return bool(self.years)

    def describe(self) -> str:
        quarters = "/".join(f"Q{q}" for q in sorted(self.quarters))
        years = ", ".join(str(y) for y in sorted(self.years))
        return f"{quarters} {years}".strip()


def _bare(word: str) -> str:
    """The word without the punctuation around it (a loop, not a pattern: linear on any input)."""
    start, end = 0, len(word)
    while start < end and not word[start].isalnum():
        start += 1
    while end > start and not word[end - 1].isalnum():
        end -= 1
    return word[start:end]


def asked_period(query: str) -> AskedPeriod:
    """The years and quarters a query names, word by word, and whether it asks for the latest ("latest", "newest",
    "most recent")."""
    years: set[int] = set()
    quarters: set[int] = set()
    words = [_bare(raw.lower()) for raw in ASCII_SPACE_RE.split(query)[:256]]
    for word in words:
        if AMOUNT_RE.search(word):
            continue
        year = next((m.group(1) for pattern in YEAR_RES if (m := pattern.match(word))), None)
        if year is None and (short := SHORT_PERIOD_RE.match(re.sub(r"[\W_]+", "", word))):
            two = int(short.group(1))
            year = str(two + (2000 if two < 70 else 1900))
        if year:
            years.add(int(year))
        quarter = next((m.group(1) for pattern in QUARTER_RES if (m := pattern.match(word))), None)
        if quarter:
            quarters.add(int(quarter))
    latest = any(w in LATEST_WORDS for w in words) or any(
        a == "most" and b == "recent" for a, b in zip(words, words[1:], strict=False))
    return AskedPeriod(frozenset(years), frozenset(quarters), latest)


def unmatched_period_note(query: str, documents: Iterable[Mapping[str, Any]]) -> str | None:
    """A note when the query names a period and none of the results' documents is of that period (by its own year,
    or the year its period ends), though some say their period: the results come from another period. None when a
    result is of the period asked for, or no result's document says its period."""
    asked = asked_period(query)
    if not asked:
        return None
    found_years = set()
    for document in documents:
        for year in (document.get("year"), str(document.get("period_end") or "")[:4]):
            if year and str(year).isdigit():
                found_years.add(int(year))
    if not found_years or asked.years & found_years:
        return None
    return (f"no document of the period asked for ({asked.describe()}); the results are from documents of "
            f"{', '.join(str(y) for y in sorted(found_years))}")
