-- Every chunk records the parser version of the text it was cut from (beside its chunker version).
ALTER TABLE chunks ADD COLUMN parser_version text;
UPDATE chunks c SET parser_version = d.parser_version FROM documents d WHERE d.doc_id = c.doc_id;
