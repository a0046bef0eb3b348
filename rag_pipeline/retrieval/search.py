"""Hybrid retrieval: dense (HNSW over halfvec) + lexical (BM25 over impact-ordered postings) fused by Reciprocal
Rank Fusion.

The ACL filter is part of both candidate queries, inside the SQL (rag_pipeline.store.search), so a chunk the
caller may not read is never a candidate. There is no way to call `search` without labels.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import psycopg
from pgvector import HalfVector

from rag_pipeline import store
from rag_pipeline.config import (
    AbstentionConfig,
    Bm25Config,
    EmbeddingConfig,
    QueryConfig,
    RerankerConfig,
    RetrievalConfig,
    RoutingConfig,
    Settings,
    parse_labels,
)
from rag_pipeline.embedding.embedders import get_query_embedder
from rag_pipeline.embedding.identity import model_for_version
from rag_pipeline.endpoints.chat import EndpointError
from rag_pipeline.retrieval.periods import unmatched_period_note
from rag_pipeline.retrieval.query import PreparedQuery, prepare
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
    rrf_k: float = RetrievalConfig().rrf_k
    candidates: int | None = None  # per list; default max(4k, 40)
    page_weight: float = 0.0  # share of a hit's score that is its page's fused score (0: chunks alone)
    ef_search: int | None = None  # HNSW search depth; default max(2 * candidates, 100), at most 1000
    embedding: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    bm25: Bm25Config = field(default_factory=Bm25Config)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    query: QueryConfig = field(default_factory=QueryConfig)
    abstention: AbstentionConfig = field(default_factory=AbstentionConfig)
    reranker: RerankerConfig = field(default_factory=RerankerConfig)
    deadline_seconds: float = RetrievalConfig().search_deadline_seconds  # the reranker's time, from the search's start
    # Queries are embedded without loading torch where the model allows it and no full model is loaded in this
    # process (rag_pipeline.embedding.light: the same vectors): a command-line search, an eval, a run's quality
    # check. The search service turns it off: it keeps the full model, faster per long query.
    light_query_model: bool = True

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> SearchOptions:
        retrieval = settings.retrieval
        values: dict[str, Any] = {
            "min_similarity": retrieval.min_similarity, "dense_weight": retrieval.dense_weight,
            "sparse_weight": retrieval.sparse_weight, "rrf_k": retrieval.rrf_k, "embedding": settings.embedding,
            "bm25": retrieval.bm25,
            "candidates": retrieval.candidates, "routing": retrieval.document_routing,
            "page_weight": retrieval.page_weight, "query": retrieval.query, "reranker": retrieval.reranker,
            "abstention": retrieval.abstention,
            "deadline_seconds": retrieval.search_deadline_seconds,
        }
        values.update(overrides)
        return cls(**values)

    def sql_options(self) -> dict[str, Any]:
        """The ranking as rag.search_version takes it (and rag.search_settings keeps it for SQL callers)."""
        return store.search.ranking_options(
            dense_weight=self.dense_weight, sparse_weight=self.sparse_weight, rrf_k=self.rrf_k,
            candidates=self.candidates,
            ef_search=self.ef_search, min_similarity=self.min_similarity, page_weight=self.page_weight,
            bm25=self.bm25, routing=self.routing, abstention=self.abstention)


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
    # what the document is: title, organisation, kind, year, quarter, period_end (rag.document_identity)
    document: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def query_embedder(version: IndexVersion, options: SearchOptions) -> Any:
    """The loaded model that embeds queries for `version` (loaded on first use, then shared by the process)."""
    return get_query_embedder(model_for_version(version, options.embedding), options.embedding,
                              light=options.light_query_model)


@dataclass(frozen=True)
class SearchPlan:
    """A validated search with its query read and embedded: all the database part needs. Making one waits on no
    connection (the query model may be an endpoint), so a caller with a pool takes a connection only for fetch()."""

    prepared: PreparedQuery
    labels: tuple[str, ...]
    k: int
    mode: str
    version: IndexVersion
    vector: HalfVector | None
    options: SearchOptions
    deadline: float  # time.monotonic() by which the reranker must have answered


@dataclass(frozen=True)
class SearchResult:
    hits: list[SearchHit]
    # what the reranker did: None (none configured), "reranked", or "skipped_<reason>" (RERANK_SKIPS): the fused
    # order stands
    rerank: str | None = None
    # a caveat the caller should pass on: the query names a period no result's document is of
    # (rag_pipeline.retrieval.periods)
    note: str | None = None
    # why there are no hits, when the search abstained ("the index holds nothing about PepsiCo"): rag.abstention's
    # reason, or the score floor
    abstained: str | None = None


RERANK_SKIPS = tuple(f"skipped_{reason}"
                     for reason in ("deadline", "throttled", "failed", "breaker_open", "busy"))


def _checked(query: str, labels: Sequence[str] | str, k: int, mode: str) -> tuple[str, ...]:
    """The caller's labels, once the request is one a search may run."""
    caller_labels = parse_labels(labels)
    if not caller_labels:
        raise SearchError("search needs the caller's ACL labels; there is no unlabelled search")
    if mode not in MODES:
        raise SearchError(f"mode must be one of {MODES}, got {mode!r}")
    if not query.strip():
        raise SearchError("empty query")
    if k < 1:
        raise SearchError("k must be at least 1")
    return caller_labels


def plan(
    query: str,
    labels: Sequence[str] | str,
    *,
    k: int = 10,
    mode: str = "hybrid",
    version: IndexVersion | None,
    options: SearchOptions | None = None,
    started: float | None = None,
) -> SearchPlan:
    """Checks the request and embeds the query for `version`. The search's deadline (retrieval.
    search_deadline_seconds) counts from `started` (time.monotonic(); default: now)."""
    options = options or SearchOptions()
    started = time.monotonic() if started is None else started
    caller_labels = _checked(query, labels, k, mode)
    if version is None:
        raise SearchError("there is no active index version yet: run `rag-pipeline ingest` first")
    prepared = prepare(query, options.query)
    use_dense = mode in ("hybrid", "dense")
    vector = HalfVector(query_embedder(version, options).embed_query(prepared.dense)) if use_dense else None
    return SearchPlan(prepared, caller_labels, k, mode, version, vector, options, started + options.deadline_seconds)


def fetch(conn: psycopg.Connection, planned: SearchPlan) -> list[SearchHit]:
    """The database part: the fused candidates (the reranker's top_n when one is on, else k), best first."""
    reranker, options = planned.options.reranker, planned.options
    sql_options = options.sql_options()
    # Each list's depth follows the k asked for, also when the reranker asks the fusion for more.
    sql_options["candidates"] = options.candidates or max(4 * planned.k, 40)
    wanted = max(planned.k, reranker.top_n) if reranker.enabled else planned.k
    # one document's share is of the k asked for, also when the reranker is given more to choose from
    sql_options["routing"]["max_share"] = options.routing.max_share * planned.k / wanted
    rows = store.search.run(conn, planned.version, store.search.SearchQuery(
        text=planned.prepared.lexical, vector=planned.vector, labels=planned.labels, k=wanted, mode=planned.mode,
        options=sql_options))
    return [
        SearchHit(
            **{key: row[key] for key in ("chunk_id", "doc_id", "source", "path", "page_start", "page_end",
                                         "section_path", "content_type", "text", "prefix", "dense_rank",
                                         "sparse_rank")},
            score=float(row["score"]),
            similarity=None if row["similarity"] is None else float(row["similarity"]),
            occurrences=max(1, int(row["occurrences"])),
            flags=tuple(row["flags"]),
            document={key: value for key, value in (row.get("document") or {}).items() if key != "found"},
        )
        for row in rows
    ]


def abstention_of(conn: psycopg.Connection, planned: SearchPlan) -> str | None:
    """Why a fetch came back empty: rag.abstention's reason (a name nothing readable holds, a period none of the
    documents named is of), else the score floor; None when nothing readable matched at all."""
    reason = store.search.abstention_reason(conn, planned.version, planned.prepared.lexical, planned.labels,
                                            planned.options.sql_options())
    if reason is None and planned.options.min_similarity is not None and planned.mode != "sparse":
        reason = (f"nothing the caller may read is above the score floor (retrieval.min_similarity "
                  f"{planned.options.min_similarity})")
    return reason


def finish(planned: SearchPlan, hits: list[SearchHit], abstained: str | None = None) -> SearchResult:
    """The top k of the fetched hits, reranked when a reranker is on and answers by the plan's deadline. Call it
    with no database connection in hand: a reranker may take until the deadline. `abstained`: abstention_of() of
    an empty fetch."""
    reranker = planned.options.reranker
    if not reranker.enabled or not hits:
        kept = hits[:planned.k]
        return SearchResult(kept, note=unmatched_period_note(planned.prepared.question, [h.document for h in kept]),
                            abstained=None if kept else abstained)
    # a reranker reads the question, not the expansions
    ranked, outcome = rerank_within(planned.prepared.question, hits, reranker, planned.deadline)
    kept = ranked[:planned.k]
    return SearchResult(kept, outcome, unmatched_period_note(planned.prepared.question, [h.document for h in kept]))


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
    the active one). For a caller that owns `conn`; the search service, which shares a pool, uses plan(), fetch()
    and finish() so that no connection waits on an endpoint."""
    return search_result(conn, query, labels, k=k, mode=mode, version=version, options=options,
                         explain_empty=False).hits


def search_result(
    conn: psycopg.Connection,
    query: str,
    labels: Sequence[str] | str,
    *,
    k: int = 10,
    mode: str = "hybrid",
    version: IndexVersion | None = None,
    options: SearchOptions | None = None,
    explain_empty: bool = True,
) -> SearchResult:
    """search() with what the hits do not say: the reranker's outcome, a period caveat, and (`explain_empty`) why
    nothing came back, which costs one more query when nothing did."""
    started = time.monotonic()
    _checked(query, labels, k, mode)  # a request refused before the database is asked anything
    version = version or store.versions.active_version(conn)
    planned = plan(query, labels, k=k, mode=mode, version=version, options=options, started=started)
    fetched = fetch(conn, planned)
    return finish(planned, fetched, abstention_of(conn, planned) if explain_empty and not fetched else None)


def rerank_within(query: str, hits: list[SearchHit], reranker: RerankerConfig,
                  deadline: float) -> tuple[list[SearchHit], str]:
    """The fused hits in the reranker's order and "reranked"; or, when the reranker gives no ranking by `deadline`
    (slow, throttling, failing, its breaker open), the fused order and "skipped_<reason>", logged: a slow or broken
    reranker must not take search down with it."""
    passages = [f"{h.prefix}\n{h.text}" if h.prefix else h.text for h in hits]
    if reranker.endpoint:
        from rag_pipeline.endpoints.rerank import RerankUnavailable, get_endpoint_reranker

        try:
            scores = get_endpoint_reranker(reranker).scores(query, passages, deadline)
        except RerankUnavailable as exc:
            # the breaker logged when it opened, and a busy skip is a load signal (GET /metrics counts both): a line
            # for each search they spare would flood the log
            if exc.reason not in ("breaker_open", "busy"):
                log.warning("reranker skipped (%s), the fused order stands: %s", exc.reason, exc)
            return hits, f"skipped_{exc.reason}"
        except EndpointError as exc:
            log.warning("reranker skipped (failed), the fused order stands: %s", exc)
            return hits, "skipped_failed"
    else:
        if time.monotonic() >= deadline:  # a local model cannot be stopped once started; it is not started late
            log.warning("reranker skipped (deadline), the fused order stands: no time left before the local model")
            return hits, "skipped_deadline"
        from rag_pipeline.embedding.local import get_reranker

        scores = get_reranker(reranker.model, reranker.device, reranker.batch_size).scores(query, passages)
    ranked = [replace(h, rerank_score=s) for h, s in zip(hits, scores, strict=True)]
    # ties keep the fused order (a listwise reranker scores the passages it left out in that order already)
    order = sorted(range(len(ranked)), key=lambda i: (-(ranked[i].rerank_score or 0.0), i))
    return [ranked[i] for i in order], "reranked"


def rerank(query: str, hits: list[SearchHit], reranker: RerankerConfig,
           deadline: float | None = None) -> list[SearchHit]:
    """The fused hits in the reranker's order, or in the fused order when it gives none (rerank_within)."""
    return rerank_within(query, hits, reranker, math.inf if deadline is None else deadline)[0]
