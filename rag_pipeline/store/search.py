"""The hybrid search query: dense (HNSW over halfvec) and lexical (tsvector) candidates, fused by Reciprocal
Rank Fusion, with the caller's labels inside every candidate query. rag_pipeline.retrieval validates the
request and embeds the query; this module only runs it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from pgvector import HalfVector
from psycopg import sql
from psycopg.rows import dict_row

from rag_pipeline.store.versions import IndexVersion

RRF_K = 60

# OR of the query's English lexemes: ts_rank_cd then rewards chunks that hold more of them, instead of
# websearch_to_tsquery's AND, which makes natural-language questions match nothing.
_OR_TSQUERY = sql.SQL(
    "to_tsquery('simple', array_to_string(ARRAY("
    "SELECT quote_literal(lexeme) FROM unnest(tsvector_to_array(to_tsvector('english', %(query)s))) lexeme"
    " WHERE position(E'\\\\' in lexeme) = 0), ' | '))"
)

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
SELECT t.chunk_id, t.doc_id, doc.source, doc.rel_path AS path, t.page_start, t.page_end, t.section_path,
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


@dataclass(frozen=True)
class SearchQuery:
    text: str
    vector: HalfVector  # zeros when the dense list is off
    labels: tuple[str, ...]  # never empty: rag_pipeline.retrieval refuses a search without labels
    k: int
    use_dense: bool
    use_sparse: bool
    candidates: int
    ef_search: int
    dense_weight: float
    sparse_weight: float
    min_similarity: float | None


def run(conn: psycopg.Connection, version: IndexVersion, query: SearchQuery) -> list[dict[str, Any]]:
    if not query.labels:
        raise ValueError("a search needs the caller's labels")
    statement = sql.SQL(_SEARCH_SQL).format(table=sql.Identifier(version.table_name), tsquery=_OR_TSQUERY)
    with conn.transaction():
        # Iterative scan keeps filtered HNSW queries returning enough rows when few chunks match the labels.
        conn.execute("SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true)")
        conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(query.ef_search),))
        with conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(
                statement,
                {
                    "vector": query.vector,
                    "query": query.text,
                    "labels": list(query.labels),
                    "use_dense": query.use_dense,
                    "use_sparse": query.use_sparse,
                    "candidates": query.candidates,
                    "dense_weight": query.dense_weight,
                    "sparse_weight": query.sparse_weight,
                    "rrf_k": RRF_K,
                    "k": query.k,
                    "min_similarity": query.min_similarity,
                },
            ).fetchall()
