-- Blue/green lifecycle: when a retired version's table was dropped, and every promotion, rollback and
-- retirement with its gate results (a forced promotion is recorded as such).
ALTER TABLE index_versions ADD COLUMN dropped_at timestamptz;

CREATE TABLE index_version_events (
    id          bigint PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
    version_id  integer NOT NULL REFERENCES index_versions (version_id),
    event       text NOT NULL CHECK (event IN ('build', 'promote', 'rollback', 'retire', 'drop')),
    forced      boolean NOT NULL DEFAULT false,
    detail      jsonb NOT NULL DEFAULT '{}'::jsonb,
    at          timestamptz NOT NULL DEFAULT now()
);
