-- Near-duplicate groups (MinHash + LSH). A group collects chunks with the same ACL labels whose text
-- is nearly identical; each index version holds one row per group, owned by one live occurrence.
CREATE TABLE chunk_groups (
    group_id    text PRIMARY KEY,          -- the chunk_id of the chunk that opened the group
    acl_key     text NOT NULL,             -- sorted ACL labels: groups never span label sets
    lsh_params  text NOT NULL,
    signature   bigint[] NOT NULL,         -- MinHash signature used to verify LSH candidates
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- The LSH index itself: one bucket per band per group.
CREATE TABLE chunk_group_bands (
    bucket    bigint NOT NULL,
    band      integer NOT NULL,
    group_id  text NOT NULL REFERENCES chunk_groups (group_id) ON DELETE CASCADE,
    PRIMARY KEY (bucket, band, group_id)
);
CREATE INDEX chunk_group_bands_group_idx ON chunk_group_bands (group_id);

-- Every chunk row is an occurrence of its group (document, ordinal, pages, section).
ALTER TABLE chunks ADD COLUMN group_id text REFERENCES chunk_groups (group_id) ON DELETE SET NULL;
CREATE INDEX chunks_group_idx ON chunks (group_id);

-- Index rows are keyed by group from now on; owner_chunk_id names the occurrence whose text they carry.
DO $$
DECLARE v record;
BEGIN
    FOR v IN SELECT table_name FROM index_versions LOOP
        EXECUTE format('ALTER TABLE %I ADD COLUMN owner_chunk_id text', v.table_name);
        EXECUTE format('UPDATE %I SET owner_chunk_id = chunk_id', v.table_name);
        EXECUTE format('ALTER TABLE %I ALTER COLUMN owner_chunk_id SET NOT NULL', v.table_name);
    END LOOP;
END $$;

-- Existing documents are grouped on the next run (their vectors come from the embedding cache).
UPDATE documents SET status = 'pending_index' WHERE status = 'indexed';
