-- What a document is called: its title, its path and its sidecar metadata values, as term ids (rag_lexemes under
-- the English and the neutral configuration). Queries that name a document ("3M", "FY2018", "10-K") find it by
-- these and rank its chunks up (document-aware ranking, rag_pipeline.store.search).
CREATE FUNCTION rag_name_terms(title text, rel_path text, metadata jsonb) RETURNS integer[]
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(DISTINCT rag_term_id(l.term) ORDER BY rag_term_id(l.term)), '{}')
    FROM unnest(ARRAY['english', 'simple']::regconfig[]) AS cfg,
         rag_lexemes(cfg, concat_ws(' ', title, rel_path, regexp_replace(rel_path, '[/_.-]+', ' ', 'g'),
                                    (SELECT string_agg(value, ' ') FROM jsonb_each_text(metadata)))) AS l
$$;

ALTER TABLE documents ADD COLUMN name_terms integer[] NOT NULL DEFAULT '{}';
UPDATE documents SET name_terms = rag_name_terms(title, rel_path, metadata);
CREATE INDEX documents_name_terms_idx ON documents USING gin (name_terms);

-- Kept true wherever a document's name changes (discovery inserts and updates rows set-based).
CREATE FUNCTION rag_documents_name_terms() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.name_terms := rag_name_terms(NEW.title, NEW.rel_path, NEW.metadata);
    RETURN NEW;
END $$;

CREATE TRIGGER documents_name_terms BEFORE INSERT OR UPDATE OF title, rel_path, metadata ON documents
    FOR EACH ROW EXECUTE FUNCTION rag_documents_name_terms();
