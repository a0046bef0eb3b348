-- Fail closed at the source (issue "fail closed"): two more reasons to hold a document back, and deletions a
-- scan refused to carry out.
--
-- held_bad_sidecar: a sidecar that applies to the file (its own, or a folder's above it) cannot be read or
-- validated; held_hard_link: the file has other names, which may carry other labels; held_source_removed: its
-- source was removed from the configuration (served again if it comes back; `erase --source` removes it). Like
-- held_no_labels, a held document has nothing in the index; documents.held_reason says why.
ALTER TABLE documents DROP CONSTRAINT documents_status_check;
ALTER TABLE documents ADD CONSTRAINT documents_status_check CHECK (status IN (
    'pending_parse', 'pending_chunk', 'pending_index', 'indexed', 'dead_letter',
    'held_no_labels', 'held_bad_sidecar', 'held_hard_link', 'held_source_removed'));
ALTER TABLE documents ADD COLUMN held_reason text;

INSERT INTO document_status_transitions (from_status, to_status)
SELECT f.status, t.status
FROM (VALUES ('pending_parse'), ('pending_chunk'), ('pending_index'), ('indexed'), ('dead_letter'),
             ('held_no_labels'), ('held_bad_sidecar'), ('held_hard_link'), ('held_source_removed')) AS f (status),
     (VALUES ('held_no_labels'), ('held_bad_sidecar'), ('held_hard_link'), ('held_source_removed')) AS t (status)
WHERE f.status <> t.status
ON CONFLICT DO NOTHING;
-- A released document is parsed again, or re-chunked from the pages it kept while held.
INSERT INTO document_status_transitions (from_status, to_status)
VALUES ('held_bad_sidecar', 'pending_parse'), ('held_hard_link', 'pending_parse'),
       ('held_source_removed', 'pending_parse'), ('held_no_labels', 'pending_chunk'),
       ('held_bad_sidecar', 'pending_chunk'), ('held_hard_link', 'pending_chunk'),
       ('held_source_removed', 'pending_chunk')
ON CONFLICT DO NOTHING;

-- Where a source was registered from: the configuration file, or a command line (`ingest --source NAME=PATH`).
-- A configured source that leaves the file is no longer scanned and its documents are held at once; one given on
-- a command line keeps being refreshed.
ALTER TABLE sources ADD COLUMN origin text NOT NULL DEFAULT 'config' CHECK (origin IN ('config', 'command_line'));

-- A scan that would empty a source (an unmounted root) or delete more than its max_deletion_share deletes
-- nothing: it records what it held back and why, and staleness fails for the source until the deletions are
-- confirmed (rag-pipeline ingest --confirm-deletions SOURCE).
ALTER TABLE source_scans ADD COLUMN deletions_held integer NOT NULL DEFAULT 0;
ALTER TABLE source_scans ADD COLUMN held_reason text;
