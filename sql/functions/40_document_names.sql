-- What a document is called: its title, its path and its sidecar metadata values, as term ids (rag_lexemes under
-- the English and the neutral configuration), kept in documents.name_terms by the documents_name_terms trigger.
-- Queries that name a document ("3M", "FY2018", "10-K") find it by these and rank its chunks up (document routing,
-- 60_routing.sql). name_terms is stored: a change to what these functions return reaches rows as they are
-- written, and existing rows only when a migration recomputes them.

-- Leading letters of a path's capitalised, squashed parts, as text for rag_lexemes: a name written in capitals and
-- squashed in a file name ("MGMRESORTS_2022_10K", "CVSHEALTH_2018_10K") is also named by its leading letters, so
-- "MGM" and "CVS" meet it (the first 3 to n-3 letters of each capitalised letters-only part of 7 or more letters).
-- Lower-case parts ("datatype-uuid.html") are words already split by their separators and gain nothing.
CREATE OR REPLACE FUNCTION rag_name_prefixes(rel_path text) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(string_agg(left(part, n), ' '), '')
    FROM regexp_split_to_table(coalesce(rel_path, ''), '[^[:alnum:]]+') AS part,
         generate_series(3, least(length(part), 64) - 3) AS n
    WHERE part ~ '^[[:upper:]]{7,64}$'
$$;

CREATE OR REPLACE FUNCTION rag_name_terms(title text, rel_path text, metadata jsonb) RETURNS integer[]
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(DISTINCT rag_term_id(l.term) ORDER BY rag_term_id(l.term)), '{}')
    FROM unnest(ARRAY['english', 'simple']::regconfig[]) AS cfg,
         rag_lexemes(cfg, concat_ws(' ', title, rel_path, regexp_replace(rel_path, '[/_.-]+', ' ', 'g'),
                                    rag_name_prefixes(rel_path),
                                    (SELECT string_agg(value, ' ') FROM jsonb_each_text(metadata)))) AS l
$$;

-- Kept true wherever a document's name changes (discovery inserts and updates rows set-based).
CREATE OR REPLACE FUNCTION rag_documents_name_terms() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.name_terms := rag_name_terms(NEW.title, NEW.rel_path, NEW.metadata);
    RETURN NEW;
END $$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'documents'::regclass
                                              AND tgname = 'documents_name_terms') THEN
        CREATE TRIGGER documents_name_terms BEFORE INSERT OR UPDATE OF title, rel_path, metadata ON documents
            FOR EACH ROW EXECUTE FUNCTION rag_documents_name_terms();
    END IF;
END $$;
