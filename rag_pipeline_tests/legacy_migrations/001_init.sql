-- rag_pipeline schema, version 1: everything the index needs from day one.
-- Per-version chunk tables (index_v<N>) are created by rag_pipeline.store.create_index_version,
-- because their vector dimension depends on the embedding model of that version.

CREATE EXTENSION IF NOT EXISTS vector;

-- A folder (later: a bucket prefix) that documents come from.
CREATE TABLE sources (
    name                    text PRIMARY KEY,
    root                    text NOT NULL,
    include_patterns        text[] NOT NULL,
    default_acl_labels      text[] NOT NULL DEFAULT '{}',
    freshness_sla_seconds   integer NOT NULL,
    last_scan_started_at    timestamptz,
    last_scan_completed_at  timestamptz,
    created_at              timestamptz NOT NULL DEFAULT now()
);

-- One row per live document. Identity is (source, rel_path), never the bytes.
-- A document deleted at its source loses its row (cascading to every derived table and every
-- index version) and is remembered in deletion_log.
CREATE TABLE documents (
    doc_id          text PRIMARY KEY,
    source          text NOT NULL REFERENCES sources (name) ON DELETE CASCADE,
    rel_path        text NOT NULL,
    fingerprint     text NOT NULL,            -- cheap: size + mtime; decides whether to parse at all
    size_bytes      bigint NOT NULL,
    modified_at     timestamptz NOT NULL,
    content_hash    text,                     -- sha256 of the cleaned text; decides whether to re-chunk/embed
    indexed_content_hash text,                -- the content_hash whose chunks are in the index now
    acl_labels      text[] NOT NULL DEFAULT '{}',
    title           text,
    metadata        jsonb NOT NULL DEFAULT '{}'::jsonb,
    status          text NOT NULL CHECK (status IN (
                        'pending_parse', 'pending_chunk', 'pending_index',
                        'indexed', 'dead_letter', 'held_no_labels')),
    parser_version  text,
    chunker_version text,
    page_count      integer,
    first_seen      timestamptz NOT NULL DEFAULT now(),
    -- Last scan that found this row's file or metadata changed. Rows are not rewritten on every scan
    -- (that would make a no-op refresh cost O(corpus)); every live row was seen at sources.last_scan_completed_at.
    last_seen       timestamptz NOT NULL DEFAULT now(),
    changed_at      timestamptz NOT NULL DEFAULT now(),  -- when work on it last became due (staleness)
    parsed_at       timestamptz,
    indexed_at      timestamptz,
    UNIQUE (source, rel_path)
);
CREATE INDEX documents_status_idx ON documents (status, doc_id);
CREATE INDEX documents_acl_idx ON documents USING gin (acl_labels);

-- Per-page parse record: which tier produced the page, the signals that decided it, and its text.
CREATE TABLE document_pages (
    doc_id          text NOT NULL REFERENCES documents (doc_id) ON DELETE CASCADE,
    page            integer NOT NULL,         -- 1-based
    tier            text NOT NULL,
    signals         jsonb NOT NULL DEFAULT '{}'::jsonb,
    parser_version  text NOT NULL,
    seconds         double precision NOT NULL,
    markdown        text NOT NULL,
    PRIMARY KEY (doc_id, page)
);

-- Version-independent chunks (text + structure). Index versions copy them and add vectors,
-- so a new embedding model re-embeds without re-parsing or re-chunking.
CREATE TABLE chunks (
    chunk_id        text PRIMARY KEY,
    doc_id          text NOT NULL REFERENCES documents (doc_id) ON DELETE CASCADE,
    ordinal         integer NOT NULL,
    text            text NOT NULL,
    prefix          text NOT NULL DEFAULT '', -- contextual prefix, stored apart from the text
    section_path    text NOT NULL DEFAULT '',
    page_start      integer NOT NULL,
    page_end        integer NOT NULL,
    content_type    text NOT NULL DEFAULT 'prose',
    token_count     integer NOT NULL,
    content_hash    text NOT NULL,            -- sha256 of text
    chunker_version text NOT NULL,
    UNIQUE (doc_id, ordinal)
);

-- Registry of index versions (blue/green). Exactly one is active; index_alias names it.
CREATE TABLE index_versions (
    version_id       integer PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
    table_name       text NOT NULL UNIQUE,
    embedding_model  text NOT NULL,           -- as configured (hub name or path)
    model_revision   text,                    -- resolved path / revision actually loaded
    dimensions       integer NOT NULL CHECK (dimensions > 0),
    chunker_version  text NOT NULL,
    parser_version   text NOT NULL,
    status           text NOT NULL CHECK (status IN ('building', 'ready', 'active', 'retired')),
    created_at       timestamptz NOT NULL DEFAULT now(),
    build_started_at timestamptz NOT NULL DEFAULT now(),
    ready_at         timestamptz,
    promoted_at      timestamptz,
    retired_at       timestamptz,
    row_count        bigint NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX index_versions_one_active ON index_versions ((true)) WHERE status = 'active';

-- The pointer readers follow; promotion and rollback update this one row atomically.
CREATE TABLE index_alias (
    alias       text PRIMARY KEY,
    version_id  integer NOT NULL REFERENCES index_versions (version_id),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Embeddings cached by (model, sha256 of the exact embedding input): unchanged inputs never re-embed.
CREATE TABLE embedding_cache (
    model       text NOT NULL,
    input_sha   text NOT NULL,
    embedding   halfvec NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (model, input_sha)
);

-- LLM-written contextual prefixes, paid once per (document content, chunk content, prompt version).
CREATE TABLE prefix_cache (
    doc_id          text NOT NULL REFERENCES documents (doc_id) ON DELETE CASCADE,
    doc_content_hash text NOT NULL,
    chunk_hash      text NOT NULL,
    prompt_version  text NOT NULL,
    prefix          text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (doc_content_hash, chunk_hash, prompt_version, doc_id)
);

-- Every deletion observed at a source, for deletion replay into versions built from a point in time.
CREATE TABLE deletion_log (
    id          bigint PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
    doc_id      text NOT NULL,
    source      text NOT NULL,
    rel_path    text NOT NULL,
    deleted_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX deletion_log_doc_idx ON deletion_log (doc_id);
CREATE INDEX deletion_log_time_idx ON deletion_log (deleted_at);

-- Documents that could not be parsed, with a specific reason. Retried when their fingerprint changes.
CREATE TABLE dead_letters (
    doc_id          text PRIMARY KEY REFERENCES documents (doc_id) ON DELETE CASCADE,
    reason          text NOT NULL,            -- empty | truncated | corrupt | encrypted | unsupported | parser_error
    detail          text NOT NULL DEFAULT '',
    fingerprint     text NOT NULL,
    attempts        integer NOT NULL DEFAULT 1,
    first_failed_at timestamptz NOT NULL DEFAULT now(),
    last_failed_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per scan of a source, for staleness checks and the UI.
CREATE TABLE source_scans (
    id          bigint PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
    source      text NOT NULL REFERENCES sources (name) ON DELETE CASCADE,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz,
    files_seen  integer,
    new_docs    integer,
    changed     integer,
    deleted     integer
);
