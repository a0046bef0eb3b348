-- Why the latest scan of a source failed (a listing refused, credentials missing or wrong, anything raising) and
-- when; NULL once a scan of it completes. The staleness check fails such a source at once, not after its SLA.
ALTER TABLE sources ADD COLUMN last_scan_failed_at timestamptz;
ALTER TABLE sources ADD COLUMN last_scan_failure text;
