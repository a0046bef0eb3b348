-- Golden-set evaluations run by the retrieval_quality check. The first evaluation of the active version
-- (for a given golden set and k) is its baseline, until `rag-pipeline eval --set-baseline` replaces it;
-- a version being built is compared with the active version's baseline.
CREATE TABLE retrieval_evaluations (
    id           bigint PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
    version_id   integer NOT NULL REFERENCES index_versions (version_id),
    golden_sha   text NOT NULL,             -- sha256 of the golden set's bytes, its labels and k
    k            integer NOT NULL,
    index_state  text NOT NULL,             -- what the index looked like: an unchanged index is not re-evaluated
    metrics      jsonb NOT NULL,            -- slice -> metric -> value, as rag_pipeline.evaluation.aggregate
    is_baseline  boolean NOT NULL DEFAULT false,
    evaluated_at timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX retrieval_evaluations_one_baseline
    ON retrieval_evaluations (version_id, golden_sha) WHERE is_baseline;
CREATE INDEX retrieval_evaluations_latest ON retrieval_evaluations (version_id, golden_sha, id DESC);
