-- BM25 ranking that settles in one pass (issue "retrieval": latency). Migration 019's rag.bm25_ranking rescored a
-- fixed pool (2 x want) of the candidates with the highest bounds and, when a candidate outside the pool could still
-- win, read deeper and started again: at 100,000 chunks with a Zipfian vocabulary most queries took two or three
-- passes (p95 56 ms). Now, in one statement:
--   1. read the impact-ordered postings of each query term: p_depth deep, or the whole list when shorter; a term
--      whose idf is under a tenth of the query's highest only to its first posting (its highest weight bounds it:
--      such a term adds little to any score and its list is among the longest);
--   2. bound every chunk read (its weights read plus, for each other term, the last weight read of it) and every
--      chunk not read (the sum of those last weights);
--   3. score exactly the candidates with the highest bounds (more of them when the caller's labels reach a small
--      share of the rows) and keep the best p_want the caller may read: the k-th of them is a threshold;
--   4. score exactly every other candidate whose bound reaches the threshold, and keep the best p_want of all.
-- The result is exact when no chunk left unread can reach the last one kept; otherwise the two terms whose unread
-- postings could add the most are read four times deeper (at most four passes), then every readable row is ranked.
-- Unchanged: the signature and result, and the direct ranking of queries of only very common terms and of the rows
-- of named documents. Callers whose labels reach few rows are ranked directly as before, and now also when their
-- share is so small that checking labels would cost more than ranking their rows. Privileges carry over.

CREATE OR REPLACE FUNCTION rag.bm25_ranking(
    p_version integer, p_text text, p_labels text[], p_want integer, p_depth integer DEFAULT 4000,
    p_max_terms integer DEFAULT 12, p_documents text[] DEFAULT NULL, p_few_rows integer DEFAULT 5000
) RETURNS TABLE (chunk_id text, score double precision) LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    t text := rag.version_table(p_version);
    ids integer[];
    idfs double precision[];
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
    SELECT array_agg(q.term_id ORDER BY q.term_id), array_agg(q.idf ORDER BY q.term_id), min(q.df), max(q.idf)
        INTO ids, idfs, rarest, top_idf FROM rag.query_terms(p_version, p_text, p_max_terms) q;
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
    reach := rag.label_rows(p_version, p_labels);
    everything := rag.total_rows(p_version);
    -- Ranked directly: the rows of named documents; queries of only very common terms; and callers whose labels
    -- reach few rows: fewer than p_few_rows, or so small a share that checking the labels of the best candidates
    -- would cost more (about 2 x p_want / share candidates, against the reach itself). p_few_rows = 0 never does.
    IF p_documents IS NOT NULL OR rarest > 0.25 * everything
       OR (p_few_rows > 0 AND (reach < p_few_rows OR reach::double precision * reach < 4.0 * p_want * everything)) THEN
        RETURN QUERY EXECUTE labelled USING qvec, p_labels, p_want, p_documents;
        RETURN;
    END IF;
    -- A term whose idf is under a tenth of the query's highest adds little to any score: its highest weight (one
    -- posting) bounds it. The others are read p_depth deep, or whole when shorter.
    SELECT array_agg(CASE WHEN u.f < 0.1 * top_idf THEN 1 ELSE p_depth END ORDER BY u.i)
        INTO depths FROM unnest(ids, idfs) AS u(i, f);
    -- Labels that reach a share of the rows: as many times more of the best candidates are checked first.
    -- (At least 2 x p_want: overlapping labels are counted once per label, so the reach can exceed the rows.)
    pool := greatest(2 * p_want, least(20000, ceil(2.0 * p_want * everything / greatest(reach, 1))))::integer;
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
        first AS MATERIALIZED (  -- exact scores of the candidates with the highest bounds
            SELECT b.lexical_id, -(d.vec <#> $4) AS score
            FROM (SELECT lexical_id FROM bounded ORDER BY upper DESC, lexical_id LIMIT $5) b JOIN %2$I d USING (lexical_id)
        ),
        first_kept AS MATERIALIZED (
            SELECT t.chunk_id, f.score FROM first f JOIN %3$I t USING (lexical_id)
            WHERE t.acl_labels && $6 ORDER BY f.score DESC, t.chunk_id LIMIT $7
        ),
        threshold AS (SELECT CASE WHEN count(*) = $7 THEN min(score) ELSE 0 END AS theta FROM first_kept),
        rest AS MATERIALIZED (  -- every other chunk whose bound reaches the k-th exact score so far, scored exactly
            SELECT b.lexical_id, -(d.vec <#> $4) AS score
            FROM bounded b JOIN %2$I d USING (lexical_id), threshold
            -- (the bounds are double precision, the exact scores pgvector's float: a hair of tolerance for ties)
            WHERE b.upper * (1 + 1e-5) >= threshold.theta AND b.lexical_id NOT IN (SELECT lexical_id FROM first)
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
