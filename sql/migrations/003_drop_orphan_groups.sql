-- Near-duplicate groups left with no chunk. A re-chunk emptied a group when another document owned its row and had
-- been indexed before the re-chunk (store.chunks.replace_chunks now drops such groups itself); the deletion_replay
-- check failed on them. A group being opened commits with its first chunk, so none here is in flight.
DELETE FROM chunk_groups g WHERE NOT EXISTS (SELECT 1 FROM chunks c WHERE c.group_id = g.group_id);
