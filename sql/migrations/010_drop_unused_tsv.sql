-- Every index version table carried `tsv`, a stored to_tsvector of its text with a GIN index, from before BM25 had
-- its own postings (30_bm25_index.sql); nothing has read it since. It cost about 40% of a version table's rows
-- (at 300,000 chunks: 337 MB of the column, most of it in TOAST, and 88 MB of GIN) and a second tokenisation and
-- a GIN update on every row written. Dropping a column is a change of the catalog only, instant at any size: its
-- space comes back as rows are written again, and all of it when a version is built anew.
DO $$
DECLARE
    version_table text;
BEGIN
    -- in version order, as index writes lock versions
    FOR version_table IN SELECT table_name FROM index_versions
                         WHERE dropped_at IS NULL AND to_regclass(table_name) IS NOT NULL ORDER BY version_id LOOP
        EXECUTE format('ALTER TABLE %I DROP COLUMN IF EXISTS tsv', version_table);
    END LOOP;
END $$;
