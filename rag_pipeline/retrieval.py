"""Hybrid retrieval: dense (HNSW over halfvec) + sparse (tsvector, ts_rank_cd) fused by Reciprocal Rank Fusion.

The ACL filter is part of both candidate queries, inside the SQL, so a chunk the caller may not read is
never a candidate. There is no way to call `search` without labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import psycopg
from pgvector import HalfVector
from psycopg import sql

from rag_pipeline import store
from rag_pipeline.config import parse_labels
from rag_pipeline.embedding import get_embedder

MODES = ("hybrid", "dense", "sparse")
RRF_K = 60

# OR of the query's English lexemes: ts_rank_cd then rewards chunks that hold more of them, the way BM25
# does, instead of websearch_to_tsquery's AND, which makes natural-language questions match nothing.
_OR_TSQUERY = sql.SQL(
    "to_tsquery('simple', array_to_string(ARRAY("
    "SELECT quote_literal(lexeme) FROM unnest(tsvector_to_array(to_tsvector('english', %(query)s))) lexeme"
    " WHERE position(E'\\\\' in lexeme) = 0), ' | '))"
)


class SearchError(ValueError):
    """A search that must not run as asked (no labels, no index, bad arguments)."""


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
    flags: tuple[str, ...] = ()  # e.g. prompt-injection patterns (rag_pipeline.safety): treat the text as data

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_SEARCH_SQL = """
WITH dense AS (
    SELECT chunk_id, row_number() OVER (ORDER BY distance, chunk_id) AS rank FROM (
        SELECT chunk_id, embedding <=> %(vector)s AS distance FROM {table}
        WHERE %(use_dense)s AND acl_labels && %(labels)s::text[]
        ORDER BY embedding <=> %(vector)s LIMIT %(candidates)s) AS nearest
),
sparse AS (
    SELECT chunk_id, row_number() OVER (ORDER BY relevance DESC, chunk_id) AS rank FROM (
        SELECT chunk_id, ts_rank_cd(tsv, q) AS relevance FROM {table}, {tsquery} AS q
        WHERE %(use_sparse)s AND tsv @@ q AND acl_labels && %(labels)s::text[]
        ORDER BY relevance DESC LIMIT %(candidates)s) AS matched
),
fused AS (
    SELECT coalesce(d.chunk_id, s.chunk_id) AS chunk_id, d.rank AS dense_rank, s.rank AS sparse_rank,
           coalesce(%(dense_weight)s / (%(rrf_k)s + d.rank), 0)
         + coalesce(%(sparse_weight)s / (%(rrf_k)s + s.rank), 0) AS score
    FROM dense d FULL OUTER JOIN sparse s USING (chunk_id)
)
SELECT t.chunk_id, t.doc_id, doc.source, doc.rel_path, t.page_start, t.page_end, t.section_path,
       t.content_type, t.text, t.prefix, f.score, f.dense_rank, f.sparse_rank,
       CASE WHEN %(use_dense)s THEN 1 - (t.embedding <=> %(vector)s) END AS similarity,  -- none without a query vector
       -- a near-duplicate group comes back once; this says in how many places (the caller may see) it occurs
       (SELECT count(*) FROM chunks oc JOIN documents od ON od.doc_id = oc.doc_id
        WHERE oc.group_id = t.chunk_id AND od.acl_labels && %(labels)s::text[]) AS occurrences,
       coalesce(owner.flags, '{{}}') AS flags
FROM fused f
JOIN {table} t USING (chunk_id)
JOIN documents doc ON doc.doc_id = t.doc_id
LEFT JOIN chunks owner ON owner.chunk_id = t.owner_chunk_id
WHERE t.acl_labels && %(labels)s::text[]
  -- the score floor: "no good evidence" is an empty answer, not the nearest noise
  AND (%(min_similarity)s::float8 IS NULL OR 1 - (t.embedding <=> %(vector)s) >= %(min_similarity)s::float8)
ORDER BY f.score DESC, t.chunk_id
LIMIT %(k)s
"""


def search(
    conn: psycopg.Connection,
    query: str,
    labels: Sequence[str] | str,
    *,
    k: int = 10,
    mode: str = "hybrid",
    version: store.IndexVersion | None = None,
    device: str = "cpu",
    candidates: int | None = None,
    ef_search: int | None = None,
    dense_weight: float = 1.0,
    sparse_weight: float = 1.0,
    min_similarity: float | None = None,
) -> list[SearchHit]:
    """Top-k chunks for `query` that carry at least one of the caller's `labels`.

    With `min_similarity`, chunks whose cosine similarity to the query is below it are never returned
    (in every mode but `sparse`, which has no query vector)."""
    caller_labels = parse_labels(labels)
    if not caller_labels:
        raise SearchError("search needs the caller's ACL labels; there is no unlabelled search")
    if mode not in MODES:
        raise SearchError(f"mode must be one of {MODES}, got {mode!r}")
    if not query.strip():
        raise SearchError("empty query")
    if k < 1:
        raise SearchError("k must be at least 1")
    version = version or store.active_version(conn)
    if version is None:
        raise SearchError("there is no active index version yet: run `rag-pipeline ingest` first")
    candidates = candidates or max(4 * k, 40)

    if mode == "sparse":
        vector = HalfVector([0.0] * version.dimensions)  # unused: the dense list is switched off
    else:
        vector = HalfVector(get_embedder(version.embedding_model, device=device).embed_query(query))

    statement = sql.SQL(_SEARCH_SQL).format(table=sql.Identifier(version.table_name), tsquery=_OR_TSQUERY)
    with conn.transaction():
        # Iterative scan keeps filtered HNSW queries returning enough rows when few chunks match the labels.
        conn.execute("SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true)")
        conn.execute(
            "SELECT set_config('hnsw.ef_search', %s, true)",  # pgvector accepts 1..1000
            (str(min(1000, ef_search or max(2 * candidates, 100))),),
        )
        rows = conn.execute(
            statement,
            {
                "vector": vector,
                "query": query,
                "labels": list(caller_labels),
                "use_dense": mode in ("hybrid", "dense"),
                "use_sparse": mode in ("hybrid", "sparse"),
                "candidates": candidates,
                "dense_weight": dense_weight,
                "sparse_weight": sparse_weight,
                "rrf_k": RRF_K,
                "k": k,
                "min_similarity": None if mode == "sparse" else min_similarity,
            },
        ).fetchall()
    return [
        SearchHit(
            chunk_id=r[0], doc_id=r[1], source=r[2], path=r[3], page_start=r[4], page_end=r[5],
            section_path=r[6], content_type=r[7], text=r[8], prefix=r[9], score=float(r[10]),
            dense_rank=r[11], sparse_rank=r[12], similarity=None if r[13] is None else float(r[13]), occurrences=max(1, int(r[14])),
            flags=tuple(r[15]),
        )
        for r in rows
    ]
