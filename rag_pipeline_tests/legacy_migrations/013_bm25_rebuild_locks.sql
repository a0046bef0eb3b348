-- rag_bm25_rebuild takes its locks on the BM25 structures up front, in the order searches read them, so a
-- search that reads the version while it is rebuilt waits instead of deadlocking with it.
CREATE OR REPLACE FUNCTION rag_bm25_rebuild(version_table text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    params record;
BEGIN
    EXECUTE format('LOCK TABLE %I IN SHARE ROW EXCLUSIVE MODE', version_table);
    -- In the order searches read them (params, totals, counters, postings, weights): a search holding one
    -- finishes before the rebuild takes the next, so the two never wait on each other in a cycle. Searches of
    -- this version wait until the rebuild commits.
    EXECUTE format('LOCK TABLE %I, %I, %I, %I, %I IN ACCESS EXCLUSIVE MODE', version_table || '_bm25_params',
                   version_table || '_bm25_totals', version_table || '_bm25_df', version_table || '_postings',
                   version_table || '_bm25docs');
    EXECUTE format('SELECT k1, b FROM %I', version_table || '_bm25_params') INTO params;
    EXECUTE format('TRUNCATE %I, %I, %I, %I', version_table || '_postings', version_table || '_bm25docs',
                   version_table || '_bm25_df', version_table || '_bm25_totals');
    EXECUTE format($sql$
        INSERT INTO %I (term_id, lexical_id, tf, weight)
        SELECT rag_term_id(l.term), t.lexical_id, sum(l.tf), 0
        FROM %I t, rag_lexemes(t.text_config, t.prefix || ' ' || t.text) l GROUP BY 1, 2
    $sql$, version_table || '_postings', version_table);
    EXECUTE format($sql$
        INSERT INTO %I (lexical_id, len, vec)
        SELECT t.lexical_id, coalesce(sum(p.tf), 0), '{}/1000000000'::sparsevec
        FROM %I t LEFT JOIN %I p USING (lexical_id) GROUP BY t.lexical_id
    $sql$, version_table || '_bm25docs', version_table, version_table || '_postings');
    EXECUTE format('INSERT INTO %I (term_id, shard, df) SELECT term_id, 0, count(*) FROM %I GROUP BY term_id',
                   version_table || '_bm25_df', version_table || '_postings');
    EXECUTE format($sql$
        INSERT INTO %I AS c (term_id, shard, df)
        SELECT rag_label_term_id(l), 0, count(*) FROM %I, unnest(acl_labels) AS l GROUP BY 1
        ON CONFLICT (term_id, shard) DO UPDATE SET df = c.df + EXCLUDED.df
    $sql$, version_table || '_bm25_df', version_table);
    EXECUTE format('INSERT INTO %I (shard, chunks, total_len) SELECT 0, count(*), coalesce(sum(len), 0) FROM %I',
                   version_table || '_bm25_totals', version_table || '_bm25docs');
    EXECUTE format($sql$UPDATE %I SET configs = (SELECT coalesce(array_agg(DISTINCT text_config), '{}') FROM %I)$sql$,
                   version_table || '_bm25_params', version_table);
    PERFORM rag_bm25_reweight(version_table, params.k1, params.b);
END $$;
