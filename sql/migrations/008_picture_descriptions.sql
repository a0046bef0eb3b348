-- What a vision-language model said a document's picture shows (rag_pipeline.parsing.descriptions), paid once per
-- (document, the cropped picture's PNG bytes, prompt version, model): a re-parse of a changed document asks again
-- only for pictures that changed. Derived from the document, so it goes with it (deletion, erasure).
CREATE TABLE IF NOT EXISTS picture_descriptions (
    doc_id          text NOT NULL REFERENCES documents (doc_id) ON DELETE CASCADE,
    image_sha256    text NOT NULL,
    prompt_version  text NOT NULL,
    model           text NOT NULL,
    description     text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (doc_id, image_sha256, prompt_version, model)
);
