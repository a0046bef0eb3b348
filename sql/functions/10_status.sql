-- The transitions of rag_pipeline/domain/status.py, enforced where states change (document_status_transitions and
-- index_version_status_transitions, in the baseline): any UPDATE that moves a document or an index version along
-- an edge not listed there is refused.
--
-- Every file in sql/functions/ is re-applied, in name order, by every migrate() after the pending migrations:
-- each function, trigger function and view is written once, here, in its current form (CREATE OR REPLACE).
-- A trigger is an object on a table and is created only when missing: to change one, drop it in a migration.

CREATE OR REPLACE FUNCTION refuse_unlisted_document_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM document_status_transitions
                   WHERE from_status = OLD.status AND to_status = NEW.status) THEN
        RAISE EXCEPTION 'a document cannot go from % to % (%)', OLD.status, NEW.status, OLD.doc_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION refuse_unlisted_version_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM index_version_status_transitions
                   WHERE from_status = OLD.status AND to_status = NEW.status) THEN
        RAISE EXCEPTION 'an index version cannot go from % to % (v%)', OLD.status, NEW.status, OLD.version_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

-- A retired version whose table was dropped can never be active again.
CREATE OR REPLACE FUNCTION refuse_dropped_activation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'active' AND NEW.dropped_at IS NOT NULL THEN
        RAISE EXCEPTION 'v% was dropped and cannot be activated', NEW.version_id USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'documents'::regclass
                                              AND tgname = 'documents_status_transition') THEN
        CREATE TRIGGER documents_status_transition BEFORE UPDATE OF status ON documents
            FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
            EXECUTE FUNCTION refuse_unlisted_document_transition();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'index_versions'::regclass
                                              AND tgname = 'index_versions_status_transition') THEN
        CREATE TRIGGER index_versions_status_transition BEFORE UPDATE OF status ON index_versions
            FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
            EXECUTE FUNCTION refuse_unlisted_version_transition();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'index_versions'::regclass
                                              AND tgname = 'index_versions_no_dropped_activation') THEN
        CREATE TRIGGER index_versions_no_dropped_activation BEFORE UPDATE ON index_versions
            FOR EACH ROW EXECUTE FUNCTION refuse_dropped_activation();
    END IF;
END $$;
