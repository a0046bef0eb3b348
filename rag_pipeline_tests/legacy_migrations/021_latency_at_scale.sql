-- Retrieval latency at scale (issue "retrieval"), measured on the benchmark's 300,000-chunk Zipf index:
--
-- rag.bm25_ranking (replaced in place; signature, result and privileges kept):
--   * a term whose postings list is at most twice the depth is read whole. The depth used to cut such lists just
--     short of their end: their last weight read stayed in every chunk's bound, and thousands of candidates were
--     rescored (one query: 6,196 candidates at depth 8,000 for a list of 8,240; 916 when it is read whole);
--   * the first exact scoring takes 4 x want candidates (was 2 x): a threshold closer to the final one;
--   * candidates, and the rows of callers ranked directly, are scored in key order (a fifth to a quarter faster);
--     candidates by a lookup each, and the function plans with random_page_cost 1.1 (its structures are in memory):
--     at the default, a fresh 100,000-row index's 2% caller was ranked by a scan of every weight vector;
--   * callers whose labels reach fewer rows than p_few_rows beyond twice the candidates the impact path would
--     check for them are ranked directly (scoring a readable row costs about what checking a candidate does): 2% of
--     300,000 rows went through the impact path at want 10 (p95 67 ms) and is now ranked directly (19 ms).
-- rag.search_version (replaced in place):
--   * in sparse mode without named documents the BM25 list is asked for k rows, not the fusion depth;
--   * the dense list is exact also when the caller's labels reach a small share of the rows (see below), through
--     the labels' GIN index instead of a materialised copy of the rows (which spilled to disk);
--   * the bm25_depth fallback is the configured default, 4000.

CREATE OR REPLACE FUNCTION rag.bm25_ranking(
    p_version integer, p_text text, p_labels text[], p_want integer, p_depth integer DEFAULT 4000,
    p_max_terms integer DEFAULT 12, p_documents text[] DEFAULT NULL, p_few_rows integer DEFAULT 5000
) RETURNS TABLE (chunk_id text, score double precision) LANGUAGE plpgsql STABLE
-- A version's postings and weight vectors are meant to be in memory (see the README on sizing the server): lookups
-- by key cost about what reading a row in sequence does, and the plans must not swing to scanning everything.
SET random_page_cost = 1.1 AS $$
#variable_conflict use_column
DECLARE
    t text := rag.version_table(p_version);
    ids integer[];
    idfs double precision[];
    dfs bigint[];
    rarest bigint;
    top_idf double precision;
    qvec sparsevec;
    depths integer[];
    reach bigint;
    everything bigint;
    pool integer;
    unseen double precision;
    slack double precision[];
    kept_ids text[];
    kept_scores double precision[];
    labelled text;
    impact text;
BEGIN
    IF p_labels IS NULL OR cardinality(p_labels) = 0 THEN
        RAISE EXCEPTION 'a search needs the caller''s labels' USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT array_agg(q.term_id ORDER BY q.term_id), array_agg(q.idf ORDER BY q.term_id),
           array_agg(q.df ORDER BY q.term_id), min(q.df), max(q.idf)
        INTO ids, idfs, dfs, rarest, top_idf FROM rag.query_terms(p_version, p_text, p_max_terms) q;
    IF ids IS NULL THEN
        RETURN;
    END IF;
    SELECT format('{%s}/1000000000', string_agg(format('%s:%s', u.i, u.f), ',' ORDER BY u.i))::sparsevec
        INTO qvec FROM unnest(ids, idfs) AS u(i, f);
    reach := rag.label_rows(p_version, p_labels);
    everything := rag.total_rows(p_version);
    -- The rows the caller may read, ranked directly. When they are a small part of the index (or of named documents)
    -- their weights are looked up by key, in key order; when they are a large part, the planner may scan the weight
    -- vectors once instead. (The function's random_page_cost says the structures are in memory: at the default,
    -- the planner scanned every weight vector for a caller reaching 2,000 of 100,000 rows when its estimates
    -- tipped, p95 8 -> 64 ms.)
    IF p_documents IS NOT NULL OR 4 * reach < everything THEN
        labelled := format($q$
            SELECT r.chunk_id, -(d.vec <#> $1)::double precision AS score
            FROM (SELECT chunk_id, lexical_id FROM %1$I
                  WHERE acl_labels && $2 AND ($4::text[] IS NULL OR doc_id = ANY($4))
                  ORDER BY lexical_id OFFSET 0) r
            JOIN %2$I d USING (lexical_id)
            WHERE -(d.vec <#> $1) > 0
            ORDER BY score DESC, r.chunk_id LIMIT $3$q$, t, t || '_bm25docs');
    ELSE
        labelled := format($q$
            SELECT t.chunk_id, -(d.vec <#> $1)::double precision AS score
            FROM %1$I t JOIN %2$I d USING (lexical_id)
            WHERE t.acl_labels && $2 AND ($4::text[] IS NULL OR t.doc_id = ANY($4)) AND -(d.vec <#> $1) > 0
            ORDER BY score DESC, t.chunk_id LIMIT $3$q$, t, t || '_bm25docs');
    END IF;
    -- Labels that reach a share of the rows: as many times more of the best candidates are checked first.
    -- (Overlapping labels are counted once per label, so the reach can exceed the rows.)
    pool := greatest(4 * p_want, least(20000, ceil(2.0 * p_want * everything / greatest(reach, 1))))::integer;
    -- Ranked directly: the rows of named documents; queries of only very common terms; and callers whose labels
    -- reach few rows: fewer than p_few_rows beyond twice the candidates the impact path would check for them
    -- (scoring a readable row directly costs about what checking one candidate does). p_few_rows = 0 never does.
    IF p_documents IS NOT NULL OR rarest > 0.25 * everything OR (p_few_rows > 0 AND reach < p_few_rows + 2 * pool) THEN
        RETURN QUERY EXECUTE labelled USING qvec, p_labels, p_want, p_documents;
        RETURN;
    END IF;
    -- A term whose idf is under a tenth of the query's highest adds little to any score: its highest weight (one
    -- posting) bounds it. The others are read p_depth deep, or whole when at most twice that: cutting a list just
    -- short of its end leaves its last weight in the bound of every chunk read elsewhere, for little saved.
    SELECT array_agg(CASE WHEN u.f < 0.1 * top_idf THEN 1 WHEN u.n <= 2 * p_depth THEN u.n + 1 ELSE p_depth END
                     ORDER BY u.i)
        INTO depths FROM unnest(ids, idfs, dfs) AS u(i, f, n);
    impact := format($q$
        WITH q AS (SELECT * FROM unnest($1::integer[], $2::double precision[], $3::integer[]) AS q(term_id, idf, depth)),
        top AS (  -- the highest-weighted postings of each term (an index-only scan of the impact index)
            SELECT q.term_id, q.idf, q.depth, p.lexical_id, p.weight FROM q CROSS JOIN LATERAL (
                SELECT lexical_id, weight FROM %1$I p WHERE p.term_id = q.term_id
                ORDER BY weight DESC LIMIT q.depth) p
        ),
        last AS (  -- per term, what a chunk none of whose postings was read can get from it at most
            SELECT term_id, idf * CASE WHEN count(*) < depth THEN 0 ELSE min(weight) END AS slack FROM top
            GROUP BY term_id, idf, depth
        ),
        total AS (SELECT coalesce(sum(slack), 0) AS unseen FROM last),
        bounded AS MATERIALIZED (  -- each chunk read scores at most its weights read plus the others' slack
            SELECT top.lexical_id, sum(top.idf * top.weight - l.slack) + total.unseen AS upper
            FROM top JOIN last l USING (term_id), total GROUP BY top.lexical_id, total.unseen
        ),
        first AS MATERIALIZED (  -- exact scores of the candidates with the highest bounds (looked up by key, as below)
            SELECT b.lexical_id, (SELECT -(d.vec <#> $4) FROM %2$I d WHERE d.lexical_id = b.lexical_id) AS score
            FROM (SELECT lexical_id FROM bounded ORDER BY upper DESC, lexical_id LIMIT $5) b
        ),
        first_kept AS MATERIALIZED (
            SELECT t.chunk_id, f.score FROM first f JOIN %3$I t USING (lexical_id)
            WHERE t.acl_labels && $6 ORDER BY f.score DESC, t.chunk_id LIMIT $7
        ),
        threshold AS (SELECT CASE WHEN count(*) = $7 THEN min(score) ELSE 0 END AS theta FROM first_kept),
        rest AS MATERIALIZED (  -- every other chunk whose bound reaches the k-th exact score so far, scored exactly
            SELECT b.lexical_id, (SELECT -(d.vec <#> $4) FROM %2$I d WHERE d.lexical_id = b.lexical_id) AS score
            FROM (SELECT b.lexical_id FROM bounded b, threshold
                  -- (the bounds are double precision, the exact scores pgvector's float: a hair of tolerance for ties)
                  WHERE b.upper * (1 + 1e-5) >= threshold.theta AND b.lexical_id NOT IN (SELECT lexical_id FROM first)
                  ORDER BY b.lexical_id OFFSET 0) b  -- looked up in key order: a quarter faster than in bound order
        ),
        kept AS (
            SELECT chunk_id, score FROM (
                SELECT chunk_id, score FROM first_kept
                UNION ALL
                SELECT t.chunk_id, r.score FROM rest r JOIN %3$I t USING (lexical_id), threshold
                WHERE r.score >= threshold.theta AND t.acl_labels && $6) AS u
            ORDER BY score DESC, chunk_id LIMIT $7
        )
        SELECT (SELECT unseen FROM total)::double precision,
               (SELECT array_agg(slack::double precision ORDER BY term_id) FROM last),
               (SELECT array_agg(chunk_id ORDER BY score DESC, chunk_id) FROM kept),
               (SELECT array_agg(score::double precision ORDER BY score DESC, chunk_id) FROM kept)$q$,
        t || '_postings', t || '_bm25docs', t);
    FOR attempt IN 1..4 LOOP
        EXECUTE impact INTO unseen, slack, kept_ids, kept_scores USING ids, idfs, depths, qvec, pool, p_labels, p_want;
        -- Exact when no chunk left unread can beat the last one kept (or nothing was left unread).
        -- (strictly above: an unread chunk that ties the last one kept could win the tie on its chunk id)
        IF unseen = 0 OR (coalesce(cardinality(kept_ids), 0) = p_want AND kept_scores[p_want] > unseen * (1 + 1e-5)) THEN
            RETURN QUERY SELECT k.c, k.s FROM unnest(kept_ids, kept_scores) WITH ORDINALITY AS k(c, s, n) ORDER BY k.n;
            RETURN;
        END IF;
        -- Read deeper where the bound comes from: the two terms whose unread postings could add the most.
        SELECT array_agg(CASE WHEN s.term IN (SELECT w.term FROM unnest(slack, ids) AS w(v, term)
                                              WHERE w.v > 0 ORDER BY w.v DESC, w.term LIMIT 2)
                              THEN greatest(s.d * 4, p_depth) ELSE s.d END ORDER BY s.term)
            INTO depths FROM unnest(depths, ids) AS s(d, term);
    END LOOP;
    RETURN QUERY EXECUTE labelled USING qvec, p_labels, p_want, p_documents;
END $$;

-- One version's ranking: the dense list (HNSW, or exact over the rows of a caller whose labels reach few), the
-- BM25 list, and with document routing the same two lists within the documents the query names, fused by
-- weighted Reciprocal Rank Fusion; the score floor; a near-duplicate group once, with how many places (the caller
-- may see) it occurs in. p_options (all optional): dense_weight, sparse_weight, candidates, ef_search,
-- min_similarity, bm25_depth, bm25_max_terms, routing {enabled, weight, min_score, ratio, max_documents, min_terms}.
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
    o jsonb := coalesce(p_options, '{}');
    routing jsonb := coalesce(p_options -> 'routing', '{}');
    candidates integer;
    depth integer := coalesce((o ->> 'bm25_depth')::integer, 4000);
    max_terms integer := coalesce((o ->> 'bm25_max_terms')::integer, 12);
    score_floor double precision := (o ->> 'min_similarity')::double precision;
    named text[] := '{}';
    sparse_ids text[] := '{}';
    routed_sparse_ids text[] := '{}';
    exact_dense boolean;
    reach bigint;
    everything bigint;
    sparse_want integer;
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
    candidates := coalesce((o ->> 'candidates')::integer, greatest(4 * p_k, 40));
    IF NOT use_dense THEN
        score_floor := NULL;  -- the floor is a cosine: nothing to compare without a query vector
    END IF;
    IF coalesce((routing ->> 'enabled')::boolean, false) THEN
        named := rag.named_documents(p_text, p_labels, coalesce((routing ->> 'min_score')::double precision, 2.0),
                                     coalesce((routing ->> 'ratio')::double precision, 0.75),
                                     coalesce((routing ->> 'max_documents')::integer, 5),
                                     coalesce((routing ->> 'min_terms')::integer, 2));
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
                FROM rag.bm25_ranking(p_version, p_text, p_labels, candidates, depth, max_terms, named)
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
                -- exact: `+ 0` keeps the planner off the HNSW index (the rows come from the labels' GIN index)
                SELECT chunk_id, embedding <=> $1 AS distance FROM %1$I
                WHERE $2 AND $3 AND acl_labels && $4
                ORDER BY (embedding <=> $1) + 0 LIMIT $5) AS exact
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
            SELECT chunk_id, rank AS dense_rank, NULL::bigint AS sparse_rank, $9 / (60 + rank) AS score FROM dense
            UNION ALL SELECT chunk_id, NULL, rank, $10 / (60 + rank) FROM sparse
            UNION ALL SELECT chunk_id, NULL, NULL, $11 * $9 / (60 + rank) FROM routed_dense
            UNION ALL SELECT chunk_id, NULL, NULL, $11 * $10 / (60 + rank) FROM routed_sparse
        ),
        fused AS (
            SELECT chunk_id, min(dense_rank) AS dense_rank, min(sparse_rank) AS sparse_rank, sum(score) AS score
            FROM lists GROUP BY chunk_id
        )
        SELECT t.chunk_id, t.doc_id, doc.source, doc.rel_path, t.page_start, t.page_end, t.section_path,
               t.content_type, t.text, t.prefix, f.score::double precision, f.dense_rank, f.sparse_rank,
               CASE WHEN $2 THEN (1 - (t.embedding <=> $1))::double precision END,  -- none without a query vector
               -- a near-duplicate group comes back once; this says in how many places (the caller may see) it occurs
               (SELECT count(*) FROM chunks oc JOIN documents od ON od.doc_id = oc.doc_id
                WHERE oc.group_id = t.chunk_id AND od.acl_labels && $4),
               coalesce(owner.flags, '{}')
        FROM fused f
        JOIN %1$I t USING (chunk_id)
        JOIN documents doc ON doc.doc_id = t.doc_id
        LEFT JOIN chunks owner ON owner.chunk_id = t.owner_chunk_id
        WHERE t.acl_labels && $4
          -- the score floor: "no good evidence" is an empty answer, not the nearest noise
          AND ($12::double precision IS NULL OR 1 - (t.embedding <=> $1) >= $12)
        ORDER BY f.score DESC, t.chunk_id
        LIMIT $13$q$, t)
        USING p_vector, use_dense, exact_dense, p_labels, candidates, sparse_ids, named, routed_sparse_ids,
              coalesce((o ->> 'dense_weight')::double precision, 1.0),
              coalesce((o ->> 'sparse_weight')::double precision, 1.0),
              coalesce((routing ->> 'weight')::double precision, 0.5), score_floor, p_k;
END $$;
