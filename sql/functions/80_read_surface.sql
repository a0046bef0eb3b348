-- The index in applications' hands: the search ranking lives in the database, so an application can search with
-- SQL alone and the pipeline's own search (rag_pipeline.store.search) runs the very same functions. Everything
-- applications use is in schema `rag`, whose objects are never dropped or re-created by a promotion or a rollback
-- (and are replaced in place here, by every migrate()): GRANTs on them stay.
--
--   rag.search(query_embedding, query_text, labels, k, mode)   the stable entry point (SECURITY DEFINER): the
--       active version, the configured ranking, the label filter inside; the labels a role may pass are bound to it
--       in rag.role_labels, so EXECUTE on it alone lets a role search, and read nothing else.
--   rag.indexed_chunks                                          the reporting view (administrators): every row of
--       the active version with its labels.
--
-- The internal functions (rag.search_version and the lists it fuses) run with their caller's privileges.

-- Refuses a caller (the session's login role) that may CREATE in a schema the definer functions resolve names in.
CREATE OR REPLACE FUNCTION rag.refuse_writable_search_path() RETURNS void LANGUAGE plpgsql STABLE AS $$
DECLARE
    writable text;
BEGIN
    -- Everything here is schema-qualified: this runs before anything a caller could have planted is ruled out.
    SELECT pg_catalog.string_agg(n.nspname::text, ', ') INTO writable
    FROM pg_catalog.pg_namespace n
    WHERE n.nspname OPERATOR(pg_catalog.=) ANY (pg_catalog.current_schemas(false))
      AND pg_catalog.has_schema_privilege(session_user, n.oid, 'CREATE')
      AND NOT pg_catalog.pg_has_role(session_user, n.nspowner, 'USAGE');
    IF writable IS NOT NULL THEN
        RAISE EXCEPTION 'role % may create objects in schema % that rag.search resolves names in: revoke that '
            '(REVOKE CREATE ON SCHEMA % FROM PUBLIC, %) before it may search', session_user, writable, writable,
            session_user USING ERRCODE = 'insufficient_privilege';
    END IF;
END $$;

-- The stable entry point for applications. Runs as its owner (the pipeline's role), so a caller needs only
-- EXECUTE on it (and USAGE on schema rag). The caller is the session's login role: it must have a row in
-- rag.role_labels, and may pass only labels that row allows (a label it is not allowed is refused, never
-- dropped silently, so a misconfigured application fails loudly instead of quietly seeing less).
CREATE OR REPLACE FUNCTION rag.search(
    query_embedding halfvec, query_text text, labels text[], k integer DEFAULT 10, mode text DEFAULT 'hybrid'
) RETURNS TABLE (
    chunk_id text, doc_id text, source text, path text, page_start integer, page_end integer, section_path text,
    content_type text, text text, prefix text, score double precision, dense_rank bigint, sparse_rank bigint,
    similarity double precision, occurrences bigint, flags text[]
) LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    allowed text[];
    refused text[];
    active_id integer;
    active_dims integer;
BEGIN
    -- A caller that may create objects where this function resolves names could plant an operator or function
    -- that runs with the owner's rights (an exact-type `&&` beats pg_catalog's): such a caller is refused.
    PERFORM rag.refuse_writable_search_path();
    SELECT r.labels INTO allowed FROM rag.role_labels r WHERE r.role_name = session_user::regrole;
    IF allowed IS NULL THEN
        RAISE EXCEPTION 'role % may not search: it has no row in rag.role_labels', session_user
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF labels IS NULL OR cardinality(labels) = 0 OR array_position(labels, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'a search needs the caller''s labels; there is no unlabelled search'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT array_agg(l) INTO refused FROM unnest(labels) AS l WHERE NOT l = ANY(allowed);
    IF refused IS NOT NULL THEN
        RAISE EXCEPTION 'role % may not search with labels %', session_user, refused
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF k IS NULL OR k < 1 OR k > 1000 THEN
        RAISE EXCEPTION 'k must be between 1 and 1000, not %', k USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF query_text IS NULL OR btrim(query_text) = '' OR length(query_text) > 10000 THEN
        RAISE EXCEPTION 'query_text must be 1 to 10000 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT v.version_id, v.dimensions INTO active_id, active_dims
        FROM index_alias a JOIN index_versions v USING (version_id) WHERE a.alias = 'active';
    IF active_id IS NULL THEN
        RAISE EXCEPTION 'there is no active index version yet' USING ERRCODE = 'undefined_table';
    END IF;
    IF query_embedding IS NOT NULL AND vector_dims(query_embedding) <> active_dims THEN
        RAISE EXCEPTION 'query_embedding has % dimensions; the active index version (%) holds %',
            vector_dims(query_embedding), active_id, active_dims USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- No options: rag.search_version ranks with the configured ones (rag.search_settings).
    RETURN QUERY SELECT * FROM rag.search_version(active_id, query_embedding, query_text, labels, k, mode, NULL);
END $$;

-- Every row of the active version, with its labels: for administrators' reports (GRANT SELECT on the view and
-- EXECUTE on the function). Never dropped (replaced in place), so GRANTs and views built on it survive promotions.
CREATE OR REPLACE FUNCTION rag.active_rows() RETURNS TABLE (
    version_id integer, chunk_id text, owner_chunk_id text, doc_id text, source text, path text, ordinal integer,
    section_path text, page_start integer, page_end integer, content_type text, text text, prefix text,
    acl_labels text[], embedding_input_sha text
) LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
DECLARE
    active_id integer;
BEGIN
    PERFORM rag.refuse_writable_search_path();
    SELECT a.version_id INTO active_id FROM index_alias a WHERE a.alias = 'active';
    IF active_id IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY EXECUTE format(
        'SELECT $1, t.chunk_id, t.owner_chunk_id, t.doc_id, d.source, d.rel_path, t.ordinal, t.section_path,
                t.page_start, t.page_end, t.content_type, t.text, t.prefix, t.acl_labels, t.embedding_input_sha
         FROM %I t JOIN documents d USING (doc_id)', rag.version_table(active_id))
        USING active_id;
END $$;

CREATE OR REPLACE VIEW rag.indexed_chunks AS SELECT * FROM rag.active_rows();

-- Functions are executable by PUBLIC unless revoked: only what is granted explicitly may run (the baseline's default
-- privileges cover the functions the migrating role creates later; this, any created otherwise).
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA rag FROM PUBLIC;

-- The definer functions resolve names only in the schema the pipeline's tables are in (and pgvector's), never in a
-- caller's temporary schema. (Set here, after their definitions: CREATE OR REPLACE resets a function's SET clauses.)
DO $$
DECLARE
    path text := format('%I, %I, pg_temp', current_schema(),
                        (SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
                         WHERE e.extname = 'vector'));
BEGIN
    EXECUTE format('ALTER FUNCTION rag.search(halfvec, text, text[], integer, text) SET search_path = %s', path);
    EXECUTE format('ALTER FUNCTION rag.active_rows() SET search_path = %s', path);
END $$;
