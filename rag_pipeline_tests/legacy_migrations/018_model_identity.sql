-- Model identity (issue "scale out"): an index version and the embedding cache name the model's weights and the
-- backend that ran them (`torch:sha256:…`, `onnx-int8:sha256:…`, `remote:<served name>`), never an install path.
-- Until now the cache was keyed by the configured name and model_revision held the folder the model loaded from.
--
-- Hashing weight files cannot happen in SQL: versions from before this migration keep model_identity NULL until a
-- process that can read their weights records it (rag_pipeline.versions.adopt_model_identities), and moves their
-- cache rows to the new key in the same transaction. Until then they are not written to.
ALTER TABLE index_versions ADD COLUMN model_identity text;

COMMENT ON COLUMN index_versions.embedding_model IS
    'the model as its backend runs it, for people and for loading: hub or package name, or the folder''s name';
COMMENT ON COLUMN index_versions.model_revision IS 'sha256 of the weight files (remote: the served model''s name)';
COMMENT ON COLUMN index_versions.model_identity IS
    'backend and weights (rag_pipeline.ids.model_key): the embedding cache key of this version''s vectors';
COMMENT ON COLUMN embedding_cache.model IS 'the model identity (index_versions.model_identity) that made the vector';
