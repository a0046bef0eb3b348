-- An erased document that appears again at its source is held (`held_erased`) until someone re-admits it
-- (`rag-pipeline erase --undo`), which the audit table records as a 'readmit' row (named by the same HMAC).
-- The status is added to whatever the check lists now (another migration may have added one of its own).
DO $$
DECLARE
    current_check text := pg_get_constraintdef(
        (SELECT oid FROM pg_constraint WHERE conrelid = 'documents'::regclass AND conname = 'documents_status_check'));
BEGIN
    IF current_check NOT LIKE '%held_erased%' THEN
        EXECUTE 'ALTER TABLE documents DROP CONSTRAINT documents_status_check';
        EXECUTE 'ALTER TABLE documents ADD CONSTRAINT documents_status_check '
                || replace(current_check, 'ARRAY[', 'ARRAY[''held_erased''::text, ');
    END IF;
END $$;

-- Held like the other held states: from any state, and released to parsing or chunking (rag_pipeline/domain/status.py).
INSERT INTO document_status_transitions (from_status, to_status)
SELECT f.status, 'held_erased' FROM (SELECT DISTINCT from_status AS status FROM document_status_transitions) f
UNION SELECT 'held_erased', t.status FROM (SELECT DISTINCT to_status AS status FROM document_status_transitions
                                           WHERE to_status LIKE 'held\_%' OR to_status IN ('pending_parse', 'pending_chunk')) t
ON CONFLICT DO NOTHING;

ALTER TABLE erasures DROP CONSTRAINT erasures_scope_check;
ALTER TABLE erasures ADD CONSTRAINT erasures_scope_check CHECK (scope IN ('document', 'source', 'readmit'));
