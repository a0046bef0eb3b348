"""Queries as people write them: short names, instructions about the answer, and words the documents do not use.

Before a query is ranked it is read three ways, all from configuration (`retrieval.query`):
  * aliases: a short form or initialism ("JPM", "P&G") also says the names it stands for, so document routing and
    the lexical list meet the documents' own names;
  * instructions: sentences about the answer rather than its evidence ("Round your answer to two decimal places",
    "If X is not a useful metric for a company like this, state that and explain why") are left out of what is
    ranked; the question itself is kept;
  * synonyms: a domain vocabulary (a YAML file) maps the words users say to the words and places that hold the
    answer (capital expenditure -> purchases of property, plant and equipment; working capital -> current assets,
    current liabilities, balance sheet); the expansion joins the lexical list and routing, and the dense query.
Nothing here is domain code: the vocabulary is data (docs/retrieval.md shows the shipped financial-statements one).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml

from rag_pipeline.config import ConfigError, QueryConfig

SENTENCE_RE = re.compile(r"(?<=[.?!])\s+(?=[A-Z0-9\"'(])")


@dataclass(frozen=True)
class SynonymEntry:
    """Query phrases (any of `when`) and what they add (`add`)."""

    when: tuple[str, ...]
    add: tuple[str, ...]
    pattern: re.Pattern[str] = field(compare=False, repr=False, default=re.compile(r"(?!)"))


@dataclass(frozen=True)
class PreparedQuery:
    """What each list ranks with."""

    asked: str  # the query as asked
    question: str  # the query without its instructions (what a reranker reads)
    lexical: str  # BM25 and document routing: the question, its aliases' names and its synonyms' expansions
    dense: str  # the embedded text: the question without instructions, with the expansions
    aliases: tuple[str, ...] = ()  # the names aliases added
    expansions: tuple[str, ...] = ()  # what synonyms added
    dropped: tuple[str, ...] = ()  # the instruction sentences left out


def _phrase_pattern(phrases: Sequence[str], case_sensitive: bool = False) -> re.Pattern[str]:
    alternatives = "|".join(sorted((re.escape(p.strip()).replace(r"\ ", r"[\s\-]+") for p in phrases if p.strip()),
                                   key=len, reverse=True))
    return re.compile(rf"(?<![\w&])(?:{alternatives})(?![\w&])", 0 if case_sensitive else re.IGNORECASE)


def load_synonyms(path: Path) -> tuple[SynonymEntry, ...]:
    """A synonyms file: a YAML list of {when: [phrases], add: [phrases]}. A malformed file is refused with the
    entry that is wrong."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"retrieval.query.synonyms_file: cannot read {path}: {exc}") from exc
    if not isinstance(raw, list):
        raise ConfigError(f"retrieval.query.synonyms_file: {path} must hold a list of {{when: [...], add: [...]}}")
    entries = []
    for number, item in enumerate(raw, 1):
        if (not isinstance(item, dict) or set(item) - {"when", "add"}
                or not all(isinstance(item.get(key), list) and item[key]
                           and all(isinstance(p, str) and p.strip() for p in item[key]) for key in ("when", "add"))):
            raise ConfigError(f"retrieval.query.synonyms_file: {path} entry {number} must be {{when: [phrases], "
                              f"add: [phrases]}} with non-empty lists of strings, got {item!r}")
        when, add = tuple(item["when"]), tuple(item["add"])
        entries.append(SynonymEntry(when, add, _phrase_pattern(when)))
    return tuple(entries)


@lru_cache(maxsize=16)
def _synonyms_cached(path: Path, mtime_ns: int) -> tuple[SynonymEntry, ...]:
    return load_synonyms(path)


def synonyms_of(config: QueryConfig) -> tuple[SynonymEntry, ...]:
    if config.synonyms_file is None:
        return ()
    try:
        stamp = config.synonyms_file.stat().st_mtime_ns
    except OSError as exc:
        raise ConfigError(f"retrieval.query.synonyms_file: cannot read {config.synonyms_file}: {exc}") from exc
    return _synonyms_cached(config.synonyms_file, stamp)


@lru_cache(maxsize=64)
def _instruction_patterns(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p, re.IGNORECASE) for p in patterns)


def _alias_names(query: str, aliases: Mapping[str, Sequence[str]]) -> tuple[list[str], str]:
    """The names of every alias the query says as a whole word (an alias with capitals must match its case: "KO" is
    not "ko"), and the query with those aliases in lower case: an alias the configuration resolves is not a name
    the index must hold (abstention reads capitalised words)."""
    names: list[str] = []
    for alias, stands_for in aliases.items():
        pattern = _phrase_pattern([alias], case_sensitive=alias != alias.lower())
        if pattern.search(query):
            names.extend(n for n in stands_for if n not in names)
            query = pattern.sub(lambda m: m.group(0).lower(), query)
    return names, query


def prepare(query: str, config: QueryConfig) -> PreparedQuery:
    """The query as each list ranks it (see the module's head). A query that would lose everything to the
    instruction patterns is kept whole."""
    sentences = [s for s in SENTENCE_RE.split(query.strip()) if s.strip()]
    patterns = _instruction_patterns(tuple(config.instruction_patterns))
    kept = [s for s in sentences if not any(p.search(s) for p in patterns)]
    dropped = tuple(s for s in sentences if s not in kept)
    question = " ".join(kept) if kept else query.strip()
    names = _alias_names(query, config.aliases)[0]
    resolved = _alias_names(question, config.aliases)[1]
    expansions: list[str] = []
    for entry in synonyms_of(config):
        if entry.pattern.search(question):
            expansions.extend(a for a in entry.add if a not in expansions)
    # what is added is lower-cased: a capitalised word of the question names something (abstention reads it), an
    # alias's or a synonym's added words do not (BM25 and routing ignore case)
    lexical = " ".join([resolved, *(n.lower() for n in names), *(e.lower() for e in expansions)])
    dense = " ".join([question, *names, *expansions]) if config.expand_dense else " ".join([question, *names])
    return PreparedQuery(query, question, lexical, dense, tuple(names), tuple(expansions), dropped)
