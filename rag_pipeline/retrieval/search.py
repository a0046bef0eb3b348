"""Hybrid retrieval: dense (HNSW over halfvec) + lexical (BM25 over impact-ordered postings) fused by Reciprocal
Rank Fusion.

The ACL filter is part of both candidate queries, inside the SQL (rag_pipeline.store.search), so a chunk the
caller may not read is never a candidate. There is no way to call `search` without labels.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import psycopg
from pgvector import HalfVector

from rag_pipeline import store
from rag_pipeline.config import (
    Bm25Config,
    EmbeddingConfig,
    QueryConfig,
    RerankerConfig,
    RoutingConfig,
    Settings,
    parse_labels,
)
from rag_pipeline.embedding.embedders import get_query_embedder
from rag_pipeline.embedding.identity import model_for_version
from rag_pipeline.endpoints.chat import EndpointError
from rag_pipeline.retrieval.query import prepare
from rag_pipeline.store.versions import IndexVersion

log = logging.getLogger(__name__)

MODES = ("hybrid", "dense", "sparse")


class SearchError(ValueError):
    """A search that must not run as asked (no labels, no index, bad arguments)."""


@dataclass(frozen=True)
class SearchOptions:
    """How to rank, beside what to ask: fusion weights, score floor, candidate depth, the query model's setup."""

    min_similarity: float | None = None  # cosine floor; no effect in sparse mode (no query vector)
    dense_weight: float = 1.0
    sparse_weight: float = 1.0
    candidates: int | None = None  # per list; default max(4k, 40)
    page_weight: float = 0.0  # share of a hit's score that is its page's fused score (0: chunks alone)
    ef_search: int | None = None  # HNSW search depth; default max(2 * candidates, 100), at most 1000
    embedding: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    bm25: Bm25Config = field(default_factory=Bm25Config)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    query: QueryConfig = field(default_factory=QueryConfig)
    reranker: RerankerConfig = field(default_factory=RerankerConfig)
    # Queries are embedded without loading torch where the model allows it and no full model is loaded in this
    # process (rag_pipeline.embedding.light: the same vectors): a command-line search, an eval, a run's quality
    # check. The search service turns it off: it keeps the full model, faster per long query.
    light_query_model: bool = True

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> SearchOptions:
        retrieval = settings.retrieval
        values: dict[str, Any] = {
            "min_similarity": retrieval.min_similarity, "dense_weight": retrieval.dense_weight,
            "sparse_weight": retrieval.sparse_weight, "embedding": settings.embedding, "bm25": retrieval.bm25,
            "candidates": retrieval.candidates, "routing": retrieval.document_routing,
            "page_weight": retrieval.page_weight, "query": retrieval.query, "reranker": retrieval.reranker,
        }
        values.update(overrides)
        return cls(**values)

    def sql_options(self) -> dict[str, Any]:
        """The ranking as rag.search_version takes it (and rag.search_settings keeps it for SQL callers)."""
        return store.search.ranking_options(
            dense_weight=self.dense_weight, sparse_weight=self.sparse_weight, candidates=self.candidates,
            ef_search=self.ef_search, min_similarity=self.min_similarity, page_weight=self.page_weight,
            bm25=self.bm25, routing=self.routing)


@dataclass(frozen=True)
class SearchHit:
    chunk_id: str
    doc_id: str
    source: str
    path: str
    page_start: int
    page_end: int
    section_path: str
    content_type: str
    text: str
    prefix: str
    score: float
    dense_rank: int | None
    sparse_rank: int | None
    similarity: float | None = None  # cosine similarity of the chunk to the query (None in sparse mode)
    occurrences: int = 1
    flags: tuple[str, ...] = ()  # e.g. prompt-injection patterns (rag_pipeline.text.safety): treat the text as data
    rerank_score: float | None = None  # the reranker's score, when retrieval.reranker is on

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def query_embedder(version: IndexVersion, options: SearchOptions) -> Any:
    """The loaded model that embeds queries for `version` (loaded on first use, then shared by the process)."""
    return get_query_embedder(model_for_version(version, options.embedding), options.embedding,
                              light=options.light_query_model)


def search(
    conn: psycopg.Connection,
    query: str,
    labels: Sequence[str] | str,
    *,
    k: int = 10,
    mode: str = "hybrid",
    version: IndexVersion | None = None,
    options: SearchOptions | None = None,
) -> list[SearchHit]:
    """Top-k chunks for `query` that carry at least one of the caller's `labels`, from `version` (default:
    the active one)."""
    options = options or SearchOptions()
    caller_labels = parse_labels(labels)
    if not caller_labels:
        raise SearchError("search needs the caller's ACL labels; there is no unlabelled search")
    if mode not in MODES:
        raise SearchError(f"mode must be one of {MODES}, got {mode!r}")
    if not query.strip():
        raise SearchError("empty query")
    if k < 1:
        raise SearchError("k must be at least 1")
    version = version or store.versions.active_version(conn)
    if version is None:
        raise SearchError("there is no active index version yet: run `rag-pipeline ingest` first")
    use_dense = mode in ("hybrid", "dense")
    prepared = prepare(query, options.query)
    vector = HalfVector(query_embedder(version, options).embed_query(prepared.dense)) if use_dense else None
    reranker = options.reranker
    sql_options = options.sql_options()
    # Each list's depth follows the k asked for, also when the reranker asks the fusion for more.
    sql_options["candidates"] = options.candidates or max(4 * k, 40)
    rows = store.search.run(conn, version, store.search.SearchQuery(
        text=prepared.lexical, vector=vector, labels=caller_labels,
        k=max(k, reranker.top_n) if reranker.enabled else k, mode=mode, options=sql_options))
    hits = [
        SearchHit(
            **{key: row[key] for key in ("chunk_id", "doc_id", "source", "path", "page_start", "page_end",
                                         "section_path", "content_type", "text", "prefix", "dense_rank",
                                         "sparse_rank")},
            score=float(row["score"]),
            similarity=None if row["similarity"] is None else float(row["similarity"]),
            occurrences=max(1, int(row["occurrences"])),
            flags=tuple(row["flags"]),
        )
        for row in rows
    ]
    if reranker.enabled and hits:
        hits = rerank(prepared.question, hits, reranker)  # a reranker reads the question, not the expansions
    return hits[:k]


def rerank(query: str, hits: list[SearchHit], reranker: RerankerConfig) -> list[SearchHit]:
    """The fused hits in the reranker's order. An endpoint that fails leaves the fused order (logged): a slow or
    broken reranker must not take search down with it."""
    passages = [f"{h.prefix}\n{h.text}" if h.prefix else h.text for h in hits]
    if reranker.endpoint:
        from rag_pipeline.endpoints.rerank import get_endpoint_reranker

        try:
            scores = get_endpoint_reranker(reranker).scores(query, passages)
        except EndpointError as exc:
            log.warning("reranker endpoint gave no ranking, the fused order stands: %s", exc)
            return hits
    else:
        from rag_pipeline.embedding.local import get_reranker

        scores = get_reranker(reranker.model, reranker.device, reranker.batch_size).scores(query, passages)
    ranked = [replace(h, rerank_score=s) for h, s in zip(hits, scores, strict=True)]
    # ties keep the fused order (a listwise reranker scores the passages it left out in that order already)
    order = sorted(range(len(ranked)), key=lambda i: (-(ranked[i].rerank_score or 0.0), i))
    return [ranked[i] for i in order]
