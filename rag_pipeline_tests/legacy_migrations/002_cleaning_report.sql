-- What cleaning removed from each document, in characters per rule (running headers/footers, page
-- numbers, TOC leaders, watermarks, hyphenation, whitespace).
ALTER TABLE documents ADD COLUMN cleaning jsonb NOT NULL DEFAULT '{}'::jsonb;
