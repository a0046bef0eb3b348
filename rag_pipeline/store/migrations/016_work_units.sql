-- Per-document work units (issue "per-document execution"). A worker leases one queued document at a time,
-- claimed with FOR UPDATE SKIP LOCKED so any number of workers in any number of processes share the queue
-- without doing a document twice. The worker renews its lease while it works; a worker that died stops
-- renewing, its lease lapses, and another worker takes the document. Writes still re-check the state the work
-- was planned for (documents.claim), so a lapsed lease can never let a stale result overwrite a newer one.
--
-- A lease also names the database session that keeps it (pid and start time of the worker's lease-keeping
-- connection): when that session is gone (the process died, the server restarted) the lease is void at once,
-- without waiting for it to lapse.
ALTER TABLE documents ADD COLUMN lease_owner text;
ALTER TABLE documents ADD COLUMN lease_expires_at timestamptz;
ALTER TABLE documents ADD COLUMN lease_backend_pid integer;
ALTER TABLE documents ADD COLUMN lease_backend_start timestamptz;
CREATE INDEX documents_leases_idx ON documents (lease_owner) WHERE lease_owner IS NOT NULL;

-- Parse and chunk run in one worker process per document: a document that exceeds its time or memory budget
-- while it is being chunked is dead-lettered from pending_chunk (reasons 'timeout' and 'memory').
INSERT INTO document_status_transitions (from_status, to_status) VALUES ('pending_chunk', 'dead_letter')
ON CONFLICT DO NOTHING;
