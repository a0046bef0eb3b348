-- Tokenising, the same at index and query time: the terms of a text (rag_lexemes) and the integer keys terms and
-- labels are stored under (rag_term_id, rag_label_term_id). The BM25 structures, the query side of the ranking and
-- document names all go through these.

-- Terms as users type them, the same at index and query time, callable from SQL: the configuration's lexemes
-- (stemmed for the document's language, stop words removed), identifiers kept whole (10-K, FY2019-Q2,
-- pg_stat_activity, 240.13a-15) that the default parser would split, and the number inside a code (FY2018).
-- A term may come out twice (e.g. 2018 from "2018" and from "FY2018"): callers sum by term.
CREATE OR REPLACE FUNCTION rag_lexemes(config regconfig, body text) RETURNS TABLE (term text, tf integer)
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    WITH parsed AS (
        SELECT lexeme AS term, coalesce(array_length(positions, 1), 1) AS tf FROM unnest(to_tsvector(config, body))
    ), compounds AS (
        SELECT lower(m[1]) AS term, count(*)::integer AS tf
        FROM regexp_matches(body, '([[:alnum:]]+(?:[-_./][[:alnum:]]+)+)', 'g') AS m
        GROUP BY 1
    )
    SELECT term, tf FROM parsed WHERE length(term) <= 64
    UNION ALL
    SELECT c.term, c.tf FROM compounds c
    WHERE length(c.term) <= 64 AND NOT EXISTS (SELECT 1 FROM parsed p WHERE p.term = c.term)
    UNION ALL
    -- the number inside a code, so that FY2018 meets 2018 and 2019Q3 meets 2019
    SELECT substring(term FROM '[0-9]{3,}'), tf FROM parsed
    WHERE term ~ '^([[:alpha:]]+[0-9]{3,}[[:alpha:]]*|[0-9]{3,}[[:alpha:]]+)$'
$$;

-- A term's dimension in the sparse vectors and its key in the postings. A hash, not a dictionary: writers never
-- wait on each other for new terms. Two terms share an id with probability ~1e-9 per pair.
CREATE OR REPLACE FUNCTION rag_term_id(term text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT (abs(hashtextextended(term, 0)) % 999999937)::integer + 1 $$;

-- How many rows carry a label is counted beside the terms (a key no lexeme can have), so a search can tell a
-- caller whose labels reach few rows (and rank those rows directly) without counting them.
CREATE OR REPLACE FUNCTION rag_label_term_id(label text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT rag_term_id(chr(1) || 'acl:' || label) $$;
