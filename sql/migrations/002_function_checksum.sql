-- Which definitions of sql/functions/ the database holds, as one checksum over the files: a process that starts
-- against a database whose functions are current runs no DDL (replacing a view takes an exclusive lock on
-- the view, and would queue every reader behind one long query at each start). `rag-pipeline migrate` re-applies
-- them whatever the checksum says.
CREATE TABLE schema_functions (
    only_row   boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- A column comment that named a function by a name it no longer has.
COMMENT ON COLUMN index_versions.model_identity IS
    'backend and weights (rag_pipeline.domain.ids.ModelIdentity.key): the embedding cache key of this version''s vectors';
