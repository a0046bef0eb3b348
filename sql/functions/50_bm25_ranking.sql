-- The lexical list of a search: BM25 over a version's impact-ordered postings (the structures of 30_bm25_index.sql),
-- and the small lookups the search functions share. The search functions are in schema `rag` and run with their
-- caller's privileges; only rag.search and rag.active_rows (80_read_surface.sql) are meant to be granted.

-- The chunk table of a version that is not dropped.
CREATE OR REPLACE FUNCTION rag.version_table(p_version integer) RETURNS text LANGUAGE plpgsql STABLE AS $$
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
CREATE OR REPLACE FUNCTION rag.label_rows(p_version integer, p_labels text[]) RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE
    counted bigint;
BEGIN
    EXECUTE format('SELECT coalesce(sum(df), 0) FROM %I WHERE term_id IN '
                   '(SELECT rag_label_term_id(l) FROM unnest($1::text[]) AS l)', rag.version_table(p_version) || '_bm25_df')
        INTO counted USING p_labels;
    RETURN counted;
END $$;

-- The labels among p_labels that no row of the version carries (from the same per-label counts): a misspelt label
-- matches nothing and widens nothing, and says so only to whoever asks this (the CLI, the service's log).
CREATE OR REPLACE FUNCTION rag.unheld_labels(p_version integer, p_labels text[]) RETURNS text[] LANGUAGE plpgsql STABLE AS $$
DECLARE
    unheld text[];
BEGIN
    EXECUTE format('SELECT coalesce(array_agg(l ORDER BY l COLLATE "C"), ''{}'') FROM unnest($1::text[]) AS l '
                   'WHERE coalesce((SELECT sum(df) FROM %I WHERE term_id = rag_label_term_id(l)), 0) = 0',
                   rag.version_table(p_version) || '_bm25_df')
        INTO unheld USING p_labels;
    RETURN unheld;
END $$;

CREATE OR REPLACE FUNCTION rag.total_rows(p_version integer) RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE
    counted bigint;
BEGIN
    EXECUTE format('SELECT coalesce(sum(chunks), 0) FROM %I', rag.version_table(p_version) || '_bm25_totals')
        INTO counted;
    RETURN counted;
END $$;

-- The query's terms under every language configuration the version's rows use, with their BM25 idf, rarest
-- first: at most p_max_terms, a bound on the postings one query reads (rarity is not content: an instruction's
-- words can be rarer in the corpus than the question's). Terms no row holds are dropped. The tokenisation is the
-- index's own (rag_lexemes).
CREATE OR REPLACE FUNCTION rag.query_terms(p_version integer, p_text text, p_max_terms integer)
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

-- Every non-empty set of the query's terms: its members, the sum and the least of their highest contributions, and
-- the chunks estimated to hold all of them.
CREATE OR REPLACE FUNCTION rag.bm25_term_sets(p_ids integer[], p_tops double precision[], p_dfs bigint[],
                                              p_everything bigint)
RETURNS TABLE (terms integer[], total double precision, smallest double precision, chunks double precision)
LANGUAGE sql IMMUTABLE AS $$
    SELECT array_agg(u.i ORDER BY u.i), sum(u.m), min(u.m),
           p_everything * exp(sum(ln(greatest(u.n, 1)::double precision / greatest(p_everything, 1))))
    FROM generate_series(1, (1 << cardinality(p_ids)) - 1) AS g
    JOIN unnest(p_ids, p_tops, p_dfs) WITH ORDINALITY AS u(i, m, n, o) ON (g >> (u.o::integer - 1)) & 1 = 1
    GROUP BY g
$$;

-- The smallest term sets (as term ids) whose highest contributions (p_tops, aligned with p_ids) reach p_tau, each
-- with the chunks estimated to hold it (document frequencies p_dfs, as if terms occurred independently).
CREATE OR REPLACE FUNCTION rag.bm25_term_sets_reaching(
    p_ids integer[], p_tops double precision[], p_dfs bigint[], p_everything bigint, p_tau double precision
) RETURNS TABLE (terms integer[], chunks double precision) LANGUAGE sql IMMUTABLE AS $$
    SELECT s.terms, s.chunks FROM rag.bm25_term_sets(p_ids, p_tops, p_dfs, p_everything) s
    WHERE s.total >= p_tau * (1 - 1e-5) AND s.total - s.smallest < p_tau * (1 - 1e-5)
$$;

-- The levels tau can take (the sums of term sets' highest contributions), each with the chunks estimated to hold a
-- smallest set reaching it. A set is a smallest one reaching tau when total - smallest < tau <= total: summed in
-- one sweep down the sets' bounds.
CREATE OR REPLACE FUNCTION rag.bm25_term_set_levels(p_ids integer[], p_tops double precision[], p_dfs bigint[],
                                                    p_everything bigint)
RETURNS TABLE (total double precision, chunks double precision) LANGUAGE sql IMMUTABLE AS $$
    WITH sets AS (SELECT * FROM rag.bm25_term_sets(p_ids, p_tops, p_dfs, p_everything)),
    bounds AS (SELECT s.total AS v, s.chunks AS d FROM sets s UNION ALL SELECT s.total - s.smallest, -s.chunks FROM sets s),
    swept AS (SELECT b.v, sum(b.d) OVER (ORDER BY b.v DESC RANGE UNBOUNDED PRECEDING) AS chunks FROM bounds b)
    SELECT DISTINCT w.v, w.chunks FROM swept w WHERE w.v IN (SELECT s.total FROM sets s)
$$;

-- The top p_want chunks by BM25 among those the labels reach, found through the chunks that hold enough of the
-- query's terms, when that can be settled from few of them (settled: false otherwise, and the caller ranks another
-- way). A chunk holding the terms S scores at most the sum over S of each term's highest contribution (its idf
-- times its highest weight, the first posting of its impact-ordered list); so every chunk scoring at least tau holds
-- one of the smallest term sets whose highest contributions reach tau, and the term-set index (a GIN index of
-- each chunk's terms) finds those chunks by intersecting the sets' lists. Their exact scores are computed, the best
-- p_want the caller may read kept; the result is exact once its last score reaches tau. Else tau drops to that last
-- score (the next round is then exact) or, when fewer than p_want came back, to a lower level.
-- Why: the postings of a few mid-frequency terms have flat weights (most term frequencies are 1), so reading them in
-- impact order bounds the chunks not read by nearly every term's highest weight, and nearly every chunk read must
-- be looked up (at 1,000,000 chunks, 21,528 of 21,688 for one six-word query, 128 ms). The chunks holding two or
-- three of the terms are far fewer, and GIN intersects the lists without reading them row by row.
-- tau starts at the highest level whose chunks, estimated as if terms occurred independently, number p_start times
-- p_want per share of the rows the labels reach; a level estimated above p_cap chunks is not tried.
CREATE OR REPLACE FUNCTION rag.bm25_by_term_sets(
    p_version integer, p_ids integer[], p_idfs double precision[], p_dfs bigint[], p_qvec sparsevec, p_labels text[],
    p_want integer, p_reach bigint, p_everything bigint, p_start double precision, p_cap double precision,
    OUT settled boolean, OUT chunk_ids text[], OUT scores double precision[]
) LANGUAGE plpgsql STABLE SET random_page_cost = 1.1 AS $$
DECLARE
    t text := rag.version_table(p_version);
    tops double precision[];
    tau double precision;
    estimate double precision;
    smallest_top double precision;
    wanted double precision := p_start * p_want * p_everything / greatest(p_reach, 1);
    sets text;
    candidate_count bigint;
BEGIN
    settled := false;
    -- 2^n term sets are weighed: beyond 10 terms (1,023 sets) the impact-ordered path ranks
    IF cardinality(p_ids) > 10 OR p_everything = 0 THEN
        RETURN;
    END IF;
    EXECUTE format('SELECT array_agg(u.f * coalesce((SELECT p.weight FROM %I p WHERE p.term_id = u.i '
                   'ORDER BY p.weight DESC LIMIT 1), 0) ORDER BY u.n) FROM unnest($1, $2) WITH ORDINALITY AS u(i, f, n)',
                   t || '_postings') INTO tops USING p_ids, p_idfs;
    smallest_top := (SELECT min(m) FROM unnest(tops) AS m);
    -- the first tau, from the highest: the sum of a term set's highest contributions, where the chunks holding a
    -- smallest set reaching it are estimated at `wanted` or more
    SELECT l.total INTO tau FROM rag.bm25_term_set_levels(p_ids, tops, p_dfs, p_everything) l
    WHERE l.chunks >= wanted OR l.total <= smallest_top ORDER BY l.total DESC LIMIT 1;
    FOR round IN 1..3 LOOP
        SELECT sum(s.chunks), string_agg(format('rag_bm25_term_ids(d.vec) @> %L::integer[]', s.terms), ' OR ')
            INTO estimate, sets FROM rag.bm25_term_sets_reaching(p_ids, tops, p_dfs, p_everything, tau) s;
        IF sets IS NULL OR estimate > p_cap THEN
            RETURN;
        END IF;
        -- The candidates, at most 4 x p_cap of them (terms that occur together can make far more than estimated:
        -- then the impact-ordered path ranks); best first, each looked up in the version table until p_want the
        -- caller may read are found.
        EXECUTE format($q$
            WITH candidates AS MATERIALIZED (
                SELECT d.lexical_id, -(d.vec <#> $1)::double precision AS score FROM %2$I d WHERE %3$s LIMIT $4
            ), kept AS (
                SELECT r.chunk_id, c.score
                FROM (SELECT lexical_id, score FROM candidates WHERE score > 0 ORDER BY score DESC OFFSET 0) c
                CROSS JOIN LATERAL (SELECT r.chunk_id FROM %1$I r
                                    WHERE r.lexical_id = c.lexical_id AND r.acl_labels && $2) r
                ORDER BY c.score DESC, r.chunk_id LIMIT $3
            )
            SELECT (SELECT count(*) FROM candidates), array_agg(k.chunk_id ORDER BY k.score DESC, k.chunk_id),
                   array_agg(k.score ORDER BY k.score DESC, k.chunk_id) FROM kept k$q$, t, t || '_bm25docs', sets)
            INTO candidate_count, chunk_ids, scores USING p_qvec, p_labels, p_want, (4 * p_cap)::bigint + 1;
        IF candidate_count > 4 * p_cap THEN
            RETURN;
        END IF;
        -- Exact: the last kept reaches tau, or every chunk holding any query term was a candidate. (The sets were
        -- chosen with a margin below tau: the bounds are double precision, pgvector sums the scores in single.)
        IF (coalesce(cardinality(chunk_ids), 0) = p_want AND scores[p_want] >= tau)
           OR tau <= smallest_top * (1 + 1e-9) THEN
            settled := true;
            RETURN;
        END IF;
        IF coalesce(cardinality(chunk_ids), 0) = p_want THEN
            tau := scores[p_want];
        ELSE  -- too few: the next level down with at least four times the chunks
            SELECT l.total INTO tau FROM rag.bm25_term_set_levels(p_ids, tops, p_dfs, p_everything) l
            WHERE l.total < tau AND (l.chunks >= 4 * estimate OR l.total <= smallest_top)
            ORDER BY l.total DESC LIMIT 1;
        END IF;
    END LOOP;
END $$;

-- The top p_want chunks by BM25 among those the labels reach (and, given p_documents, of those documents only),
-- best first, ties by chunk id. Through the chunks holding enough of the query's terms when few do
-- (rag.bm25_by_term_sets; p_term_sets false skips it); else over impact-ordered postings, in one pass where it can:
--   1. read the impact-ordered postings of each query term: p_depth deep, or the whole list when it is at most twice
--      that (cutting a list just short of its end leaves its last weight in the bound of every chunk read
--      elsewhere); a term whose idf is under a tenth of the query's highest only to its first posting (its highest
--      weight bounds it: such a term adds little to any score and its list is among the longest);
--   2. bound every chunk read (its weights read plus, for each other term, the last weight read of it) and every
--      chunk not read (the sum of those last weights);
--   3. score exactly the candidates with the highest bounds (4 x p_want, more when the caller's labels reach a small
--      share of the rows) and keep the best p_want the caller may read: the k-th of them is a threshold;
--   4. score exactly every other candidate whose bound reaches the threshold, and keep the best p_want of all.
-- The result is exact when no chunk left unread can reach the last one kept; otherwise the two terms whose unread
-- postings could add the most are read four times deeper (at most four passes), then every readable row is ranked.
-- Ranked directly, without the postings: the rows of named documents, queries of only very common terms (in more
-- than a quarter of the rows), and callers whose labels reach fewer rows than p_few_rows beyond twice the
-- candidates the impact path would check for them (scoring a readable row costs about what checking a candidate
-- does). Candidates and directly ranked rows are scored in key order, by a lookup each.
DROP FUNCTION IF EXISTS rag.bm25_ranking(integer, text, text[], integer, integer, integer, text[], integer);
CREATE OR REPLACE FUNCTION rag.bm25_ranking(
    p_version integer, p_text text, p_labels text[], p_want integer, p_depth integer, p_max_terms integer,
    p_documents text[] DEFAULT NULL, p_few_rows integer DEFAULT 5000, p_term_sets boolean DEFAULT true
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
    term_sets_settled boolean;
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
    -- Ranked directly: the rows of named documents; queries of only very common terms; callers whose labels
    -- reach few rows: fewer than p_few_rows beyond twice the candidates the impact path would check for them
    -- (scoring a readable row directly costs about what checking one candidate does); and callers whose labels
    -- reach under 1/32 of the rows, up to 10 x p_few_rows of them: most chunks the postings rank first are not
    -- theirs, so the threshold from the first candidates is low, nearly every chunk read is checked, and lists are
    -- read again (at 1,000,000 rows a 2% caller, 20,000 rows, 40 wanted: p95 379 ms that way, 50 ms ranked directly).
    -- p_few_rows = 0 never ranks directly.
    IF p_documents IS NOT NULL OR rarest > 0.25 * everything
       OR (p_few_rows > 0 AND (reach < p_few_rows + 2 * pool OR (32 * reach < everything AND reach < 10 * p_few_rows))) THEN
        RETURN QUERY EXECUTE labelled USING qvec, p_labels, p_want, p_documents;
        RETURN;
    END IF;
    -- Through the chunks holding enough of the terms, when few do: tau's first level is where about 8 x p_want
    -- chunks per share the labels reach are estimated, and a level estimated above 20,000 chunks is left to the
    -- impact-ordered postings. (Chosen on half of a benchmark's queries at 1,000,000 chunks, reported on the other.)
    IF p_term_sets THEN
        SELECT b.settled, b.chunk_ids, b.scores INTO term_sets_settled, kept_ids, kept_scores
            FROM rag.bm25_by_term_sets(p_version, ids, idfs, dfs, qvec, p_labels, p_want, reach, everything, 8, 20000) b;
    END IF;
    IF term_sets_settled THEN
        RETURN QUERY SELECT k.c, k.s FROM unnest(kept_ids, kept_scores) WITH ORDINALITY AS k(c, s, n) ORDER BY k.n;
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
