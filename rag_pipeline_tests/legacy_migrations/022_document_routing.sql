-- Document routing that tells a name from a topic (issue "retrieval"), on by default.
--
-- rag.named_documents used to count a document as named when the query shared two name *terms* with it. Every
-- word gives two terms (its English stem and its neutral form), so one word shared with a file name was enough,
-- and on topic-named pages ("sql-create-access-method.html", "runtime-config-query.html") "create" or "query"
-- routed 63 of the PostgreSQL-manual golden questions, 45 of them to the wrong page. Now:
--   * a query is read word by word; stop words name nothing; a word also counts squashed, and two adjacent words
--     written as one, because file names squash names ("COCACOLA_2021_10K", "AMERICANEXPRESS_2022_10K",
--     "sql-createtable.html");
--   * a word identifies documents only when its name is rare among documents and its text is concentrated in
--     them: of the chunks where the word weighs most (its top 200 postings), at least p_min_concentration lie in
--     documents whose names carry it. A company's name is said mostly in its own filings; "create" is said on
--     every page. A word only names carry (no chunk has it) identifies too;
--   * a document is named through at least one identifying word; words concentrated at least half as much (a
--     period: "2018" is also said in the 2019 filing) add their idf to its score; at least p_min_terms distinct
--     query words must match.
--   On the manual this routes 14 questions, 12 of them to a right page.
-- rag.search_version (replaced in place): calls it with the version; routing is on unless the options say
-- otherwise; the BM25 list within the named documents leaves out the words that named them.

DROP FUNCTION rag.named_documents(text, text[], double precision, double precision, integer, integer, integer);

-- The term ids a piece of text gives a document name (rag_name_terms' configurations), English stop words left
-- out (the neutral configuration keeps "the", "of" and the "s" of "Lowe's"): to compare query words with names.
-- Separate functions, not inlined, keep rag.named_documents cheap to plan.
CREATE FUNCTION rag.name_term_ids(p_text text) RETURNS integer[] LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(DISTINCT rag_term_id(l.term)), '{}')
    FROM unnest(ARRAY['english', 'simple']::regconfig[]) AS cfg, rag_lexemes(cfg, p_text) l
    WHERE coalesce(cardinality(ts_lexize('english_stem', l.term)), 1) > 0
$$;

CREATE FUNCTION rag.is_stop_word(p_word text) RETURNS boolean LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT NOT EXISTS (SELECT 1 FROM rag_lexemes('english', p_word))
$$;

-- Of the chunks where p_words weigh most (the top 200 postings of their terms in the version, stop words left
-- out), the share that lie in documents whose names carry one of p_name_terms; NULL when no chunk holds the words.
CREATE FUNCTION rag.name_concentration(p_version integer, p_words text[], p_name_terms integer[])
RETURNS double precision LANGUAGE plpgsql STABLE AS $$
DECLARE
    t text := rag.version_table(p_version);
    share double precision;
BEGIN
    EXECUTE format($q$
        SELECT avg((d.name_terms && $2)::integer) FROM (
            SELECT p.lexical_id FROM (
                SELECT DISTINCT rag_term_id(l.term) AS term_id
                FROM %2$I params, unnest(params.configs || 'simple'::regconfig) AS cfg, unnest($1) AS w,
                     rag_lexemes(cfg, w) l
                WHERE coalesce(cardinality(ts_lexize('english_stem', l.term)), 1) > 0) ct,
            LATERAL (SELECT lexical_id, weight FROM %3$I WHERE term_id = ct.term_id ORDER BY weight DESC LIMIT 200) p
            ORDER BY p.weight DESC LIMIT 200) top
        JOIN %1$I v ON v.lexical_id = top.lexical_id JOIN documents d ON d.doc_id = v.doc_id$q$,
        t, t || '_bm25_params', t || '_postings')
        INTO share USING p_words, p_name_terms;
    RETURN share;
END $$;

-- The documents a query names (best first) and the positions of the query words that named them (1-based,
-- whitespace-separated words): see the head of this file for when a document counts as named.
CREATE FUNCTION rag.document_names(
    p_version integer, p_text text, p_labels text[], p_min_score double precision, p_ratio double precision,
    p_max_documents integer, p_min_terms integer DEFAULT 1, p_min_concentration double precision DEFAULT 0.5,
    p_cap integer DEFAULT 1000, OUT named_ids text[], OUT naming_words integer[]
) LANGUAGE plpgsql STABLE AS $$
DECLARE
    best double precision;
    squashed text[] := (SELECT array_agg(regexp_replace(w.word, '[^[:alnum:]]+', '', 'g') ORDER BY w.n)
                        FROM regexp_split_to_table(p_text, '\s+') WITH ORDINALITY AS w(word, n));
BEGIN
    named_ids := '{}';
    naming_words := '{}';
    -- Most queries name nothing: one look at the names' index, with every form a word is compared in below, before
    -- reading the query word by word (3 ms a query at 100,000 chunks when no name shares a word with it).
    IF NOT EXISTS (
        SELECT 1 FROM documents d
        WHERE d.name_terms && rag.name_term_ids(concat_ws(' ', p_text, array_to_string(squashed, ' '),
                                                          (SELECT string_agg(squashed[i] || squashed[i + 1], ' ')
                                                           FROM generate_subscripts(squashed, 1) AS i
                                                           WHERE i < cardinality(squashed))))
    ) THEN
        RETURN;
    END IF;
    WITH words AS (  -- stop words name nothing; a query's first 256 words are read for names (bounded work)
        SELECT w.n, w.word FROM regexp_split_to_table(p_text, '\s+') WITH ORDINALITY AS w(word, n)
        WHERE w.n <= 256 AND w.word <> '' AND NOT rag.is_stop_word(w.word)
    ),
    forms AS (  -- each word (also squashed: Coca-Cola, COCACOLA), and each two adjacent words written as one
        SELECT ARRAY[w.n] AS positions,
               rag.name_term_ids(w.word || ' ' || regexp_replace(w.word, '[^[:alnum:]]+', '', 'g')) AS terms,
               ARRAY[w.word] AS words
        FROM words w
        UNION ALL
        SELECT ARRAY[a.n, b.n], rag.name_term_ids(regexp_replace(a.word || b.word, '[^[:alnum:]]+', '', 'g')),
               ARRAY[a.word, b.word]
        FROM words a JOIN words b ON b.n = a.n + 1
    ),
    units AS (  -- a word said twice counts once (its first place)
        SELECT DISTINCT ON (f.terms) f.* FROM forms f WHERE f.terms <> '{}' ORDER BY f.terms, f.positions
    ),
    n AS (  -- the planner's estimate where it has one, else a count (small or never analysed tables)
        SELECT CASE WHEN reltuples >= 10000 THEN reltuples ELSE (SELECT count(*) FROM documents) END AS docs
        FROM pg_class WHERE oid = 'documents'::regclass
    ),
    term_df AS (
        SELECT t.term_id, (SELECT count(*) FROM (SELECT 1 FROM documents d WHERE d.name_terms @> ARRAY[t.term_id]
                                                  LIMIT p_cap) c) AS df
        FROM (SELECT DISTINCT unnest(u.terms) AS term_id FROM units u) t
    ),
    naming AS (  -- each unit's name terms that some documents hold but not too many, with their idf
        SELECT u.positions, u.words, x.term_id, ln(1 + (n.docs - df.df + 0.5) / (df.df + 0.5)) AS idf
        FROM units u, unnest(u.terms) AS x(term_id), term_df df, n
        WHERE df.term_id = x.term_id AND df.df > 0 AND df.df < p_cap
    ),
    -- MATERIALIZED: once per unit, not once per document it matches. A word no chunk holds (only names carry it)
    -- competes with nothing: it identifies.
    concentrated AS MATERIALIZED (
        SELECT g.positions, coalesce(rag.name_concentration(p_version, g.words, g.terms), 1.0) AS share
        FROM (SELECT positions, min(words) AS words, array_agg(term_id) AS terms FROM naming GROUP BY positions) g
    ),
    matches AS (  -- each readable document, the units its name shares with the query, and the best idf it holds
        SELECT d.doc_id, nm.positions, max(nm.idf) AS idf, c.share
        FROM naming nm JOIN concentrated c ON c.positions = nm.positions
        JOIN documents d ON d.name_terms @> ARRAY[nm.term_id]
        WHERE c.share >= p_min_concentration / 2 AND d.acl_labels && p_labels
        GROUP BY d.doc_id, nm.positions, c.share
    ),
    identified AS (  -- a name most documents carry (idf < 1) names none
        SELECT DISTINCT m.doc_id FROM matches m WHERE m.share >= p_min_concentration AND m.idf >= 1.0
    ),
    kept AS (  -- a word inside a matching two-word unit is counted with it, once
        SELECT m.* FROM matches m JOIN identified i ON i.doc_id = m.doc_id
        WHERE cardinality(m.positions) = 2 OR NOT EXISTS (
            SELECT 1 FROM matches o WHERE o.doc_id = m.doc_id AND cardinality(o.positions) = 2
                                      AND o.positions @> m.positions)
    ),
    scored AS (
        SELECT k.doc_id, sum(k.idf)::double precision AS score FROM kept k GROUP BY k.doc_id
        HAVING (SELECT count(DISTINCT p) FROM kept k2, unnest(k2.positions) p WHERE k2.doc_id = k.doc_id)
               >= p_min_terms
        ORDER BY score DESC, k.doc_id LIMIT p_max_documents + 1
    ),
    chosen AS (
        SELECT s.doc_id, s.score FROM scored s WHERE s.score >= p_ratio * (SELECT max(score) FROM scored)
    )
    SELECT (SELECT max(score) FROM scored),
           (SELECT array_agg(c.doc_id ORDER BY c.score DESC, c.doc_id) FROM chosen c),
           (SELECT coalesce(array_agg(DISTINCT p ORDER BY p), '{}')
            FROM kept k, unnest(k.positions) p WHERE k.doc_id IN (SELECT doc_id FROM chosen))
        INTO best, named_ids, naming_words;
    IF best IS NULL OR best < p_min_score OR cardinality(named_ids) > p_max_documents THEN
        named_ids := '{}';
        naming_words := '{}';
    END IF;
END $$;

CREATE FUNCTION rag.named_documents(
    p_version integer, p_text text, p_labels text[], p_min_score double precision, p_ratio double precision,
    p_max_documents integer, p_min_terms integer DEFAULT 1, p_min_concentration double precision DEFAULT 0.5,
    p_cap integer DEFAULT 1000
) RETURNS text[] LANGUAGE sql STABLE AS $$
    SELECT named_ids FROM rag.document_names(p_version, p_text, p_labels, p_min_score, p_ratio, p_max_documents,
                                             p_min_terms, p_min_concentration, p_cap)
$$;

-- The query without the words at p_positions (whitespace-separated, 1-based): the words that named the documents
-- a list is ranked within, where every chunk is the company's and the period's, so they rank nothing there.
CREATE FUNCTION rag.without_words(p_text text, p_positions integer[]) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(string_agg(w.word, ' ' ORDER BY w.n), '')
    FROM regexp_split_to_table(p_text, '\s+') WITH ORDINALITY AS w(word, n)
    WHERE NOT w.n = ANY(p_positions)
$$;

REVOKE EXECUTE ON FUNCTION rag.name_term_ids(text), rag.is_stop_word(text), rag.without_words(text, integer[]),
                           rag.name_concentration(integer, text[], integer[]),
                           rag.document_names(integer, text, text[], double precision, double precision, integer,
                                              integer, double precision, integer),
                           rag.named_documents(integer, text, text[], double precision, double precision, integer,
                                               integer, double precision, integer) FROM PUBLIC;

-- One version's ranking: the dense list (HNSW, or exact over the rows of a caller whose labels reach few), the
-- BM25 list, and with document routing the same two lists within the documents the query names, fused by
-- weighted Reciprocal Rank Fusion; the score floor; a near-duplicate group once, with how many places (the caller
-- may see) it occurs in. p_options (all optional): dense_weight, sparse_weight, candidates, ef_search,
-- min_similarity, bm25_depth, bm25_max_terms, routing {enabled, weight, min_score, ratio, max_documents, min_terms,
-- min_concentration}.
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
    naming_words integer[] := '{}';
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
    IF coalesce((routing ->> 'enabled')::boolean, true) THEN
        SELECT n.named_ids, n.naming_words INTO named, naming_words
            FROM rag.document_names(p_version, p_text, p_labels,
                                    coalesce((routing ->> 'min_score')::double precision, 2.0),
                                    coalesce((routing ->> 'ratio')::double precision, 0.75),
                                    coalesce((routing ->> 'max_documents')::integer, 5),
                                    coalesce((routing ->> 'min_terms')::integer, 1),
                                    coalesce((routing ->> 'min_concentration')::double precision, 0.5)) n;
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
