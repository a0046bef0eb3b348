-- What a document is called: its title (a sidecar's), its path, its sidecar metadata values and what it says it is
-- (rag.identity_words: its organisation and the organisation's initials, kind, year, quarter), as term ids (rag_lexemes under
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

-- The words a document's identity names it by: its organisation, the organisation's initials ("Advanced Micro
-- Devices, Inc." is also "AMD"; three letters or more, the legal form left out) and its period as a question says it
-- ("2015", "FY2015", "Q2", "2022Q2"). Not a title read from the document, nor its kind: their words are the
-- document's topic ("in this paper"), and a query's topic words must rank within it, not be taken for its name (on
-- the long documents of bench.retrieval's tune half, routing by them cost 0.048 page hit@5; a sidecar's title still
-- names). The kind still chooses "the latest annual report" (rag.document_names).
CREATE OR REPLACE FUNCTION rag.identity_words(p_identity jsonb) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT concat_ws(' ', p_identity ->> 'organisation',
                     (SELECT CASE WHEN count(*) >= 3 THEN string_agg(left(w, 1), '' ORDER BY n) END
                      FROM regexp_split_to_table(coalesce(p_identity ->> 'organisation', ''), '[^[:alnum:]&]+')
                           WITH ORDINALITY AS x(w, n)
                      WHERE w ~ '^[[:alpha:]]' AND lower(w) NOT IN (
                          'the', 'of', 'and', 'inc', 'incorporated', 'corp', 'corporation', 'co', 'company', 'ltd',
                          'limited', 'llc', 'plc', 'group', 'holdings', 'sa', 'ag', 'nv', 'se')),
                     p_identity ->> 'year', 'fy' || (p_identity ->> 'year'),
                     'q' || (p_identity ->> 'quarter'), (p_identity ->> 'year') || 'q' || (p_identity ->> 'quarter'))
$$;

-- A document's identity with its sidecar's word over it: the title column (a sidecar's `title`), and the sidecar
-- metadata keys organisation (or organization), kind, year, quarter and period_end (any of the last three replaces
-- all three). `found` says where each field came from ("sidecar" where the sidecar gave it).
CREATE OR REPLACE FUNCTION rag.document_identity(p_title text, p_metadata jsonb, p_identity jsonb)
RETURNS jsonb LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    WITH sidecar AS (
        SELECT jsonb_strip_nulls(jsonb_build_object(
            'title', nullif(btrim(p_title), ''),
            'organisation', nullif(btrim(coalesce(p_metadata ->> 'organisation', p_metadata ->> 'organization')), ''),
            'kind', nullif(btrim(p_metadata ->> 'kind'), ''),
            'year', substring(p_metadata ->> 'year' from '^\s*((?:19|20)[0-9]{2})\s*$')::integer,
            'quarter', substring(p_metadata ->> 'quarter' from '^\s*[qQ]?([1-4])\s*$')::integer,
            'period_end', substring(p_metadata ->> 'period_end' from '^\s*([0-9]{4}-[0-9]{2}-[0-9]{2})\s*$'))) AS given
    )
    -- a year or a period end the sidecar gives replaces the whole period read from the document (its year from the
    -- period end when it gives none); a quarter alone replaces the quarter
    SELECT (coalesce(p_identity, '{}') - 'found'
            - CASE WHEN s.given ?| ARRAY['year', 'period_end'] THEN ARRAY['year', 'quarter', 'period_end']
                   ELSE ARRAY[]::text[] END)
           || CASE WHEN s.given ? 'period_end' AND NOT s.given ? 'year'
                   THEN jsonb_build_object('year', left(s.given ->> 'period_end', 4)::integer) ELSE '{}' END
           || s.given
           || jsonb_build_object('found', coalesce(p_identity -> 'found', '{}')
                                          || coalesce((SELECT jsonb_object_agg(k, 'sidecar')
                                                       FROM jsonb_object_keys(s.given) AS k), '{}'))
    FROM sidecar s
$$;

-- Kept true wherever a document's name changes (discovery inserts and updates rows set-based, parsing writes the
-- identity). The identity is read through to_jsonb(NEW), and the trigger lists the column only where it exists:
-- these functions also apply to a schema from before migration 007 (the upgrade tests build one).
CREATE OR REPLACE FUNCTION rag_documents_name_terms() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.name_terms := rag_name_terms(
        concat_ws(' ', NEW.title, rag.identity_words(
            rag.document_identity(NEW.title, NEW.metadata, to_jsonb(NEW) -> 'identity'))),
        NEW.rel_path, NEW.metadata);
    RETURN NEW;
END $$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'documents'::regclass
                                              AND tgname = 'documents_name_terms') THEN
        EXECUTE format('CREATE TRIGGER documents_name_terms BEFORE INSERT OR UPDATE OF title, rel_path, metadata%s '
                       'ON documents FOR EACH ROW EXECUTE FUNCTION rag_documents_name_terms()',
                       CASE WHEN EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'documents'::regclass
                                                                      AND attname = 'identity' AND NOT attisdropped)
                            THEN ', identity' ELSE '' END);
    END IF;
END $$;
