-- Flags raised on a chunk's text at ingest (rag_pipeline.safety): prompt-injection patterns, for now.
-- Search results carry them so the application can treat flagged text as data, never as instructions.
ALTER TABLE chunks ADD COLUMN flags text[] NOT NULL DEFAULT '{}';
CREATE INDEX chunks_flagged_idx ON chunks (doc_id) WHERE cardinality(flags) > 0;

-- Existing chunks are flagged by re-chunking them on the next run (vectors come from the embedding cache).
UPDATE documents SET status = 'pending_chunk' WHERE status IN ('indexed', 'pending_index');
