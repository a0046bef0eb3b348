"""The search queries: the lexical (BM25) list, the dense list and their fusion, with the caller's labels inside
every query. rag_pipeline.retrieval validates the request and embeds the query; this module only runs it.

The BM25 list reads impact-ordered postings: the `depth` highest-weighted postings of each query term (never
every match), rescored exactly as BM25 from each candidate's weight vector. It is exact whenever no chunk
outside the candidates can beat the last one kept: a chunk none of whose postings were read scores at most the
sum over terms of idf x the last weight read for that term. When that bound is not met (labels that few chunks
carry, queries of only very common terms), the terms whose unread postings could add the most are read deeper,
and after a few rounds every row the caller may read is ranked. A caller whose labels reach few rows has those
rows ranked directly, in both lists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from pgvector import HalfVector
from psycopg import sql
from psycopg.rows import dict_row

from rag_pipeline.store.versions import IndexVersion

RRF_K = 60
SPARSE_DIMENSIONS = 1_000_000_000  # rag_term_id's range (migration 009)


@dataclass(frozen=True)
class QueryTerm:
    term_id: int
    term: str
    df: int
    idf: float


def _part(version: IndexVersion, suffix: str) -> sql.Identifier:
    return sql.Identifier(f"{version.table_name}_{suffix}")


def query_terms(conn: psycopg.Connection, version: IndexVersion, text: str, max_terms: int) -> list[QueryTerm]:
    """The query's terms under every language configuration the version's rows use, with their BM25 idf,
    rarest first: at most `max_terms`, so a long question's instructions and filler cannot drown its content
    words (those have the highest idf). Terms no row holds are dropped."""
    rows = conn.execute(
        sql.SQL(
            """WITH params AS (SELECT configs FROM {params}),
                    totals AS (SELECT coalesce(sum(chunks), 0) AS n FROM {totals}),
                    terms AS (
                        SELECT DISTINCT ON (rag_term_id(l.term)) rag_term_id(l.term) AS term_id, l.term
                        FROM params, unnest(params.configs || 'simple'::regconfig) AS cfg, rag_lexemes(cfg, %s) l
                        ORDER BY rag_term_id(l.term), l.term),
                    counted AS (
                        SELECT t.term_id, t.term, (SELECT coalesce(sum(df), 0) FROM {df} d
                                                   WHERE d.term_id = t.term_id)::bigint AS df
                        FROM terms t)
               SELECT c.term_id, c.term, c.df, ln(1 + (totals.n - c.df + 0.5) / (c.df + 0.5)) AS idf
               FROM counted c, totals WHERE c.df > 0
               ORDER BY idf DESC, c.term_id LIMIT %s"""
        ).format(params=_part(version, "bm25_params"), totals=_part(version, "bm25_totals"),
                 df=_part(version, "bm25_df")),
        (text, max_terms),
    ).fetchall()
    return [QueryTerm(int(term_id), term, int(df), float(idf)) for term_id, term, df, idf in rows]


def _query_vector(terms: list[QueryTerm]) -> str:
    entries = ",".join(f"{t.term_id}:{t.idf!r}" for t in sorted(terms, key=lambda t: t.term_id))
    return f"{{{entries}}}/{SPARSE_DIMENSIONS}"


_IMPACT_SQL = """
WITH q AS (SELECT * FROM unnest(%(ids)s::integer[], %(idfs)s::float8[], %(depths)s::integer[])
           AS q(term_id, idf, depth)),
top AS (  -- the highest-weighted postings of each term (an index-only scan of the impact index)
    SELECT q.term_id, q.idf, q.depth, p.lexical_id, p.weight FROM q CROSS JOIN LATERAL (
        SELECT lexical_id, weight FROM {postings} p WHERE p.term_id = q.term_id
        ORDER BY weight DESC LIMIT q.depth) p
),
last AS (  -- per term, the lowest weight read, or 0 when its whole list was read
    SELECT term_id, idf, CASE WHEN count(*) < depth THEN 0 ELSE min(weight) END AS last FROM top
    GROUP BY term_id, idf, depth
),
total AS (SELECT coalesce(sum(idf * last), 0) AS unseen FROM last),
bounded AS (  -- what each chunk read scores at most: its weights read plus the last weight of every other term
    SELECT top.lexical_id, sum(top.idf * top.weight) + total.unseen - sum(top.idf * l.last) AS upper
    FROM top JOIN last l USING (term_id), total GROUP BY top.lexical_id, total.unseen
),
ranked AS (
    SELECT lexical_id, upper, row_number() OVER (ORDER BY upper DESC, lexical_id) AS position FROM bounded
),
rescored AS (
    SELECT t.chunk_id, -(d.vec <#> %(qvec)s::sparsevec) AS score
    FROM ranked r JOIN {docs} d USING (lexical_id) JOIN {table} t USING (lexical_id)
    WHERE r.position <= %(pool)s AND t.acl_labels && %(labels)s::text[]
    ORDER BY score DESC, t.chunk_id LIMIT %(want)s
),
rest AS (  -- the best any chunk not rescored could score
    SELECT greatest((SELECT unseen FROM total), coalesce((SELECT max(upper) FROM ranked WHERE position > %(pool)s), 0))
           AS bound
)
SELECT rest.bound, (SELECT array_agg(idf * last ORDER BY term_id) FROM last) AS slack,
       (SELECT array_agg(term_id ORDER BY term_id) FROM last) AS slack_terms, rescored.chunk_id, rescored.score
FROM rest LEFT JOIN rescored ON true
ORDER BY rescored.score DESC, rescored.chunk_id
"""

_LABELLED_SQL = """
SELECT t.chunk_id, -(d.vec <#> %(qvec)s::sparsevec) AS score
FROM {table} t JOIN {docs} d USING (lexical_id)
WHERE t.acl_labels && %(labels)s::text[]
  AND (%(documents)s::text[] IS NULL OR t.doc_id = ANY(%(documents)s::text[]))
  AND -(d.vec <#> %(qvec)s::sparsevec) > 0
ORDER BY score DESC, t.chunk_id LIMIT %(want)s
"""

# Callers whose labels (or named documents) reach fewer rows than this are ranked over exactly those rows.
FEW_ROWS = 5000
MAX_ROUNDS = 5  # of reading deeper; then every row the caller may read is ranked
COMMON_SHARE = 0.25  # a query whose rarest term is in more than this share of the rows ranks every match


@dataclass(frozen=True)
class LexicalRanking:
    chunk_ids: list[str]
    scores: list[float]
    terms: list[QueryTerm]
    depth: int  # postings read per term; 0: the rows the caller may read were ranked directly
    exact: bool


def bm25_ranking(
    conn: psycopg.Connection,
    version: IndexVersion,
    text: str,
    labels: tuple[str, ...],
    want: int,
    *,
    depth: int = 1000,
    max_terms: int = 12,
    documents: list[str] | None = None,
    few_rows: int = FEW_ROWS,
) -> LexicalRanking:
    """The top `want` chunks by BM25 among those the caller's labels reach (and, given `documents`, of those
    documents only), best first (ties by chunk id).

    Callers (or documents) that reach few rows have those rows ranked directly. Otherwise the highest-weighted
    postings of each term are read, the chunks whose upper bound is highest are rescored exactly, and the result
    stands when no other chunk could beat the last one kept; if it could, more is read."""
    if not labels:
        raise ValueError("a search needs the caller's labels")
    terms = query_terms(conn, version, text, max_terms)
    if not terms:
        return LexicalRanking([], [], [], 0, True)
    parts = {"table": sql.Identifier(version.table_name), "docs": _part(version, "bm25docs"),
             "postings": _part(version, "postings")}
    params = {"ids": [t.term_id for t in terms], "idfs": [t.idf for t in terms], "qvec": _query_vector(terms),
              "labels": list(labels), "want": want, "documents": documents}

    def every_readable_row() -> LexicalRanking:
        rows = conn.execute(sql.SQL(_LABELLED_SQL).format(**parts), params).fetchall()
        return LexicalRanking([r[0] for r in rows], [float(r[1]) for r in rows], terms, 0, True)

    if documents is not None or label_rows(conn, version, labels) < few_rows:
        # Within named documents, or for labels that reach few rows: rank exactly those rows.
        return every_readable_row()
    if min(t.df for t in terms) > COMMON_SHARE * total_rows(conn, version):
        # Only very common terms: almost every chunk matches and reading deeper would end in ranking them all.
        return every_readable_row()
    impact = sql.SQL(_IMPACT_SQL).format(**parts)
    depths = {t.term_id: depth for t in terms}
    pool = 2 * want
    for _ in range(MAX_ROUNDS):
        rows = conn.execute(impact, {**params, "depths": [depths[t.term_id] for t in terms], "pool": pool}).fetchall()
        bound = float(rows[0][0])
        kept = [(chunk_id, float(score)) for *_, chunk_id, score in rows if chunk_id is not None]
        if (len(kept) == want and kept[-1][1] >= bound) or bound == 0.0:
            return LexicalRanking([c for c, _ in kept], [s for _, s in kept], terms, max(depths.values()), True)
        # Read deeper where the bound comes from: the terms whose unread postings could add the most.
        slack = dict(zip(rows[0][2], (float(x) for x in rows[0][1]), strict=True))
        for term_id, _ in sorted(slack.items(), key=lambda item: -item[1])[:2]:
            if slack[term_id] > 0:
                depths[term_id] *= 4
        pool *= 2
    return every_readable_row()


def total_rows(conn: psycopg.Connection, version: IndexVersion) -> int:
    return int(conn.execute(sql.SQL("SELECT coalesce(sum(chunks), 0) FROM {}").format(_part(version, "bm25_totals")))
               .fetchone()[0])


def label_rows(conn: psycopg.Connection, version: IndexVersion, labels: tuple[str, ...]) -> int:
    """At most how many rows the caller's labels reach (the per-label counts the BM25 triggers keep, summed)."""
    return int(conn.execute(
        sql.SQL("SELECT coalesce(sum(df), 0) FROM {} WHERE term_id IN"
                " (SELECT rag_label_term_id(l) FROM unnest(%s::text[]) AS l)").format(_part(version, "bm25_df")),
        (list(labels),),
    ).fetchone()[0])


_NAMED_DOCUMENTS_SQL = """
WITH q AS (
    SELECT DISTINCT rag_term_id(l.term) AS term_id
    FROM unnest(ARRAY['english', 'simple']::regconfig[]) AS cfg, rag_lexemes(cfg, %(text)s) l
),
n AS (  -- the planner's estimate where it has one, else a count (small or never analysed tables)
    SELECT CASE WHEN reltuples >= 10000 THEN reltuples ELSE (SELECT count(*) FROM documents) END AS docs
    FROM pg_class WHERE oid = 'documents'::regclass
),
counted AS (
    SELECT q.term_id, (SELECT count(*) FROM (SELECT 1 FROM documents d WHERE d.name_terms @> ARRAY[q.term_id]
                                             LIMIT %(cap)s) x) AS df
    FROM q
),
naming AS (  -- terms that single out documents: held by few of them
    SELECT term_id, ln(1 + (n.docs - df + 0.5) / (df + 0.5)) AS idf FROM counted, n
    WHERE df > 0 AND df < %(cap)s
)
SELECT d.doc_id, sum(w.idf) AS score
FROM documents d JOIN naming w ON d.name_terms @> ARRAY[w.term_id]
WHERE d.name_terms && (SELECT coalesce(array_agg(term_id), '{}') FROM naming)
  AND d.acl_labels && %(labels)s::text[]
GROUP BY d.doc_id HAVING count(*) >= %(min_terms)s ORDER BY score DESC, d.doc_id LIMIT %(limit)s
"""


def named_documents(
    conn: psycopg.Connection, text: str, labels: tuple[str, ...], *, min_score: float, ratio: float,
    max_documents: int, min_terms: int = 2, cap: int = 1000,
) -> list[str]:
    """Documents the query names by their title, path or metadata (a company, a period, a form), best first:
    those scoring at least `ratio` of the best, when the best reaches `min_score` (a sum of name-term idfs) and
    they are few. A document is named by at least `min_terms` of its name terms (a company and a period, say):
    one word shared with a file name is how topic-named pages (a manual's) match by accident. A query that
    matches a whole family of documents equally names none of them."""
    rows = conn.execute(_NAMED_DOCUMENTS_SQL, {"text": text, "labels": list(labels), "cap": cap,
                                               "limit": max_documents + 1, "min_terms": min_terms}).fetchall()
    if not rows or float(rows[0][1]) < min_score:
        return []
    best = float(rows[0][1])
    named = [doc_id for doc_id, score in rows if float(score) >= ratio * best]
    return named if len(named) <= max_documents else []


_SEARCH_SQL = """
WITH readable AS MATERIALIZED (  -- used only when the caller's labels reach few rows: exact, no HNSW
    SELECT chunk_id, embedding FROM {table}
    WHERE %(use_dense)s AND %(exact_dense)s AND acl_labels && %(labels)s::text[]
),
dense AS (
    SELECT chunk_id, row_number() OVER (ORDER BY distance, chunk_id) AS rank FROM (
        SELECT chunk_id, embedding <=> %(vector)s AS distance FROM {table}
        WHERE %(use_dense)s AND NOT %(exact_dense)s AND acl_labels && %(labels)s::text[]
        ORDER BY embedding <=> %(vector)s LIMIT %(candidates)s) AS nearest
    UNION ALL
    SELECT chunk_id, row_number() OVER (ORDER BY distance, chunk_id) FROM (
        SELECT chunk_id, embedding <=> %(vector)s AS distance FROM readable
        ORDER BY embedding <=> %(vector)s LIMIT %(candidates)s) AS exact
),
sparse AS (
    SELECT chunk_id, rank FROM unnest(%(sparse_ids)s::text[]) WITH ORDINALITY AS s(chunk_id, rank)
),
-- document-aware ranking: the same lists within the documents the query names
routed_dense AS (
    SELECT chunk_id, row_number() OVER (ORDER BY distance, chunk_id) AS rank FROM (
        SELECT chunk_id, embedding <=> %(vector)s AS distance FROM {table}
        WHERE %(use_dense)s AND doc_id = ANY(%(named)s::text[]) AND acl_labels && %(labels)s::text[]
        ORDER BY embedding <=> %(vector)s LIMIT %(candidates)s) AS nearest
),
routed_sparse AS (
    SELECT chunk_id, rank FROM unnest(%(routed_sparse_ids)s::text[]) WITH ORDINALITY AS s(chunk_id, rank)
),
lists AS (
    SELECT chunk_id, rank AS dense_rank, NULL::bigint AS sparse_rank, %(dense_weight)s / (%(rrf_k)s + rank) AS score
    FROM dense
    UNION ALL SELECT chunk_id, NULL, rank, %(sparse_weight)s / (%(rrf_k)s + rank) FROM sparse
    UNION ALL SELECT chunk_id, NULL, NULL, %(routing_weight)s * %(dense_weight)s / (%(rrf_k)s + rank) FROM routed_dense
    UNION ALL SELECT chunk_id, NULL, NULL, %(routing_weight)s * %(sparse_weight)s / (%(rrf_k)s + rank) FROM routed_sparse
),
fused AS (
    SELECT chunk_id, min(dense_rank) AS dense_rank, min(sparse_rank) AS sparse_rank, sum(score) AS score
    FROM lists GROUP BY chunk_id
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
    bm25_depth: int = 1000
    bm25_max_terms: int = 12
    named_documents: tuple[str, ...] = ()  # documents the query names (document-aware ranking); () = none
    routing_weight: float = 1.0  # RRF weight of the lists within the named documents, relative to the global ones


def run(conn: psycopg.Connection, version: IndexVersion, query: SearchQuery) -> list[dict[str, Any]]:
    if not query.labels:
        raise ValueError("a search needs the caller's labels")
    statement = sql.SQL(_SEARCH_SQL).format(table=sql.Identifier(version.table_name))
    with conn.transaction():
        # A caller whose labels reach few rows gets them ranked exactly (HNSW would walk most of the graph to
        # find them, even with iterative scans).
        exact_dense = query.use_dense and label_rows(conn, version, query.labels) < FEW_ROWS
        sparse_ids: list[str] = []
        routed_sparse_ids: list[str] = []
        if query.use_sparse:
            sparse_ids = bm25_ranking(conn, version, query.text, query.labels, query.candidates,
                                      depth=query.bm25_depth, max_terms=query.bm25_max_terms).chunk_ids
            if query.named_documents:
                routed_sparse_ids = bm25_ranking(conn, version, query.text, query.labels, query.candidates,
                                                 depth=query.bm25_depth, max_terms=query.bm25_max_terms,
                                                 documents=list(query.named_documents)).chunk_ids
        # Iterative scan keeps filtered HNSW queries returning enough rows when few chunks match the labels.
        conn.execute("SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true)")
        conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(query.ef_search),))
        with conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(
                statement,
                {
                    "vector": query.vector,
                    "labels": list(query.labels),
                    "use_dense": query.use_dense,
                    "exact_dense": exact_dense,
                    "sparse_ids": sparse_ids,
                    "routed_sparse_ids": routed_sparse_ids,
                    "named": list(query.named_documents),
                    "routing_weight": query.routing_weight,
                    "candidates": query.candidates,
                    "dense_weight": query.dense_weight,
                    "sparse_weight": query.sparse_weight,
                    "rrf_k": RRF_K,
                    "k": query.k,
                    "min_similarity": query.min_similarity,
                },
            ).fetchall()
