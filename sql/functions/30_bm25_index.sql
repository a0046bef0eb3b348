-- BM25 in plain Postgres, per index version, kept by triggers in the same transaction as the version's rows
-- (inserts, deletions, and cascades from deleted documents alike):
--   index_vN.lexical_id       a compact row key for the structures below
--   index_vN.text_config      the text search configuration of the row's document (its language)
--   index_vN_bm25docs         per row: its length in terms and its BM25 term weights as a sparsevec
--   index_vN_postings         (term, row, tf, weight), impact-ordered by an index on (term_id, weight DESC)
--   index_vN_bm25_df          document frequency per term, sharded so parallel writers do not share a row
--   index_vN_bm25_totals      row count and total length, sharded the same way
--   index_vN_bm25_params      k1, b, the average length the weights were computed with, the configurations
--                             (languages) its rows use
-- Weights are tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avgdl)); the query side multiplies them by each
-- query term's idf, ln(1 + (N - df + 0.5) / (df + 0.5)), so a score is textbook BM25. rag_bm25_reweight()
-- recomputes the weights when the corpus's average length has drifted from the one they used.

CREATE OR REPLACE FUNCTION rag_bm25_weight(tf integer, len integer, avgdl double precision, k1 double precision,
                                           b double precision) RETURNS real
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / greatest(avgdl, 1))))::real
$$;

-- The term ids a row's weight vector holds: the key of the weight vectors' term-set index (a GIN index), which
-- finds the rows holding every term of a set (rag.bm25_by_term_sets). The index's keys are this function's results:
-- changing what it returns means rebuilding every such index.
CREATE OR REPLACE FUNCTION rag_bm25_term_ids(vec sparsevec) RETURNS integer[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(split_part(e, ':', 1)::integer), '{}')
    FROM unnest(string_to_array(nullif(btrim(split_part(vec::text, '/', 1), '{}'), ''), ',')) AS e
$$;

-- At least 512 MB of maintenance_work_mem for the rest of the transaction, for the index builds that follow (the
-- term-set index of 1,000,000 rows: about 35 s here with it); a server's larger setting is kept.
CREATE OR REPLACE FUNCTION rag_bm25_index_build_memory() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF pg_size_bytes(current_setting('maintenance_work_mem')) < pg_size_bytes('512MB') THEN
        PERFORM set_config('maintenance_work_mem', '512MB', true);
    END IF;
END $$;

-- The per-transaction shard of a version's counters: the first one no other transaction holds, so parallel
-- writers update different rows (and wait, never deadlock, when there are more writers than shards).
CREATE OR REPLACE FUNCTION rag_bm25_shard(version_table text) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    setting text := 'rag_pipeline.bm25_shard_' || version_table;
    chosen text := current_setting(setting, true);
BEGIN
    IF chosen IS NOT NULL AND chosen <> '' THEN
        RETURN chosen::integer;
    END IF;
    FOR shard IN 0..15 LOOP
        IF pg_try_advisory_xact_lock(hashtext('rag_pipeline:bm25:' || version_table), shard) THEN
            PERFORM set_config(setting, shard::text, true);
            RETURN shard;
        END IF;
    END LOOP;
    PERFORM pg_advisory_xact_lock(hashtext('rag_pipeline:bm25:' || version_table), pg_backend_pid() % 16);
    PERFORM set_config(setting, (pg_backend_pid() % 16)::text, true);
    RETURN pg_backend_pid() % 16;
END $$;

CREATE OR REPLACE FUNCTION rag_bm25_count_labels(version_table text, labels text[], shard integer, delta integer)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format($sql$
        INSERT INTO %I AS c (term_id, shard, df)
        SELECT DISTINCT rag_label_term_id(l), $1, $2 FROM unnest($3) AS l ORDER BY 1
        ON CONFLICT (term_id, shard) DO UPDATE SET df = c.df + EXCLUDED.df
    $sql$, version_table || '_bm25_df') USING shard, delta, labels;
END $$;

-- Write the inserted rows' postings, weights and counters: the AFTER INSERT trigger of every version table, once a
-- statement over its transition table. Once a row, each row planned its five statements afresh and counted every
-- one of its terms in its own upsert: 3.6 ms a row, 85% of an index write. A statement of many rows tokenises them
-- in one pass and counts each term once.
CREATE OR REPLACE FUNCTION rag_bm25_rows_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    base text := TG_TABLE_NAME;
    shard integer;
    params record;
    reference_len double precision;
    added_rows bigint;
    added_len bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM rag_new_rows) THEN  -- ON CONFLICT DO NOTHING skipped them all
        RETURN NULL;
    END IF;
    shard := rag_bm25_shard(base);
    EXECUTE format('SELECT k1, b, avgdl, configs FROM %I', base || '_bm25_params') INTO params;
    IF EXISTS (SELECT 1 FROM rag_new_rows WHERE NOT text_config = ANY(params.configs)) THEN
        -- a language new to this version: queries need its stems
        EXECUTE format($sql$UPDATE %I SET configs = configs || ARRAY(
                                SELECT DISTINCT text_config FROM rag_new_rows WHERE NOT text_config = ANY($1))$sql$,
                       base || '_bm25_params') USING params.configs;
    END IF;
    EXECUTE format($sql$
        WITH terms AS MATERIALIZED (
            SELECT lexical_id, term_id, tf, sum(tf) OVER (PARTITION BY lexical_id)::integer AS len
            FROM (SELECT n.lexical_id, rag_term_id(l.term) AS term_id, sum(l.tf)::integer AS tf
                  FROM rag_new_rows n, rag_lexemes(n.text_config, n.prefix || ' ' || n.text) l GROUP BY 1, 2) t
        ), reference AS (  -- the version's first rows set the reference length (their mean); a re-weight follows
            SELECT coalesce($1, (SELECT avg(len) FROM (SELECT DISTINCT lexical_id, len FROM terms) l), 0)
                   ::double precision AS len
        ), weighted AS MATERIALIZED (
            SELECT t.lexical_id, t.term_id, t.tf, t.len, rag_bm25_weight(t.tf, t.len, r.len, $2, $3) AS weight
            FROM terms t, reference r
        ), posted AS (
            INSERT INTO %I (term_id, lexical_id, tf, weight)
            SELECT term_id, lexical_id, tf, weight FROM weighted ORDER BY term_id, lexical_id
        ), counted AS (  -- the terms' document frequencies, and how many rows carry each label beside them
            INSERT INTO %I AS c (term_id, shard, df)
            SELECT term_id, $4, count(*)
            FROM (SELECT term_id FROM weighted
                  UNION ALL
                  SELECT rag_label_term_id(label)
                  FROM (SELECT DISTINCT n.lexical_id, l AS label FROM rag_new_rows n, unnest(n.acl_labels) l) s
                 ) counted_terms
            GROUP BY term_id ORDER BY term_id
            ON CONFLICT (term_id, shard) DO UPDATE SET df = c.df + EXCLUDED.df
        ), weighed AS (
            INSERT INTO %I (lexical_id, len, vec)
            SELECT n.lexical_id, coalesce(max(w.len), 0),
                   ('{' || coalesce(string_agg(w.term_id || ':' || w.weight, ',' ORDER BY w.term_id), '')
                        || '}/1000000000')::sparsevec
            FROM rag_new_rows n LEFT JOIN weighted w USING (lexical_id) GROUP BY n.lexical_id
            RETURNING len
        )
        SELECT count(*), coalesce(sum(len), 0), (SELECT len FROM reference) FROM weighed
    $sql$, base || '_postings', base || '_bm25_df', base || '_bm25docs')
    INTO added_rows, added_len, reference_len USING params.avgdl, params.k1, params.b, shard;
    EXECUTE format($sql$
        INSERT INTO %I AS t (shard, chunks, total_len) VALUES ($1, $2, $3)
        ON CONFLICT (shard) DO UPDATE SET chunks = t.chunks + $2, total_len = t.total_len + $3
    $sql$, base || '_bm25_totals') USING shard, added_rows, added_len;
    IF params.avgdl IS NULL THEN
        EXECUTE format('UPDATE %I SET avgdl = $1 WHERE avgdl IS NULL', base || '_bm25_params') USING reference_len;
    END IF;
    RETURN NULL;
END $$;

-- The AFTER DELETE trigger of every version table, once a statement (a document's rows go in one).
CREATE OR REPLACE FUNCTION rag_bm25_rows_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    base text := TG_TABLE_NAME;
    shard integer;
    gone_ids integer[];
    gone_rows bigint;
    gone_len bigint;
BEGIN
    SELECT array_agg(lexical_id ORDER BY lexical_id) INTO gone_ids FROM rag_old_rows;
    IF gone_ids IS NULL THEN
        RETURN NULL;
    END IF;
    shard := rag_bm25_shard(base);
    -- = ANY of an array, not a join: the postings are read by their key whatever the planner guesses of the
    -- transition table.
    EXECUTE format($sql$
        WITH gone AS (DELETE FROM %I WHERE lexical_id = ANY($1) RETURNING term_id)
        INSERT INTO %I AS c (term_id, shard, df)
        SELECT term_id, $2, -count(*)
        FROM (SELECT term_id FROM gone
              UNION ALL
              SELECT rag_label_term_id(label)
              FROM (SELECT DISTINCT o.lexical_id, l AS label FROM rag_old_rows o, unnest(o.acl_labels) l) s
             ) counted_terms
        GROUP BY term_id ORDER BY term_id
        ON CONFLICT (term_id, shard) DO UPDATE SET df = c.df + EXCLUDED.df
    $sql$, base || '_postings', base || '_bm25_df') USING gone_ids, shard;
    EXECUTE format($sql$
        WITH gone AS (DELETE FROM %I WHERE lexical_id = ANY($1) RETURNING len)
        SELECT count(*), coalesce(sum(len), 0) FROM gone
    $sql$, base || '_bm25docs') INTO gone_rows, gone_len USING gone_ids;
    EXECUTE format($sql$
        INSERT INTO %I AS t (shard, chunks, total_len) VALUES ($1, -$2, -$3)
        ON CONFLICT (shard) DO UPDATE SET chunks = t.chunks - $2, total_len = t.total_len - $3
    $sql$, base || '_bm25_totals') USING shard, gone_rows, gone_len;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION rag_bm25_labels_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    shard integer := rag_bm25_shard(TG_TABLE_NAME);
BEGIN
    PERFORM rag_bm25_count_labels(TG_TABLE_NAME, OLD.acl_labels, shard, -1);
    PERFORM rag_bm25_count_labels(TG_TABLE_NAME, NEW.acl_labels, shard, 1);
    RETURN NULL;
END $$;

-- Recompute every weight with the current average length (and the given k1, b); counters are compacted.
-- The active version is updated in place, so its searches go on while it is re-weighted. Any other (a version
-- being built, whose backfill re-weights it at the end when its average length drifted; one kept for rollback)
-- has its postings written again from their term frequencies, as a rebuild writes them: updating every posting
-- of a million-chunk version rewrites 140 million rows into both of its B-trees and leaves the table twice its
-- size. (A search of such a version, a promotion's quality gate, waits until the rewrite commits; so do the searches
-- of a version promoted while it is rewritten.)
CREATE OR REPLACE FUNCTION rag_bm25_reweight(version_table text, new_k1 double precision, new_b double precision)
RETURNS double precision LANGUAGE plpgsql AS $$
DECLARE
    live_avgdl double precision;
BEGIN
    EXECUTE format('LOCK TABLE %I IN SHARE ROW EXCLUSIVE MODE', version_table);
    IF NOT EXISTS (SELECT 1 FROM index_alias a JOIN index_versions v USING (version_id)
                   WHERE a.alias = 'active' AND v.table_name = version_table) THEN
        EXECUTE format('LOCK TABLE %I, %I, %I, %I, %I IN ACCESS EXCLUSIVE MODE', version_table || '_bm25_params',
                       version_table || '_bm25_totals', version_table || '_bm25_df', version_table || '_postings',
                       version_table || '_bm25docs');
        EXECUTE format('CREATE TEMP TABLE rag_bm25_terms ON COMMIT DROP AS SELECT term_id, lexical_id, tf FROM %I',
                       version_table || '_postings');
        live_avgdl := rag_bm25_write_staged(version_table, new_k1, new_b);
        EXECUTE format('UPDATE %I SET k1 = $1, b = $2, avgdl = $3', version_table || '_bm25_params')
            USING new_k1, new_b, live_avgdl;
    ELSE
        EXECUTE format('SELECT sum(total_len)::double precision / nullif(sum(chunks), 0) FROM %I',
                       version_table || '_bm25_totals') INTO live_avgdl;
        EXECUTE format('UPDATE %I SET k1 = $1, b = $2, avgdl = $3', version_table || '_bm25_params')
            USING new_k1, new_b, live_avgdl;
        IF live_avgdl IS NULL THEN
            RETURN NULL;
        END IF;
        EXECUTE format($sql$
            UPDATE %I p SET weight = rag_bm25_weight(p.tf, d.len, $1, $2, $3)
            FROM %I d WHERE d.lexical_id = p.lexical_id
        $sql$, version_table || '_postings', version_table || '_bm25docs') USING live_avgdl, new_k1, new_b;
        EXECUTE format($sql$
            UPDATE %I d SET vec = v.vec FROM (
                SELECT lexical_id, ('{' || string_agg(term_id || ':' || weight, ',' ORDER BY term_id)
                                    || '}/1000000000')::sparsevec AS vec
                FROM %I GROUP BY lexical_id) v
            WHERE v.lexical_id = d.lexical_id
        $sql$, version_table || '_bm25docs', version_table || '_postings');
    END IF;
    -- Counters compacted into shard 0: the per-shard rows of a busy version only ever grow.
    EXECUTE format('CREATE TEMP TABLE rag_bm25_compact ON COMMIT DROP AS'
                   ' SELECT term_id, sum(df)::integer AS df FROM %I GROUP BY term_id HAVING sum(df) <> 0',
                   version_table || '_bm25_df');
    EXECUTE format('DELETE FROM %I', version_table || '_bm25_df');
    EXECUTE format('INSERT INTO %I (term_id, shard, df) SELECT term_id, 0, df FROM rag_bm25_compact',
                   version_table || '_bm25_df');
    DROP TABLE rag_bm25_compact;
    EXECUTE format('CREATE TEMP TABLE rag_bm25_compact ON COMMIT DROP AS'
                   ' SELECT coalesce(sum(chunks), 0) AS chunks, coalesce(sum(total_len), 0) AS total_len FROM %I',
                   version_table || '_bm25_totals');
    EXECUTE format('DELETE FROM %I', version_table || '_bm25_totals');
    EXECUTE format('INSERT INTO %I (shard, chunks, total_len) SELECT 0, chunks, total_len FROM rag_bm25_compact',
                   version_table || '_bm25_totals');
    DROP TABLE rag_bm25_compact;
    RETURN live_avgdl;
END $$;

-- A version's postings and weight vectors written again from rag_bm25_terms (term_id, lexical_id, tf), a temporary
-- table the caller filled (ON COMMIT DROP; dropped here), with weights for the live average length computed as the
-- postings are written; the postings' key and indexes, dropped for the load, are built after them, sorted.
-- (Written with the indexes in place and then re-weighted, every posting went into two B-trees in random order
-- and was then updated: at 100,000 rows 115 s and 1,465 MB of postings, against 40 s and 667 MB.)
-- The caller holds the version's BM25 structures in ACCESS EXCLUSIVE mode. Returns the average length.
CREATE OR REPLACE FUNCTION rag_bm25_write_staged(version_table text, k1 double precision, b double precision)
RETURNS double precision LANGUAGE plpgsql AS $$
DECLARE
    postings text := version_table || '_postings';
    weights text := version_table || '_bm25docs';
    live_avgdl double precision;
    index_definitions text[];
    constraint_definitions text[];
    definition text;
BEGIN
    EXECUTE format('TRUNCATE %I, %I', postings, weights);
    -- The weight vectors' indexes other than their key (the term-set index), made again after the load: a GIN index
    -- filled row by row grows a pending list it then merges.
    SELECT array_agg(pg_get_indexdef(i.indexrelid)) INTO index_definitions
        FROM pg_index i WHERE i.indrelid = format('%I', weights)::regclass AND NOT i.indisprimary;
    FOR definition IN SELECT format('DROP INDEX %s', i.indexrelid::regclass)
                      FROM pg_index i WHERE i.indrelid = format('%I', weights)::regclass AND NOT i.indisprimary LOOP
        EXECUTE definition;
    END LOOP;
    -- The postings' indexes and key, as they are defined, dropped now and made again after the load.
    SELECT array_agg(format('ALTER TABLE %I ADD CONSTRAINT %I %s', postings, c.conname, pg_get_constraintdef(c.oid)))
        INTO constraint_definitions FROM pg_constraint c
        WHERE c.conrelid = format('%I', postings)::regclass AND c.contype = 'p';
    index_definitions := coalesce(index_definitions, '{}') || ARRAY(
        SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i WHERE i.indrelid = format('%I', postings)::regclass
         AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid));
    FOR definition IN SELECT format('ALTER TABLE %I DROP CONSTRAINT %I', postings, c.conname)
                      FROM pg_constraint c WHERE c.conrelid = format('%I', postings)::regclass AND c.contype = 'p'
                      UNION ALL
                      SELECT format('DROP INDEX %s', i.indexrelid::regclass)
                      FROM pg_index i WHERE i.indrelid = format('%I', postings)::regclass
                       AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid) LOOP
        EXECUTE definition;
    END LOOP;
    EXECUTE format($sql$
        CREATE TEMP TABLE rag_bm25_lengths ON COMMIT DROP AS
        SELECT t.lexical_id, coalesce(s.len, 0)::integer AS len
        FROM %I t LEFT JOIN (SELECT lexical_id, sum(tf) AS len FROM rag_bm25_terms GROUP BY lexical_id) s
             USING (lexical_id)
    $sql$, version_table);
    ANALYZE rag_bm25_terms, rag_bm25_lengths;
    SELECT sum(len)::double precision / nullif(count(*), 0) INTO live_avgdl FROM rag_bm25_lengths;
    EXECUTE format($sql$
        INSERT INTO %I (term_id, lexical_id, tf, weight)
        SELECT s.term_id, s.lexical_id, s.tf, rag_bm25_weight(s.tf, l.len, $1, $2, $3)
        FROM rag_bm25_terms s JOIN rag_bm25_lengths l USING (lexical_id)
    $sql$, postings) USING live_avgdl, k1, b;
    EXECUTE format($sql$
        INSERT INTO %I (lexical_id, len, vec)
        SELECT l.lexical_id, l.len, coalesce(v.vec, '{}/1000000000'::sparsevec)
        FROM rag_bm25_lengths l LEFT JOIN (
            SELECT lexical_id, ('{' || string_agg(term_id || ':' || weight, ',' ORDER BY term_id)
                                || '}/1000000000')::sparsevec AS vec
            FROM %I GROUP BY lexical_id) v USING (lexical_id)
    $sql$, weights, postings);
    DROP TABLE rag_bm25_terms, rag_bm25_lengths;
    PERFORM rag_bm25_index_build_memory();
    FOREACH definition IN ARRAY coalesce(constraint_definitions, '{}') || coalesce(index_definitions, '{}') LOOP
        EXECUTE definition;
    END LOOP;
    RETURN live_avgdl;
END $$;

-- Every BM25 structure of a version recomputed from its rows, set-based: for rows that exist before the
-- structures do (migration), after a bulk load made with the triggers off, and as the reindex step of the
-- maintenance policy (it also drops the dead space many deletions leave). Each row is tokenised once.
-- rag_bm25_rebuild takes its locks on the BM25 structures up front, in the order searches read them, so a
-- search that reads the version while it is rebuilt waits instead of deadlocking with it.
CREATE OR REPLACE FUNCTION rag_bm25_rebuild(version_table text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    params record;
    live_avgdl double precision;
BEGIN
    EXECUTE format('LOCK TABLE %I IN SHARE ROW EXCLUSIVE MODE', version_table);
    -- In the order searches read them (params, totals, counters, postings, weights): a search holding one
    -- finishes before the rebuild takes the next, so the two never wait on each other in a cycle. Searches of
    -- this version wait until the rebuild commits.
    EXECUTE format('LOCK TABLE %I, %I, %I, %I, %I IN ACCESS EXCLUSIVE MODE', version_table || '_bm25_params',
                   version_table || '_bm25_totals', version_table || '_bm25_df', version_table || '_postings',
                   version_table || '_bm25docs');
    EXECUTE format('SELECT k1, b FROM %I', version_table || '_bm25_params') INTO params;
    EXECUTE format($sql$
        CREATE TEMP TABLE rag_bm25_terms ON COMMIT DROP AS
        SELECT rag_term_id(l.term) AS term_id, t.lexical_id, sum(l.tf)::integer AS tf
        FROM %I t, rag_lexemes(t.text_config, t.prefix || ' ' || t.text) l GROUP BY 1, 2
    $sql$, version_table);
    EXECUTE format('TRUNCATE %I, %I', version_table || '_bm25_df', version_table || '_bm25_totals');
    EXECUTE format('INSERT INTO %I (term_id, shard, df) SELECT term_id, 0, count(*) FROM rag_bm25_terms GROUP BY term_id',
                   version_table || '_bm25_df');
    live_avgdl := rag_bm25_write_staged(version_table, params.k1, params.b);
    EXECUTE format($sql$
        INSERT INTO %I AS c (term_id, shard, df)
        SELECT rag_label_term_id(l), 0, count(*) FROM %I, unnest(acl_labels) AS l GROUP BY 1
        ON CONFLICT (term_id, shard) DO UPDATE SET df = c.df + EXCLUDED.df
    $sql$, version_table || '_bm25_df', version_table);
    EXECUTE format('INSERT INTO %I (shard, chunks, total_len) SELECT 0, count(*), coalesce(sum(len), 0) FROM %I',
                   version_table || '_bm25_totals', version_table || '_bm25docs');
    EXECUTE format($sql$UPDATE %I SET avgdl = $1, configs = (SELECT coalesce(array_agg(DISTINCT text_config), '{}')
                                                            FROM %I)$sql$,
                   version_table || '_bm25_params', version_table) USING live_avgdl;
END $$;

-- The triggers that keep a version's BM25 structures with its inserts and deletions, once a statement.
CREATE OR REPLACE FUNCTION rag_bm25_create_write_triggers(version_table text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('CREATE TRIGGER %I AFTER INSERT ON %I REFERENCING NEW TABLE AS rag_new_rows '
                   'FOR EACH STATEMENT EXECUTE FUNCTION rag_bm25_rows_inserted()',
                   version_table || '_bm25_insert', version_table);
    EXECUTE format('CREATE TRIGGER %I AFTER DELETE ON %I REFERENCING OLD TABLE AS rag_old_rows '
                   'FOR EACH STATEMENT EXECUTE FUNCTION rag_bm25_rows_deleted()',
                   version_table || '_bm25_delete', version_table);
END $$;

-- The weight vectors' term-set index (rag_bm25_term_ids, rag.bm25_by_term_sets).
CREATE OR REPLACE FUNCTION rag_bm25_create_term_set_index(version_table text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM rag_bm25_index_build_memory();
    EXECUTE format('CREATE INDEX %I ON %I USING gin (rag_bm25_term_ids(vec))', version_table || '_bm25docs_terms',
                   version_table || '_bm25docs');
END $$;

-- Give a version table its BM25 structures and triggers, and index the rows it already holds.
CREATE OR REPLACE FUNCTION rag_bm25_attach(version_table text, k1 double precision, b double precision)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('ALTER TABLE %I ADD COLUMN lexical_id integer GENERATED ALWAYS AS IDENTITY',
                   version_table);
    EXECUTE format('ALTER TABLE %I ADD COLUMN text_config regconfig NOT NULL DEFAULT %L::regconfig',
                   version_table, 'english');
    EXECUTE format('CREATE UNIQUE INDEX %I ON %I (lexical_id)', version_table || '_lexical', version_table);
    EXECUTE format('CREATE TABLE %I (lexical_id integer PRIMARY KEY, len integer NOT NULL, vec sparsevec NOT NULL)',
                   version_table || '_bm25docs');
    PERFORM rag_bm25_create_term_set_index(version_table);
    EXECUTE format($sql$CREATE TABLE %I (
                       term_id integer NOT NULL, lexical_id integer NOT NULL, tf integer NOT NULL,
                       weight real NOT NULL, PRIMARY KEY (lexical_id, term_id))$sql$, version_table || '_postings');
    EXECUTE format('CREATE INDEX %I ON %I (term_id, weight DESC, lexical_id)',
                   version_table || '_postings_impact', version_table || '_postings');
    EXECUTE format($sql$CREATE TABLE %I (term_id integer NOT NULL, shard smallint NOT NULL, df integer NOT NULL,
                       PRIMARY KEY (term_id, shard))$sql$, version_table || '_bm25_df');
    EXECUTE format($sql$CREATE TABLE %I (shard smallint PRIMARY KEY, chunks bigint NOT NULL,
                       total_len bigint NOT NULL)$sql$, version_table || '_bm25_totals');
    EXECUTE format($sql$CREATE TABLE %I (k1 double precision NOT NULL, b double precision NOT NULL,
                       avgdl double precision, configs regconfig[] NOT NULL)$sql$, version_table || '_bm25_params');
    EXECUTE format($sql$INSERT INTO %I (k1, b, avgdl, configs)
                       SELECT $1, $2, NULL, coalesce(array_agg(DISTINCT text_config), '{}') FROM %I$sql$,
                   version_table || '_bm25_params', version_table) USING k1, b;
    PERFORM rag_bm25_create_write_triggers(version_table);
    EXECUTE format($sql$CREATE TRIGGER %I AFTER UPDATE OF acl_labels ON %I FOR EACH ROW
                       WHEN (OLD.acl_labels IS DISTINCT FROM NEW.acl_labels)
                       EXECUTE FUNCTION rag_bm25_labels_changed()$sql$, version_table || '_bm25_labels', version_table);
    PERFORM rag_bm25_rebuild(version_table);
END $$;

-- The BM25 structures of a version whose table is dropped.
CREATE OR REPLACE FUNCTION rag_bm25_detach(version_table text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('DROP TABLE IF EXISTS %I, %I, %I, %I, %I', version_table || '_postings',
                   version_table || '_bm25docs', version_table || '_bm25_df', version_table || '_bm25_totals',
                   version_table || '_bm25_params');
END $$;

-- Version tables made before the triggers ran once a statement get the new ones, in the transaction that
-- replaces these functions (a migration would commit before them); then the row-level functions go. Found by the
-- function their triggers call, so no table still calling one can make the DROP FUNCTION fail every migration.
DO $$
DECLARE
    version_table text;
BEGIN
    FOR version_table IN SELECT c.relname FROM pg_class c
                         WHERE c.oid IN (SELECT t.tgrelid FROM pg_trigger t
                                         WHERE t.tgfoid IN (to_regprocedure('rag_bm25_row_inserted()'),
                                                            to_regprocedure('rag_bm25_row_deleted()')))
                         -- in version order, as index writes lock versions
                         ORDER BY (SELECT v.version_id FROM index_versions v WHERE v.table_name = c.relname), 1 LOOP
        EXECUTE format('DROP TRIGGER IF EXISTS %I ON %I', version_table || '_bm25_insert', version_table);
        EXECUTE format('DROP TRIGGER IF EXISTS %I ON %I', version_table || '_bm25_delete', version_table);
        PERFORM rag_bm25_create_write_triggers(version_table);
    END LOOP;
END $$;
-- Version tables made before the term-set index get it, in the transaction that re-applies these functions (about
-- 35 s per 1,000,000 rows here; writes to that version wait for it).
DO $$
DECLARE
    version_table text;
BEGIN
    FOR version_table IN SELECT v.table_name FROM index_versions v
                         WHERE v.dropped_at IS NULL AND to_regclass(format('%I', v.table_name || '_bm25docs')) IS NOT NULL
                           AND to_regclass(format('%I', v.table_name || '_bm25docs_terms')) IS NULL
                         ORDER BY v.version_id LOOP
        PERFORM rag_bm25_create_term_set_index(version_table);
    END LOOP;
END $$;
DROP FUNCTION IF EXISTS rag_bm25_row_inserted();
DROP FUNCTION IF EXISTS rag_bm25_row_deleted();
