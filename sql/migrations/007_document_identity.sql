-- What a document says it is, read from its PDF metadata and first pages when it is chunked
-- (rag_pipeline.text.identity): {title, organisation, kind, year, quarter, period_end, found: {field: where it was
-- read}}. Sidecar metadata overrides it (rag.document_identity). Rows chunked before this migration hold '{}' until
-- they are chunked again (the chunker version changed with it, so the next ingest re-chunks every document).
ALTER TABLE documents ADD COLUMN IF NOT EXISTS identity jsonb NOT NULL DEFAULT '{}'::jsonb;

-- A document's name now includes its identity: the trigger that keeps name_terms also fires when identity changes.
-- (On a new database the trigger does not exist yet: sql/functions/40_document_names.sql creates it.)
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'documents'::regclass AND tgname = 'documents_name_terms') THEN
        DROP TRIGGER documents_name_terms ON documents;
        CREATE TRIGGER documents_name_terms BEFORE INSERT OR UPDATE OF title, rel_path, metadata, identity ON documents
            FOR EACH ROW EXECUTE FUNCTION rag_documents_name_terms();
    END IF;
END $$;
