-- parse_health counted near-empty and textless pages by measuring every page's markdown (length(btrim(markdown)),
-- decompressing the long ones) at every check, a no-op refresh's included: about 2 s of a refresh's 24,000 pages
-- under load, growing with the corpus. The length is kept beside the page instead, computed as the page is written,
-- and the pages without text are indexed, so the check reads the few documents that may have none.
ALTER TABLE document_pages ADD COLUMN text_chars integer GENERATED ALWAYS AS (length(btrim(markdown))) STORED;
CREATE INDEX document_pages_textless ON document_pages (doc_id) WHERE text_chars = 0;
