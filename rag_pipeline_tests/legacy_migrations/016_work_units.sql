-- Per-document work units (issue "per-document execution"). A worker leases one queued document at a time,
-- claimed with FOR UPDATE SKIP LOCKED so any number of workers in any number of processes share the queue
-- without doing a document twice. Writes still re-check the state the work was planned for (documents.claim),
-- so a lease that lapsed can never let a stale result overwrite a newer one.
--
-- documents.lease_owner names the holder; work_leases says whether that holder is alive: the database session
-- that keeps its leases (pid and start time; when the session is gone, because the process died or the server
-- restarted, its leases are void at once) and when they lapse unless renewed (a process that hangs). Renewing
-- touches this one row, never the documents rows a scan may be updating.
CREATE TABLE work_leases (
    owner         text PRIMARY KEY,
    backend_pid   integer NOT NULL,
    backend_start timestamptz,
    expires_at    timestamptz NOT NULL
);
ALTER TABLE documents ADD COLUMN lease_owner text;
CREATE INDEX documents_leases_idx ON documents (lease_owner) WHERE lease_owner IS NOT NULL;

-- Parse and chunk run in one worker process per document: a document that exceeds its time or memory budget
-- while it is being chunked is dead-lettered from pending_chunk (reasons 'timeout', 'memory', 'crashed').
INSERT INTO document_status_transitions (from_status, to_status) VALUES ('pending_chunk', 'dead_letter')
ON CONFLICT DO NOTHING;
