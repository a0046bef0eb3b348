-- What one step of an ingest run hands to the next (issue "scale out"): the document steps' statistics, small
-- JSON documents. Kept in the index database, which every machine of a distributed run already reaches, so a run
-- spread over a Dask cluster needs no shared filesystem or object store for them. An asset's latest value is
-- kept under run_id 'asset' and its key; other rows older than a week are removed as new ones are written.
CREATE TABLE run_outputs (
    run_id      text NOT NULL,
    step_key    text NOT NULL,
    output_name text NOT NULL,
    value       jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, step_key, output_name)
);
CREATE INDEX run_outputs_created_idx ON run_outputs (created_at);
