-- One version's ranking: the dense list (HNSW, or exact over the rows of a caller whose labels reach few), the
-- BM25 list, and with document routing the same two lists within the documents the query names, fused by
-- weighted Reciprocal Rank Fusion; pages fused the same way (page_weight blends a chunk's own fused score with its
-- page's: analysts cite pages, and a page the lists reach through several of its chunks is the likelier evidence);
-- the score floor; a near-duplicate group once, with how many places (the caller may see) it occurs in.
--
-- p_options: dense_weight, sparse_weight, rrf_k (a list's n-th hit adds weight / (rrf_k + n)), candidates (null:
-- max(4 k, 40)), ef_search (null: 2 x candidates, within 100 to 1000), min_similarity (null: no floor), page_weight,
-- bm25_depth, bm25_max_terms, abstain_unknown_names, abstain_period_lookback (null: off) (rag.abstention), routing
-- {enabled, weight, min_score, ratio, max_documents, min_terms, min_concentration, max_share (of the top k one
-- document the query does not name may hold)}. Any it leaves out (all of them, from rag.search) are read from
-- rag.search_settings: the pipeline writes its configured ranking there, and migrate() the configuration's defaults
-- of any option never written (rag_pipeline.store.search). The defaults live in Python only.
CREATE OR REPLACE FUNCTION rag.search_version(
    p_version integer, p_vector halfvec, p_text text, p_labels text[], p_k integer, p_mode text, p_options jsonb
) RETURNS TABLE (
    chunk_id text, doc_id text, source text, path text, page_start integer, page_end integer, section_path text,
    content_type text, text text, prefix text, score double precision, dense_rank bigint, sparse_rank bigint,
    similarity double precision, occurrences bigint, flags text[]
) LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    t text := rag.version_table(p_version);
    use_dense boolean := p_mode IN ('hybrid', 'dense');
    use_sparse boolean := p_mode IN ('hybrid', 'sparse');
    configured jsonb := coalesce((SELECT s.options FROM rag.search_settings s), '{}');
    o jsonb := configured || coalesce(p_options, '{}');
    routing jsonb := coalesce(configured -> 'routing', '{}') || coalesce(p_options -> 'routing', '{}');
    unset text[];
    candidates integer;
    depth integer := (o ->> 'bm25_depth')::integer;
    max_terms integer := (o ->> 'bm25_max_terms')::integer;
    score_floor double precision := (o ->> 'min_similarity')::double precision;
    named text[] := '{}';
    naming_words integer[] := '{}';
    sparse_ids text[] := '{}';
    routed_sparse_ids text[] := '{}';
    exact_dense boolean;
    reach bigint;
    everything bigint;
    sparse_want integer;
    per_document integer;
BEGIN
    IF p_labels IS NULL OR cardinality(p_labels) = 0 THEN
        RAISE EXCEPTION 'a search needs the caller''s labels; there is no unlabelled search'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF p_mode IS NULL OR NOT (use_dense OR use_sparse) THEN
        RAISE EXCEPTION 'mode must be hybrid, dense or sparse, not %', p_mode USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_k IS NULL OR p_k < 1 THEN
        RAISE EXCEPTION 'k must be at least 1' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF use_dense AND p_vector IS NULL THEN
        RAISE EXCEPTION 'mode % needs the query embedding', p_mode USING ERRCODE = 'invalid_parameter_value';
    END IF;
    unset := ARRAY(SELECT name FROM unnest(ARRAY['dense_weight', 'sparse_weight', 'rrf_k', 'page_weight',
                                                 'bm25_depth', 'bm25_max_terms', 'abstain_unknown_names']) AS name
                   WHERE o ->> name IS NULL
                   UNION ALL
                   SELECT 'routing.' || name
                   FROM unnest(ARRAY['enabled', 'weight', 'min_score', 'ratio', 'max_documents', 'min_terms',
                                     'min_concentration', 'max_share']) AS name
                   WHERE routing ->> name IS NULL);
    IF cardinality(unset) > 0 THEN
        RAISE EXCEPTION 'the ranking options % have no value: neither the call nor rag.search_settings sets them '
            '(rag-pipeline migrate writes their defaults there)', unset USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    -- The version's BM25 structures, in the order a rebuild or re-weight locks them (30_bm25_index.sql): a search
    -- that started first finishes first, one that starts during a rebuild waits for it; neither waits in a cycle.
    EXECUTE format('LOCK TABLE %I, %I, %I, %I, %I IN ACCESS SHARE MODE', t || '_bm25_params', t || '_bm25_totals',
                   t || '_bm25_df', t || '_postings', t || '_bm25docs');
    candidates := coalesce((o ->> 'candidates')::integer, greatest(4 * p_k, 40));
    -- rounded first: a share scaled by the caller (k / top_n) must not gain a row from floating point
    per_document := greatest(1, ceil(round(((routing ->> 'max_share')::double precision * p_k)::numeric, 6)))::integer;
    IF NOT use_dense THEN
        score_floor := NULL;  -- the floor is a cosine: nothing to compare without a query vector
    END IF;
    IF (routing ->> 'enabled')::boolean THEN
        SELECT n.named_ids, n.naming_words INTO named, naming_words
            FROM rag.document_names(p_version, p_text, p_labels,
                                    (routing ->> 'min_score')::double precision,
                                    (routing ->> 'ratio')::double precision,
                                    (routing ->> 'max_documents')::integer,
                                    (routing ->> 'min_terms')::integer,
                                    (routing ->> 'min_concentration')::double precision) n;
    END IF;
    -- "No evidence" is an empty answer, not the nearest noise: a name the caller's index does not hold, a period none
    -- of the documents named is of (rag.abstention).
    IF rag.abstention(p_version, p_text, p_labels, named, (o ->> 'abstain_unknown_names')::boolean,
                      (o ->> 'abstain_period_lookback')::integer) IS NOT NULL THEN
        RETURN;
    END IF;
    -- A caller whose labels reach few rows, or a small share of them, gets them ranked exactly: a filtered HNSW walk
    -- visits about candidates / share nodes (measured: ~3 ms / share at 300,000 rows), an exact scan about 1 us per
    -- row the labels reach. So exact when reach^2 < 75 x candidates x rows (at 300,000 rows and 40 candidates, under
    -- a 10% share; 2% went from p95 99 ms through HNSW to 7 ms); candidates counted up to 500, where ef_search stops
    -- growing.
    IF use_dense THEN
        reach := rag.label_rows(p_version, p_labels);
        everything := rag.total_rows(p_version);
        exact_dense := reach < 5000 OR reach::double precision * reach < 75.0 * least(candidates, 500) * everything;
    END IF;
    -- The sparse list alone is the ranking in sparse mode: its top k is all it needs (a deeper list only lowers the
    -- threshold the impact-ordered search prunes with). Fused with another list, it gives `candidates`.
    sparse_want := CASE WHEN NOT use_dense AND cardinality(named) = 0 THEN p_k ELSE candidates END;
    IF use_sparse THEN
        SELECT coalesce(array_agg(b.chunk_id ORDER BY b.n), '{}') INTO sparse_ids
            FROM rag.bm25_ranking(p_version, p_text, p_labels, sparse_want, depth, max_terms)
                 WITH ORDINALITY AS b(chunk_id, score, n);
        IF cardinality(named) > 0 THEN
            SELECT coalesce(array_agg(b.chunk_id ORDER BY b.n), '{}') INTO routed_sparse_ids
                FROM rag.bm25_ranking(p_version, rag.without_words(p_text, naming_words), p_labels, candidates, depth,
                                      max_terms, named)
                     WITH ORDINALITY AS b(chunk_id, score, n);
        END IF;
    END IF;
    -- Iterative scan keeps filtered HNSW queries returning enough rows when few chunks match the labels.
    PERFORM set_config('hnsw.iterative_scan', 'relaxed_order', true);
    PERFORM set_config('hnsw.ef_search',
                       least(1000, coalesce(nullif((o ->> 'ef_search')::integer, 0), greatest(2 * candidates, 100)))::text,
                       true);
    RETURN QUERY EXECUTE format($q$
        WITH dense AS (
            SELECT chunk_id, row_number() OVER (ORDER BY distance, chunk_id) AS rank FROM (
                SELECT chunk_id, embedding <=> $1 AS distance FROM %1$I
                WHERE $2 AND NOT $3 AND acl_labels && $4
                ORDER BY embedding <=> $1 LIMIT $5) AS nearest
            UNION ALL
            SELECT chunk_id, row_number() OVER (ORDER BY distance, chunk_id) FROM (
                -- exact: OFFSET 0 keeps the planner off the HNSW index (the rows come from the labels' GIN index)
                -- and computes each row's distance once (sorting on `(embedding <=> $1) + 0` computed it twice)
                SELECT chunk_id, distance FROM (
                    SELECT chunk_id, embedding <=> $1 AS distance FROM %1$I
                    WHERE $2 AND $3 AND acl_labels && $4 OFFSET 0) AS readable
                ORDER BY distance, chunk_id LIMIT $5) AS exact
        ),
        sparse AS (SELECT chunk_id, rank FROM unnest($6::text[]) WITH ORDINALITY AS s(chunk_id, rank)),
        -- document-aware ranking: the same lists within the documents the query names
        routed_dense AS (
            SELECT chunk_id, row_number() OVER (ORDER BY distance, chunk_id) AS rank FROM (
                SELECT chunk_id, embedding <=> $1 AS distance FROM %1$I
                WHERE $2 AND doc_id = ANY($7) AND acl_labels && $4
                ORDER BY embedding <=> $1 LIMIT $5) AS nearest
        ),
        routed_sparse AS (SELECT chunk_id, rank FROM unnest($8::text[]) WITH ORDINALITY AS s(chunk_id, rank)),
        lists AS (
            SELECT chunk_id, 'dense' AS list, rank, $9 AS weight FROM dense
            UNION ALL SELECT chunk_id, 'sparse', rank, $10 FROM sparse
            UNION ALL SELECT chunk_id, 'routed dense', rank, $11 * $9 FROM routed_dense
            UNION ALL SELECT chunk_id, 'routed sparse', rank, $11 * $10 FROM routed_sparse
        ),
        fused AS (
            SELECT chunk_id, min(rank) FILTER (WHERE list = 'dense') AS dense_rank,
                   min(rank) FILTER (WHERE list = 'sparse') AS sparse_rank, sum(weight / ($16 + rank)) AS score
            FROM lists GROUP BY chunk_id
        ),
        -- pages fused like chunks: each list ranks the pages by their best chunk in it, so a page one list reaches
        -- through one chunk and another list through another gathers both, and a long page gains nothing by length
        page_best AS (
            SELECT l.list, l.weight, v.doc_id, v.page_start, min(l.rank) AS best
            FROM lists l JOIN %1$I v USING (chunk_id) GROUP BY l.list, l.weight, v.doc_id, v.page_start
        ),
        pages AS (
            SELECT doc_id, page_start, sum(weight / ($16 + page_rank)) AS score FROM (
                SELECT *, rank() OVER (PARTITION BY list ORDER BY best) AS page_rank FROM page_best) ranked
            GROUP BY doc_id, page_start
        ),
        ranked AS (
            SELECT t.chunk_id, t.doc_id, doc.source, doc.rel_path, t.page_start, t.page_end, t.section_path,
                   t.content_type, t.text, t.prefix,
                   ((1 - $14) * f.score + $14 * pg.score)::double precision AS score, f.score AS chunk_score,
                   f.dense_rank, f.sparse_rank,
                   CASE WHEN $2 THEN (1 - (t.embedding <=> $1))::double precision END AS similarity,  -- none without a query vector
                   coalesce(owner.flags, '{}') AS flags
            FROM fused f
            JOIN %1$I t USING (chunk_id)
            JOIN pages pg ON pg.doc_id = t.doc_id AND pg.page_start = t.page_start
            JOIN documents doc ON doc.doc_id = t.doc_id
            LEFT JOIN chunks owner ON owner.chunk_id = t.owner_chunk_id
            WHERE t.acl_labels && $4
              -- the score floor: "no good evidence" is an empty answer, not the nearest noise
              AND ($12::double precision IS NULL OR 1 - (t.embedding <=> $1) >= $12)
        ),
        -- at most $15 of the top k from one document the query does not name: the rest of it comes after the others
        capped AS (
            SELECT r.*, row_number() OVER (PARTITION BY r.doc_id ORDER BY r.score DESC, r.chunk_score DESC, r.chunk_id)
                        > $15 AND NOT r.doc_id = ANY($7) AS over
            FROM ranked r
        ),
        top AS (
            SELECT * FROM capped c ORDER BY c.over, c.score DESC, c.chunk_score DESC, c.chunk_id LIMIT $13
        )
        SELECT top.chunk_id, top.doc_id, top.source, top.rel_path, top.page_start, top.page_end, top.section_path,
               top.content_type, top.text, top.prefix, top.score, top.dense_rank, top.sparse_rank, top.similarity,
               -- a near-duplicate group comes back once; this says in how many places (the caller may see) it occurs
               (SELECT count(*) FROM chunks oc JOIN documents od ON od.doc_id = oc.doc_id
                WHERE oc.group_id = top.chunk_id AND od.acl_labels && $4),
               top.flags
        FROM top ORDER BY top.over, top.score DESC, top.chunk_score DESC, top.chunk_id$q$, t)
        USING p_vector, use_dense, exact_dense, p_labels, candidates, sparse_ids, named, routed_sparse_ids,
              (o ->> 'dense_weight')::double precision, (o ->> 'sparse_weight')::double precision,
              (routing ->> 'weight')::double precision, score_floor, p_k, (o ->> 'page_weight')::double precision,
              per_document, (o ->> 'rrf_k')::double precision;
END $$;
