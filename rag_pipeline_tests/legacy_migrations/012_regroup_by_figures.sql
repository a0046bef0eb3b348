-- Near-duplicate groups now also require the same figures (rag_pipeline.dedup.figures_key), under a new LSH
-- key: indexed documents are regrouped on the next run (vectors come from the embedding cache).
UPDATE documents SET status = 'pending_index' WHERE status = 'indexed';
