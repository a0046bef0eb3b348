-- Erasure on request (rag-pipeline erase): an audit record per erased document that says when and what was
-- removed, never the text or the path. The document is named by an HMAC of its id under a key kept outside the
-- database (RAG_PIPELINE_ERASURE_KEY): a plain hash of a path could be confirmed by guessing the path.
CREATE TABLE erasures (
    id          bigint PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
    erased_at   timestamptz NOT NULL DEFAULT now(),
    subject     text NOT NULL,          -- hex HMAC-SHA256 of the document id
    scope       text NOT NULL CHECK (scope IN ('document', 'source')),
    removed     jsonb NOT NULL          -- rows removed, per table
);
CREATE INDEX erasures_subject ON erasures (subject);
