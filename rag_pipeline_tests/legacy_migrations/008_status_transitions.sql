-- The transitions of rag_pipeline/status.py, enforced where states change: any UPDATE that moves a document
-- or an index version along an edge not listed here is refused (a test keeps these rows and status.py in step).
CREATE TABLE document_status_transitions (
    from_status text NOT NULL,
    to_status   text NOT NULL,
    PRIMARY KEY (from_status, to_status)
);
INSERT INTO document_status_transitions (from_status, to_status) VALUES
    ('pending_parse', 'pending_chunk'), ('pending_parse', 'indexed'), ('pending_parse', 'dead_letter'),
    ('pending_parse', 'held_no_labels'),
    ('pending_chunk', 'pending_index'), ('pending_chunk', 'pending_parse'), ('pending_chunk', 'held_no_labels'),
    ('pending_index', 'indexed'), ('pending_index', 'pending_chunk'), ('pending_index', 'pending_parse'),
    ('pending_index', 'held_no_labels'),
    ('indexed', 'pending_index'), ('indexed', 'pending_chunk'), ('indexed', 'pending_parse'),
    ('indexed', 'held_no_labels'),
    ('dead_letter', 'pending_parse'), ('dead_letter', 'held_no_labels'),
    ('held_no_labels', 'pending_parse');

CREATE TABLE index_version_status_transitions (
    from_status text NOT NULL,
    to_status   text NOT NULL,
    PRIMARY KEY (from_status, to_status)
);
INSERT INTO index_version_status_transitions (from_status, to_status) VALUES
    ('building', 'ready'), ('building', 'active'), ('building', 'retired'),
    ('ready', 'active'), ('ready', 'retired'),
    ('active', 'retired'),
    ('retired', 'active');

CREATE FUNCTION refuse_unlisted_document_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM document_status_transitions
                   WHERE from_status = OLD.status AND to_status = NEW.status) THEN
        RAISE EXCEPTION 'a document cannot go from % to % (%)', OLD.status, NEW.status, OLD.doc_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER documents_status_transition BEFORE UPDATE OF status ON documents
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION refuse_unlisted_document_transition();

CREATE FUNCTION refuse_unlisted_version_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM index_version_status_transitions
                   WHERE from_status = OLD.status AND to_status = NEW.status) THEN
        RAISE EXCEPTION 'an index version cannot go from % to % (v%)', OLD.status, NEW.status, OLD.version_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER index_versions_status_transition BEFORE UPDATE OF status ON index_versions
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION refuse_unlisted_version_transition();

-- A retired version whose table was dropped can never be active again.
CREATE FUNCTION refuse_dropped_activation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'active' AND NEW.dropped_at IS NOT NULL THEN
        RAISE EXCEPTION 'v% was dropped and cannot be activated', NEW.version_id USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER index_versions_no_dropped_activation BEFORE UPDATE ON index_versions
    FOR EACH ROW EXECUTE FUNCTION refuse_dropped_activation();
