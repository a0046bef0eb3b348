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

YEAR_RE = re.compile(r"^(?:fy)?((?:19|20)\d\d)$")
# a period code with a two-digit year ("FY22", "Q3FY23", "1Q22", "H1-22"): as rag.period_year reads it
SHORT_PERIOD_RE = re.compile(r"^(?:fy|q[1-4]|h[12]|[1-4]q|[12]h)(?:fy)?(\d\d)$")
QUARTER_RE = re.compile(r"^(?:q([1-4])|([1-4])q)(?:fy)?(?:\d\d|\d{4})?$")
LATEST_WORDS = frozenset({"latest", "newest", "recent", "current"})


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


def asked_period(query: str) -> AskedPeriod:
    """The years and quarters a query names, word by word (punctuation off, case ignored), and whether it asks for
    the latest."""
    years: set[int] = set()
    quarters: set[int] = set()
    latest = False
    for raw in query.split()[:256]:
        word = re.sub(r"[\W_]+", "", raw.lower())
        if full := YEAR_RE.match(word):
            years.add(int(full.group(1)))
        elif short := SHORT_PERIOD_RE.match(word):
            two = int(short.group(1))
            years.add(two + (2000 if two < 70 else 1900))
        if quarter := QUARTER_RE.match(word):
            quarters.add(int(quarter.group(1) or quarter.group(2)))
        latest = latest or word in LATEST_WORDS
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
