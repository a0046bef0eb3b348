-- The index in applications' hands (issue "read surface"): the search ranking lives here, in the database, so an
-- application can search with SQL alone and the pipeline's own search (rag_pipeline.retrieval) runs the very same
-- functions. Everything applications use is in schema `rag`, whose objects are never dropped or re-created by a
-- promotion or a rollback: GRANTs on them stay.
--
--   rag.search(query_embedding, query_text, labels, k, mode)   the stable entry point (SECURITY DEFINER): the
--       active version, the configured ranking, the label filter inside; the labels a role may pass are bound to it
--       in rag.role_labels, so EXECUTE on it alone lets a role search, and read nothing else.
--   rag.indexed_chunks                                          the reporting view (administrators): every row of
--       the active version with its labels; replaces active_chunks, which each promotion dropped and re-created.
--
-- The internal functions (rag.search_version and the lists it fuses) run with their caller's privileges.

CREATE SCHEMA IF NOT EXISTS rag;

-- Which labels each database role may search with. A role without a row may not search at all. Keyed by the
-- role itself (its OID), not its name: a role dropped and re-created under the same name has no row.
CREATE TABLE rag.role_labels (
    role_name  regrole PRIMARY KEY,
    labels     text[] NOT NULL CHECK (cardinality(labels) > 0 AND array_position(labels, NULL) IS NULL),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- The ranking rag.search runs with: the pipeline writes its configured `retrieval` section here whenever it
-- prepares the database (rag_pipeline.store.search.record_settings), so SQL callers rank as the pipeline does.
CREATE TABLE rag.search_settings (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    options    jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO rag.search_settings (options) VALUES ('{}');

-- The chunk table of a version that is not dropped.
CREATE FUNCTION rag.version_table(p_version integer) RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    found text;
BEGIN
    SELECT v.table_name INTO found FROM index_versions v WHERE v.version_id = p_version AND v.dropped_at IS NULL;
    IF found IS NULL THEN
        RAISE EXCEPTION 'no index version % with a table', p_version USING ERRCODE = 'undefined_table';
    END IF;
    RETURN found;
END $$;

-- At most how many rows the labels reach (the per-label counts the BM25 triggers keep, summed).
CREATE FUNCTION rag.label_rows(p_version integer, p_labels text[]) RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE
    counted bigint;
BEGIN
    EXECUTE format('SELECT coalesce(sum(df), 0) FROM %I WHERE term_id IN '
                   '(SELECT rag_label_term_id(l) FROM unnest($1::text[]) AS l)', rag.version_table(p_version) || '_bm25_df')
        INTO counted USING p_labels;
    RETURN counted;
END $$;

CREATE FUNCTION rag.total_rows(p_version integer) RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE
    counted bigint;
BEGIN
    EXECUTE format('SELECT coalesce(sum(chunks), 0) FROM %I', rag.version_table(p_version) || '_bm25_totals')
        INTO counted;
    RETURN counted;
END $$;

-- The query's terms under every language configuration the version's rows use, with their BM25 idf, rarest
-- first: at most p_max_terms, so a long question's instructions and filler cannot drown its content words (those
-- have the highest idf). Terms no row holds are dropped. The tokenisation is the index's own (rag_lexemes).
CREATE FUNCTION rag.query_terms(p_version integer, p_text text, p_max_terms integer)
RETURNS TABLE (term_id integer, term text, df bigint, idf double precision) LANGUAGE plpgsql STABLE AS $$
DECLARE
    t text := rag.version_table(p_version);
BEGIN
    RETURN QUERY EXECUTE format($q$
        WITH params AS (SELECT configs FROM %1$I),
             totals AS (SELECT coalesce(sum(chunks), 0) AS n FROM %2$I),
             terms AS (
                 SELECT DISTINCT ON (rag_term_id(l.term)) rag_term_id(l.term) AS term_id, l.term
                 FROM params, unnest(params.configs || 'simple'::regconfig) AS cfg, rag_lexemes(cfg, $1) l
                 ORDER BY rag_term_id(l.term), l.term),
             counted AS (
                 SELECT t.term_id, t.term, (SELECT coalesce(sum(d.df), 0) FROM %3$I d
                                            WHERE d.term_id = t.term_id)::bigint AS df
                 FROM terms t)
        SELECT c.term_id, c.term, c.df, ln(1 + (totals.n - c.df + 0.5) / (c.df + 0.5))::double precision AS idf
        FROM counted c, totals WHERE c.df > 0
        ORDER BY idf DESC, c.term_id LIMIT $2$q$, t || '_bm25_params', t || '_bm25_totals', t || '_bm25_df')
        USING p_text, p_max_terms;
END $$;

-- The top p_want chunks by BM25 among those the labels reach (and, given p_documents, of those documents only),
-- best first, ties by chunk id.
--
-- It reads impact-ordered postings: the p_depth highest-weighted postings of each query term (never every match),
-- rescored exactly from each candidate's weight vector. The result is exact whenever no chunk outside the
-- candidates can beat the last one kept: a chunk none of whose postings were read scores at most the sum over
-- terms of idf x the last weight read for that term. When that bound is not met, the two terms whose unread
-- postings could add the most are read four times deeper, up to five rounds; then every row the caller may read
-- is ranked. Callers (or documents) that reach fewer than p_few_rows rows, and queries of only very common terms
-- (in more than a quarter of the rows), have the rows they may read ranked directly.
CREATE FUNCTION rag.bm25_ranking(
    p_version integer, p_text text, p_labels text[], p_want integer, p_depth integer DEFAULT 1000,
    p_max_terms integer DEFAULT 12, p_documents text[] DEFAULT NULL, p_few_rows integer DEFAULT 5000
) RETURNS TABLE (chunk_id text, score double precision) LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    t text := rag.version_table(p_version);
    ids integer[];
    idfs double precision[];
    rarest bigint;
    qvec sparsevec;
    depths integer[];
    pool integer := 2 * p_want;
    bound double precision;
    kept_ids text[];
    kept_scores double precision[];
    slack double precision[];
    slack_terms integer[];
    labelled text;
    impact text;
BEGIN
    IF p_labels IS NULL OR cardinality(p_labels) = 0 THEN
        RAISE EXCEPTION 'a search needs the caller''s labels' USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT array_agg(q.term_id ORDER BY q.term_id), array_agg(q.idf ORDER BY q.term_id), min(q.df)
        INTO ids, idfs, rarest FROM rag.query_terms(p_version, p_text, p_max_terms) q;
    IF ids IS NULL THEN
        RETURN;
    END IF;
    SELECT format('{%s}/1000000000', string_agg(format('%s:%s', u.i, u.f), ',' ORDER BY u.i))::sparsevec
        INTO qvec FROM unnest(ids, idfs) AS u(i, f);
    labelled := format($q$
        SELECT t.chunk_id, -(d.vec <#> $1)::double precision AS score
        FROM %1$I t JOIN %2$I d USING (lexical_id)
        WHERE t.acl_labels && $2 AND ($4::text[] IS NULL OR t.doc_id = ANY($4)) AND -(d.vec <#> $1) > 0
        ORDER BY score DESC, t.chunk_id LIMIT $3$q$, t, t || '_bm25docs');
    IF p_documents IS NOT NULL OR rag.label_rows(p_version, p_labels) < p_few_rows
       OR rarest > 0.25 * rag.total_rows(p_version) THEN
        RETURN QUERY EXECUTE labelled USING qvec, p_labels, p_want, p_documents;
        RETURN;
    END IF;
    impact := format($q$
        WITH q AS (SELECT * FROM unnest($1::integer[], $2::double precision[], $3::integer[]) AS q(term_id, idf, depth)),
        top AS (  -- the highest-weighted postings of each term (an index-only scan of the impact index)
            SELECT q.term_id, q.idf, q.depth, p.lexical_id, p.weight FROM q CROSS JOIN LATERAL (
                SELECT lexical_id, weight FROM %1$I p WHERE p.term_id = q.term_id
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
            SELECT t.chunk_id, -(d.vec <#> $4) AS score
            FROM ranked r JOIN %2$I d USING (lexical_id) JOIN %3$I t USING (lexical_id)
            WHERE r.position <= $5 AND t.acl_labels && $6
            ORDER BY score DESC, t.chunk_id LIMIT $7
        )
        SELECT greatest((SELECT unseen FROM total),
                        coalesce((SELECT max(upper) FROM ranked WHERE position > $5), 0))::double precision,
               (SELECT array_agg((idf * last)::double precision ORDER BY term_id) FROM last),
               (SELECT array_agg(term_id ORDER BY term_id) FROM last),
               (SELECT array_agg(chunk_id ORDER BY score DESC, chunk_id) FROM rescored),
               (SELECT array_agg(score::double precision ORDER BY score DESC, chunk_id) FROM rescored)$q$,
        t || '_postings', t || '_bm25docs', t);
    depths := array_fill(p_depth, ARRAY[cardinality(ids)]);
    FOR attempt IN 1..5 LOOP
        EXECUTE impact INTO bound, slack, slack_terms, kept_ids, kept_scores
            USING ids, idfs, depths, qvec, pool, p_labels, p_want;
        IF (coalesce(cardinality(kept_ids), 0) = p_want AND kept_scores[p_want] >= bound) OR bound = 0 THEN
            RETURN QUERY SELECT k.c, k.s FROM unnest(kept_ids, kept_scores) WITH ORDINALITY AS k(c, s, n) ORDER BY k.n;
            RETURN;
        END IF;
        -- Read deeper where the bound comes from: the terms whose unread postings could add the most.
        SELECT array_agg(CASE WHEN s.term IN (SELECT w.term FROM unnest(slack, slack_terms) AS w(v, term)
                                              WHERE w.v > 0 ORDER BY w.v DESC, w.term LIMIT 2)
                              THEN s.d * 4 ELSE s.d END ORDER BY s.term)
            INTO depths FROM unnest(depths, ids) AS s(d, term);
        pool := pool * 2;
    END LOOP;
    RETURN QUERY EXECUTE labelled USING qvec, p_labels, p_want, p_documents;
END $$;

-- Documents the query names by their title, path or metadata (a company, a period, a form), best first: those
-- scoring at least p_ratio of the best, when the best reaches p_min_score (a sum of name-term idfs) and they are at
-- most p_max_documents. A document is named by at least p_min_terms of its name terms: one word shared with a
-- file name is how topic-named pages match by accident. A query that names a whole family equally names none.
CREATE FUNCTION rag.named_documents(
    p_text text, p_labels text[], p_min_score double precision, p_ratio double precision,
    p_max_documents integer, p_min_terms integer DEFAULT 2, p_cap integer DEFAULT 1000
) RETURNS text[] LANGUAGE plpgsql STABLE AS $$
DECLARE
    best double precision;
    named text[];
BEGIN
    WITH q AS (
        SELECT DISTINCT rag_term_id(l.term) AS term_id
        FROM unnest(ARRAY['english', 'simple']::regconfig[]) AS cfg, rag_lexemes(cfg, p_text) l
    ),
    n AS (  -- the planner's estimate where it has one, else a count (small or never analysed tables)
        SELECT CASE WHEN reltuples >= 10000 THEN reltuples ELSE (SELECT count(*) FROM documents) END AS docs
        FROM pg_class WHERE oid = 'documents'::regclass
    ),
    counted AS (
        SELECT q.term_id, (SELECT count(*) FROM (SELECT 1 FROM documents d WHERE d.name_terms @> ARRAY[q.term_id]
                                                 LIMIT p_cap) x) AS df
        FROM q
    ),
    naming AS (  -- terms that single out documents: held by few of them
        SELECT c.term_id, ln(1 + (n.docs - c.df + 0.5) / (c.df + 0.5)) AS idf FROM counted c, n
        WHERE c.df > 0 AND c.df < p_cap
    ),
    scored AS (
        SELECT d.doc_id, sum(w.idf)::double precision AS score
        FROM documents d JOIN naming w ON d.name_terms @> ARRAY[w.term_id]
        WHERE d.name_terms && (SELECT coalesce(array_agg(naming.term_id), '{}') FROM naming)
          AND d.acl_labels && p_labels
        GROUP BY d.doc_id HAVING count(*) >= p_min_terms ORDER BY score DESC, d.doc_id LIMIT p_max_documents + 1
    )
    SELECT max(s.score), array_agg(s.doc_id ORDER BY s.score DESC, s.doc_id)
               FILTER (WHERE s.score >= p_ratio * (SELECT max(score) FROM scored))
        INTO best, named FROM scored s;
    IF best IS NULL OR best < p_min_score OR cardinality(named) > p_max_documents THEN
        RETURN '{}';
    END IF;
    RETURN named;
END $$;

-- One version's ranking: the dense list (HNSW, or exact over the rows of a caller whose labels reach few), the
-- BM25 list, and with document routing the same two lists within the documents the query names, fused by
-- weighted Reciprocal Rank Fusion; the score floor; a near-duplicate group once, with how many places (the caller
-- may see) it occurs in. p_options (all optional): dense_weight, sparse_weight, candidates, ef_search,
-- min_similarity, bm25_depth, bm25_max_terms, routing {enabled, weight, min_score, ratio, max_documents, min_terms}.
CREATE FUNCTION rag.search_version(
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
    depth integer := coalesce((o ->> 'bm25_depth')::integer, 1000);
    max_terms integer := coalesce((o ->> 'bm25_max_terms')::integer, 12);
    score_floor double precision := (o ->> 'min_similarity')::double precision;
    named text[] := '{}';
    sparse_ids text[] := '{}';
    routed_sparse_ids text[] := '{}';
    exact_dense boolean;
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
    -- A caller whose labels reach few rows gets them ranked exactly (HNSW would walk most of the graph to find them).
    exact_dense := use_dense AND rag.label_rows(p_version, p_labels) < 5000;
    IF use_sparse THEN
        SELECT coalesce(array_agg(b.chunk_id ORDER BY b.n), '{}') INTO sparse_ids
            FROM rag.bm25_ranking(p_version, p_text, p_labels, candidates, depth, max_terms)
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
        WITH readable AS MATERIALIZED (  -- used only when the caller's labels reach few rows: exact, no HNSW
            SELECT chunk_id, embedding FROM %1$I WHERE $2 AND $3 AND acl_labels && $4
        ),
        dense AS (
            SELECT chunk_id, row_number() OVER (ORDER BY distance, chunk_id) AS rank FROM (
                SELECT chunk_id, embedding <=> $1 AS distance FROM %1$I
                WHERE $2 AND NOT $3 AND acl_labels && $4
                ORDER BY embedding <=> $1 LIMIT $5) AS nearest
            UNION ALL
            SELECT chunk_id, row_number() OVER (ORDER BY distance, chunk_id) FROM (
                SELECT chunk_id, embedding <=> $1 AS distance FROM readable
                ORDER BY embedding <=> $1 LIMIT $5) AS exact
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

-- Refuses a caller (the session's login role) that may CREATE in a schema the definer functions resolve names in.
CREATE FUNCTION rag.refuse_writable_search_path() RETURNS void LANGUAGE plpgsql STABLE AS $$
DECLARE
    writable text;
BEGIN
    -- Everything here is schema-qualified: this runs before anything a caller could have planted is ruled out.
    SELECT pg_catalog.string_agg(n.nspname::text, ', ') INTO writable
    FROM pg_catalog.pg_namespace n
    WHERE n.nspname OPERATOR(pg_catalog.=) ANY (pg_catalog.current_schemas(false))
      AND pg_catalog.has_schema_privilege(session_user, n.oid, 'CREATE')
      AND NOT pg_catalog.pg_has_role(session_user, n.nspowner, 'USAGE');
    IF writable IS NOT NULL THEN
        RAISE EXCEPTION 'role % may create objects in schema % that rag.search resolves names in: revoke that '
            '(REVOKE CREATE ON SCHEMA % FROM PUBLIC, %) before it may search', session_user, writable, writable,
            session_user USING ERRCODE = 'insufficient_privilege';
    END IF;
END $$;

-- The stable entry point for applications. Runs as its owner (the pipeline's role), so a caller needs only
-- EXECUTE on it (and USAGE on schema rag). The caller is the session's login role: it must have a row in
-- rag.role_labels, and may pass only labels that row allows (a label it is not allowed is refused, never
-- dropped silently, so a misconfigured application fails loudly instead of quietly seeing less).
CREATE FUNCTION rag.search(
    query_embedding halfvec, query_text text, labels text[], k integer DEFAULT 10, mode text DEFAULT 'hybrid'
) RETURNS TABLE (
    chunk_id text, doc_id text, source text, path text, page_start integer, page_end integer, section_path text,
    content_type text, text text, prefix text, score double precision, dense_rank bigint, sparse_rank bigint,
    similarity double precision, occurrences bigint, flags text[]
) LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    allowed text[];
    refused text[];
    active_id integer;
    active_dims integer;
BEGIN
    -- A caller that may create objects where this function resolves names could plant an operator or function
    -- that runs with the owner's rights (an exact-type `&&` beats pg_catalog's): such a caller is refused.
    PERFORM rag.refuse_writable_search_path();
    SELECT r.labels INTO allowed FROM rag.role_labels r WHERE r.role_name = session_user::regrole;
    IF allowed IS NULL THEN
        RAISE EXCEPTION 'role % may not search: it has no row in rag.role_labels', session_user
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF labels IS NULL OR cardinality(labels) = 0 OR array_position(labels, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'a search needs the caller''s labels; there is no unlabelled search'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT array_agg(l) INTO refused FROM unnest(labels) AS l WHERE NOT l = ANY(allowed);
    IF refused IS NOT NULL THEN
        RAISE EXCEPTION 'role % may not search with labels %', session_user, refused
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF k IS NULL OR k < 1 OR k > 1000 THEN
        RAISE EXCEPTION 'k must be between 1 and 1000, not %', k USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF query_text IS NULL OR btrim(query_text) = '' OR length(query_text) > 10000 THEN
        RAISE EXCEPTION 'query_text must be 1 to 10000 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT v.version_id, v.dimensions INTO active_id, active_dims
        FROM index_alias a JOIN index_versions v USING (version_id) WHERE a.alias = 'active';
    IF active_id IS NULL THEN
        RAISE EXCEPTION 'there is no active index version yet' USING ERRCODE = 'undefined_table';
    END IF;
    IF query_embedding IS NOT NULL AND vector_dims(query_embedding) <> active_dims THEN
        RAISE EXCEPTION 'query_embedding has % dimensions; the active index version (%) holds %',
            vector_dims(query_embedding), active_id, active_dims USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY SELECT * FROM rag.search_version(active_id, query_embedding, query_text, labels, k, mode,
                                                  (SELECT s.options FROM rag.search_settings s));
END $$;

-- Every row of the active version, with its labels: for administrators' reports (GRANT SELECT on the view and
-- EXECUTE on the function). Never re-created, so GRANTs and views built on it survive promotions.
CREATE FUNCTION rag.active_rows() RETURNS TABLE (
    version_id integer, chunk_id text, owner_chunk_id text, doc_id text, source text, path text, ordinal integer,
    section_path text, page_start integer, page_end integer, content_type text, text text, prefix text,
    acl_labels text[], embedding_input_sha text
) LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
DECLARE
    active_id integer;
BEGIN
    PERFORM rag.refuse_writable_search_path();
    SELECT a.version_id INTO active_id FROM index_alias a WHERE a.alias = 'active';
    IF active_id IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY EXECUTE format(
        'SELECT $1, t.chunk_id, t.owner_chunk_id, t.doc_id, d.source, d.rel_path, t.ordinal, t.section_path,
                t.page_start, t.page_end, t.content_type, t.text, t.prefix, t.acl_labels, t.embedding_input_sha
         FROM %I t JOIN documents d USING (doc_id)', rag.version_table(active_id))
        USING active_id;
END $$;

CREATE VIEW rag.indexed_chunks AS SELECT * FROM rag.active_rows();

-- Functions are executable by PUBLIC unless revoked: only what is granted explicitly may run, now and later.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA rag FROM PUBLIC;
ALTER DEFAULT PRIVILEGES IN SCHEMA rag REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;

-- The definer functions resolve names only in the schema the pipeline's tables are in (and pgvector's), never in a
-- caller's temporary schema.
DO $$
DECLARE
    path text := format('%I, %I, pg_temp', current_schema(),
                        (SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
                         WHERE e.extname = 'vector'));
BEGIN
    EXECUTE format('ALTER FUNCTION rag.search(halfvec, text, text[], integer, text) SET search_path = %s', path);
    EXECUTE format('ALTER FUNCTION rag.active_rows() SET search_path = %s', path);
END $$;

DROP VIEW IF EXISTS active_chunks;

-- The latest outcome of each index check (asset checks and `rag-pipeline checks`), for the search service's
-- readiness report: applications see whether the index they read is being kept true.
CREATE TABLE check_results (
    check_name text PRIMARY KEY,
    passed     boolean NOT NULL,
    summary    text NOT NULL,
    checked_at timestamptz NOT NULL DEFAULT now()
);
