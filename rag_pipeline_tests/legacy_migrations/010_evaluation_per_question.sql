-- Each evaluation keeps its per-question results, so a later one can be compared question by question and a
-- difference tested for significance (a baseline recorded before this has aggregates only).
ALTER TABLE retrieval_evaluations ADD COLUMN per_question jsonb;
