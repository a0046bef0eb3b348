"""The search: every statement of the ranking is a function in the database (migration 019, schema `rag`), so
applications that search with SQL (`rag.search`) and the pipeline's own search run the same ranking. This module
calls them; rag_pipeline.retrieval.search validates the request and embeds the query.

The BM25 list (rag.bm25_ranking, migrations 020 and 021) reads impact-ordered postings: the `depth` highest-weighted
postings of each query term, or the whole list when it is at most twice that (never every match of a longer list),
bounds what each chunk could score, rescores exactly the chunks whose bound reaches the k-th exact score, and reads
deeper while a chunk not read could still beat the last one kept; callers whose labels reach few rows have those rows
ranked directly. The dense list walks HNSW with the labels inside the query, or ranks the caller's rows exactly when they
are few or a small share of the index. rag.search_version fuses them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from pgvector import HalfVector
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from rag_pipeline.store.versions import IndexVersion

# Callers whose labels (or named documents) reach fewer rows than this are ranked over exactly those rows.
FEW_ROWS = 5000


@dataclass(frozen=True)
class LexicalRanking:
    chunk_ids: list[str]
    scores: list[float]


def bm25_ranking(
    conn: psycopg.Connection,
    version: IndexVersion,
    text: str,
    labels: tuple[str, ...],
    want: int,
    *,
    depth: int = 4000,
    max_terms: int = 12,
    documents: list[str] | None = None,
    few_rows: int = FEW_ROWS,
) -> LexicalRanking:
    """The top `want` chunks by BM25 among those the caller's labels reach (and, given `documents`, of those
    documents only), best first, ties by chunk id (rag.bm25_ranking)."""
    if not labels:
        raise ValueError("a search needs the caller's labels")
    rows = conn.execute("SELECT chunk_id, score FROM rag.bm25_ranking(%s, %s, %s, %s, %s, %s, %s, %s)",
                        (version.version_id, text, list(labels), want, depth, max_terms, documents, few_rows)
                        ).fetchall()
    return LexicalRanking([r[0] for r in rows], [float(r[1]) for r in rows])


def total_rows(conn: psycopg.Connection, version: IndexVersion) -> int:
    return int(conn.execute("SELECT rag.total_rows(%s)", (version.version_id,)).fetchone()[0])


def label_rows(conn: psycopg.Connection, version: IndexVersion, labels: tuple[str, ...]) -> int:
    """At most how many rows the caller's labels reach (the per-label counts the BM25 triggers keep, summed)."""
    return int(conn.execute("SELECT rag.label_rows(%s, %s)", (version.version_id, list(labels))).fetchone()[0])


def named_documents(
    conn: psycopg.Connection, version: IndexVersion, text: str, labels: tuple[str, ...], *, min_score: float,
    ratio: float, max_documents: int, min_terms: int = 1, min_concentration: float = 0.5, cap: int = 1000,
) -> list[str]:
    """Documents the query names by their title, path or metadata (a company, a period, a form), best first
    (rag.named_documents says when a document counts as named)."""
    return list(conn.execute("SELECT rag.named_documents(%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                             (version.version_id, text, list(labels), min_score, ratio, max_documents, min_terms,
                              min_concentration, cap)).fetchone()[0])


@dataclass(frozen=True)
class SearchQuery:
    text: str
    vector: HalfVector | None  # None when the dense list is off
    labels: tuple[str, ...]  # never empty: rag_pipeline.retrieval.search refuses a search without labels
    k: int
    mode: str  # hybrid | dense | sparse
    options: dict[str, Any]  # rag.search_version's p_options (rag_pipeline.retrieval.search.SearchOptions.sql_options)


def run(conn: psycopg.Connection, version: IndexVersion, query: SearchQuery) -> list[dict[str, Any]]:
    if not query.labels:
        raise ValueError("a search needs the caller's labels")
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            "SELECT * FROM rag.search_version(%s, %s, %s, %s, %s, %s, %s)",
            (version.version_id, query.vector, query.text, list(query.labels), query.k, query.mode,
             Jsonb(query.options)),
        ).fetchall()


def record_settings(conn: psycopg.Connection, options: dict[str, Any]) -> None:
    """The ranking rag.search runs for SQL callers: the pipeline's configured one."""
    conn.execute("UPDATE rag.search_settings SET options = %s, updated_at = now() WHERE options <> %s",
                 (Jsonb(options), Jsonb(options)))
