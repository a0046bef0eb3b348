"""The search: every statement of the ranking is a function in the database (schema `rag`, sql/functions/), so
applications that search with SQL (`rag.search`) and the pipeline's own search run the same ranking. This module
calls them; rag_pipeline.retrieval.search validates the request and embeds the query.

The BM25 list (rag.bm25_ranking, sql/functions/50_bm25_ranking.sql) first tries the chunks that hold enough of the
query's terms to reach a threshold, found by a GIN index of each chunk's terms and scored exactly, when few do
(rag.bm25_by_term_sets). Otherwise it reads impact-ordered postings: the `depth` highest-weighted
postings of each query term, or the whole list when it is at most twice that (never every match of a longer list),
bounds what each chunk could score, rescores exactly the chunks whose bound reaches the k-th exact score, and reads
deeper while a chunk not read could still beat the last one kept; callers whose labels reach few rows have those rows
ranked directly. The dense list walks HNSW with the labels inside the query, or ranks the caller's rows exactly when they
are few or a small share of the index. rag.search_version fuses them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from pgvector import HalfVector
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from rag_pipeline.config import AbstentionConfig, Bm25Config, RetrievalConfig, RoutingConfig
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
    max_terms: int = Bm25Config().max_query_terms,
    documents: list[str] | None = None,
    few_rows: int = FEW_ROWS,
    term_sets: bool = True,
) -> LexicalRanking:
    """The top `want` chunks by BM25 among those the caller's labels reach (and, given `documents`, of those
    documents only), best first, ties by chunk id (rag.bm25_ranking). `term_sets` False ranks without the term-set
    index, over the impact-ordered postings alone (as tests compare the two)."""
    if not labels:
        raise ValueError("a search needs the caller's labels")
    # p_term_sets named only when off: a database a release before it left still answers the call with its default
    rows = conn.execute(sql.SQL("SELECT chunk_id, score FROM rag.bm25_ranking(%s, %s, %s, %s, %s, %s, %s, %s{})").format(
                            sql.SQL("") if term_sets else sql.SQL(", p_term_sets => false")),
                        (version.version_id, text, list(labels), want, depth, max_terms, documents, few_rows)
                        ).fetchall()
    return LexicalRanking([r[0] for r in rows], [float(r[1]) for r in rows])


def named_documents(
    conn: psycopg.Connection, version: IndexVersion, text: str, labels: tuple[str, ...], *, min_score: float,
    ratio: float, max_documents: int, min_terms: int = 1, min_concentration: float = 0.9, cap: int = 1000,
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
        # each hit with what its document is (rag.document_identity), in the ranking's order
        return cur.execute(
            """SELECT s.*, rag.document_identity(d.title, d.metadata, d.identity) AS document
               FROM rag.search_version(%s, %s, %s, %s, %s, %s, %s) WITH ORDINALITY AS s
               LEFT JOIN documents d ON d.doc_id = s.doc_id
               ORDER BY s.ordinality""",
            (version.version_id, query.vector, query.text, list(query.labels), query.k, query.mode,
             Jsonb(query.options)),
        ).fetchall()


def abstention_reason(conn: psycopg.Connection, version: IndexVersion, text: str, labels: tuple[str, ...],
                      options: dict[str, Any]) -> str | None:
    """Why rag.search_version answered nothing because of rag.abstention (the same rule, asked again for its
    reason: only searches that came back empty pay for it), or None."""
    routing = options["routing"]
    named = (named_documents(conn, version, text, labels, min_score=routing["min_score"], ratio=routing["ratio"],
                             max_documents=routing["max_documents"], min_terms=routing["min_terms"],
                             min_concentration=routing["min_concentration"]) if routing["enabled"] else [])
    return conn.execute("SELECT rag.abstention(%s, %s, %s, %s, %s, %s)",
                        (version.version_id, text, list(labels), named, options["abstain_unknown_names"],
                         options["abstain_period_lookback"])).fetchone()[0]


def unheld_labels(conn: psycopg.Connection, version: IndexVersion, labels: Sequence[str]) -> list[str]:
    """The labels no row of `version` carries (rag.unheld_labels): for operators, never for a caller."""
    return list(conn.execute("SELECT rag.unheld_labels(%s, %s)", (version.version_id, list(labels))).fetchone()[0])


def record_settings(conn: psycopg.Connection, options: dict[str, Any]) -> None:
    """The ranking rag.search runs for SQL callers: the pipeline's configured one."""
    conn.execute("UPDATE rag.search_settings SET options = %s, updated_at = now() WHERE options <> %s",
                 (Jsonb(options), Jsonb(options)))


def ranking_options(*, dense_weight: float, sparse_weight: float, rrf_k: float, candidates: int | None,
                    ef_search: int | None, min_similarity: float | None, page_weight: float, bm25: Bm25Config,
                    routing: RoutingConfig, abstention: AbstentionConfig) -> dict[str, Any]:
    """A ranking as rag.search_version takes its options (and rag.search_settings keeps them): the one mapping from
    the configuration's names to the SQL's (rag_pipeline.retrieval.search.SearchOptions.sql_options uses it too)."""
    return {
        "dense_weight": dense_weight, "sparse_weight": sparse_weight, "rrf_k": rrf_k, "candidates": candidates,
        "ef_search": ef_search, "min_similarity": min_similarity, "page_weight": page_weight, "bm25_depth": bm25.depth,
        "bm25_max_terms": bm25.max_query_terms, "abstain_unknown_names": abstention.unknown_names,
        "abstain_period_lookback": abstention.period_lookback_years,
        "routing": {"enabled": routing.enabled, "weight": routing.weight, "min_score": routing.min_score,
                    "ratio": routing.ratio, "max_documents": routing.max_documents, "min_terms": routing.min_terms,
                    "min_concentration": routing.min_concentration, "max_share": routing.max_share},
    }


def configured_ranking(retrieval: RetrievalConfig) -> dict[str, Any]:
    """A `retrieval` configuration section as ranking options."""
    return ranking_options(dense_weight=retrieval.dense_weight, sparse_weight=retrieval.sparse_weight,
                           rrf_k=retrieval.rrf_k,
                           candidates=retrieval.candidates, ef_search=None, min_similarity=retrieval.min_similarity,
                           page_weight=retrieval.page_weight, bm25=retrieval.bm25, routing=retrieval.document_routing,
                           abstention=retrieval.abstention)


def record_default_settings(conn: psycopg.Connection) -> None:
    """Every ranking option rag.search_settings lacks, at the configuration's default (migrate() calls this). The SQL
    functions keep no defaults of their own: an option a caller leaves out is read from rag.search_settings, so a
    database that was only migrated ranks as the default configuration does. Options written before are kept."""
    defaults = Jsonb(configured_ranking(RetrievalConfig()))
    conn.execute("""UPDATE rag.search_settings s SET options = m.merged, updated_at = now()
                    FROM (SELECT %(d)s::jsonb || options || jsonb_build_object(
                                     'routing', (%(d)s::jsonb -> 'routing') || coalesce(options -> 'routing', '{}'))
                                 AS merged
                          FROM rag.search_settings) AS m
                    WHERE s.options <> m.merged""", {"d": defaults})
