-- "retired" named two states: a version kept for rollback (its table kept, receiving every write) and a version
-- whose table was dropped. The kept one is "previous" now, and "retired" means dropped. A previous version is
-- reclaimed (dropped) by housekeeping once retention.rollback has passed since it stopped being active, unless it is
-- pinned; an alert goes out retention.rollback_warning before (reclaim_warned_at: once per version).
ALTER TABLE index_versions DROP CONSTRAINT IF EXISTS index_versions_status_check;
ALTER TABLE index_versions ADD CONSTRAINT index_versions_status_check
    CHECK (status IN ('building', 'ready', 'active', 'previous', 'retired'));
ALTER TABLE index_versions ADD COLUMN IF NOT EXISTS pinned_reason text;
ALTER TABLE index_versions ADD COLUMN IF NOT EXISTS reclaim_warned_at timestamptz;
COMMENT ON COLUMN index_versions.pinned_reason IS 'why a version is pinned: never reclaimed while this is set';

ALTER TABLE index_version_events DROP CONSTRAINT IF EXISTS index_version_events_event_check;
ALTER TABLE index_version_events ADD CONSTRAINT index_version_events_event_check
    CHECK (event IN ('build', 'promote', 'rollback', 'retire', 'drop', 'pin', 'unpin', 'reclaim_warning'));

DELETE FROM index_version_status_transitions
 WHERE (from_status, to_status) IN (('active', 'retired'), ('retired', 'active'));
INSERT INTO index_version_status_transitions (from_status, to_status) VALUES
    ('active', 'previous'), ('previous', 'active'), ('previous', 'retired')
ON CONFLICT DO NOTHING;

-- The versions kept for rollback become previous. No transition leads out of retired, so the status trigger
-- (sql/functions/10_status.sql, absent on a new database until the functions are applied) is off for this update.
ALTER TABLE index_versions DISABLE TRIGGER USER;
UPDATE index_versions SET status = 'previous' WHERE status = 'retired' AND dropped_at IS NULL;
ALTER TABLE index_versions ENABLE TRIGGER USER;
