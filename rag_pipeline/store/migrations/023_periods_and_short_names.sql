-- Document routing hears names and periods as analysts say them (issue "retrieval").
--
-- * A period with a two-digit year names the year's documents: "FY22", "FY'22", "Q3 FY23" (the year part), "1Q22",
--   "H1-22" are compared with names as 2022 and 2023, as "FY2022" already was (rag_lexemes gives its number).
--   Years 00-69 are 2000-2069, 70-99 are 1970-1999. Only routing reads a word this way: the BM25 terms of chunks
--   and queries are unchanged, so no index is rebuilt.
-- * A name written in capitals and squashed in a file name ("MGMRESORTS_2022_10K", "CVSHEALTH_2018_10K") is also
--   named by its leading letters, so "MGM" and "CVS" meet it: the first 3 to n-3 letters of each capitalised
--   letters-only part of 7 or more letters become name terms too. Lower-case parts ("datatype-uuid.html") are
--   words already split by their separators and gain nothing. Whether such a prefix identifies a document is still
--   decided by rag.document_names' concentration test: "BEST" from "BESTBUY" names Best Buy's filings only where
--   "best" is said mostly in them.
-- documents.name_terms is recomputed for the rows whose paths have such a part.

-- Leading letters of a path's capitalised, squashed parts, as text for rag_lexemes.
CREATE FUNCTION rag_name_prefixes(rel_path text) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(string_agg(left(part, n), ' '), '')
    FROM regexp_split_to_table(coalesce(rel_path, ''), '[^[:alnum:]]+') AS part,
         generate_series(3, length(part) - 3) AS n
    WHERE part ~ '^[[:upper:]]{7,}$' AND length(part) <= 64
$$;

CREATE OR REPLACE FUNCTION rag_name_terms(title text, rel_path text, metadata jsonb) RETURNS integer[]
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(DISTINCT rag_term_id(l.term) ORDER BY rag_term_id(l.term)), '{}')
    FROM unnest(ARRAY['english', 'simple']::regconfig[]) AS cfg,
         rag_lexemes(cfg, concat_ws(' ', title, rel_path, regexp_replace(rel_path, '[/_.-]+', ' ', 'g'),
                                    rag_name_prefixes(rel_path),
                                    (SELECT string_agg(value, ' ') FROM jsonb_each_text(metadata)))) AS l
$$;

UPDATE documents SET name_terms = rag_name_terms(title, rel_path, metadata) WHERE rel_path ~ '[[:upper:]]{7,}';

-- The year a period code with a two-digit year stands for ("FY22", "FY'22", "Q3FY23", "1Q22" -> 2022, 2023,
-- 2022), NULL for any other word.
CREATE FUNCTION rag.period_year(p_word text) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN m IS NOT NULL THEN (m[1]::integer + CASE WHEN m[1]::integer < 70 THEN 2000 ELSE 1900 END)::text END
    FROM regexp_match(lower(regexp_replace(p_word, '[^[:alnum:]]+', '', 'g')),
                      '^(?:fy|q[1-4]|h[12]|[1-4]q|[12]h)(?:fy)?([0-9]{2})$') AS m
$$;

CREATE OR REPLACE FUNCTION rag.document_names(
    p_version integer, p_text text, p_labels text[], p_min_score double precision, p_ratio double precision,
    p_max_documents integer, p_min_terms integer DEFAULT 1, p_min_concentration double precision DEFAULT 0.5,
    p_cap integer DEFAULT 1000, OUT named_ids text[], OUT naming_words integer[]
) LANGUAGE plpgsql STABLE AS $$
DECLARE
    best double precision;
    squashed text[] := (SELECT array_agg(regexp_replace(w.word, '[^[:alnum:]]+', '', 'g') ORDER BY w.n)
                        FROM regexp_split_to_table(p_text, '\s+') WITH ORDINALITY AS w(word, n));
BEGIN
    named_ids := '{}';
    naming_words := '{}';
    -- Most queries name nothing: one look at the names' index, with every form a word is compared in below, before
    -- reading the query word by word (3 ms a query at 100,000 chunks when no name shares a word with it).
    IF NOT EXISTS (
        SELECT 1 FROM documents d
        WHERE d.name_terms && rag.name_term_ids(concat_ws(' ', p_text, array_to_string(squashed, ' '),
                                                          (SELECT string_agg(squashed[i] || squashed[i + 1], ' ')
                                                           FROM generate_subscripts(squashed, 1) AS i
                                                           WHERE i < cardinality(squashed)),
                                                          (SELECT string_agg(rag.period_year(w), ' ')
                                                           FROM unnest(squashed) AS w)))
    ) THEN
        RETURN;
    END IF;
    WITH words AS (  -- stop words name nothing; a query's first 256 words are read for names (bounded work)
        SELECT w.n, w.word, concat_ws(' ', w.word, rag.period_year(w.word)) AS said
        FROM regexp_split_to_table(p_text, '\s+') WITH ORDINALITY AS w(word, n)
        WHERE w.n <= 256 AND w.word <> '' AND NOT rag.is_stop_word(w.word)
    ),
    forms AS (  -- each word (also squashed: Coca-Cola, COCACOLA; a period also as its year: FY22, 2022), and each
                -- two adjacent words written as one
        SELECT ARRAY[w.n] AS positions,
               rag.name_term_ids(w.said || ' ' || regexp_replace(w.word, '[^[:alnum:]]+', '', 'g')) AS terms,
               ARRAY[w.said] AS words
        FROM words w
        UNION ALL
        SELECT ARRAY[a.n, b.n], rag.name_term_ids(regexp_replace(a.word || b.word, '[^[:alnum:]]+', '', 'g')),
               ARRAY[a.word, b.word]
        FROM words a JOIN words b ON b.n = a.n + 1
    ),
    units AS (  -- a word said twice counts once (its first place)
        SELECT DISTINCT ON (f.terms) f.* FROM forms f WHERE f.terms <> '{}' ORDER BY f.terms, f.positions
    ),
    n AS (  -- the planner's estimate where it has one, else a count (small or never analysed tables)
        SELECT CASE WHEN reltuples >= 10000 THEN reltuples ELSE (SELECT count(*) FROM documents) END AS docs
        FROM pg_class WHERE oid = 'documents'::regclass
    ),
    term_df AS (
        SELECT t.term_id, (SELECT count(*) FROM (SELECT 1 FROM documents d WHERE d.name_terms @> ARRAY[t.term_id]
                                                  LIMIT p_cap) c) AS df
        FROM (SELECT DISTINCT unnest(u.terms) AS term_id FROM units u) t
    ),
    naming AS (  -- each unit's name terms that some documents hold but not too many, with their idf
        SELECT u.positions, u.words, x.term_id, ln(1 + (n.docs - df.df + 0.5) / (df.df + 0.5)) AS idf
        FROM units u, unnest(u.terms) AS x(term_id), term_df df, n
        WHERE df.term_id = x.term_id AND df.df > 0 AND df.df < p_cap
    ),
    -- MATERIALIZED: once per unit, not once per document it matches. A word no chunk holds (only names carry it)
    -- competes with nothing: it identifies.
    concentrated AS MATERIALIZED (
        SELECT g.positions, coalesce(rag.name_concentration(p_version, g.words, g.terms), 1.0) AS share
        FROM (SELECT positions, min(words) AS words, array_agg(term_id) AS terms FROM naming GROUP BY positions) g
    ),
    matches AS (  -- each readable document, the units its name shares with the query, and the best idf it holds
        SELECT d.doc_id, nm.positions, max(nm.idf) AS idf, c.share
        FROM naming nm JOIN concentrated c ON c.positions = nm.positions
        JOIN documents d ON d.name_terms @> ARRAY[nm.term_id]
        WHERE c.share >= p_min_concentration / 2 AND d.acl_labels && p_labels
        GROUP BY d.doc_id, nm.positions, c.share
    ),
    identified AS (  -- a name most documents carry (idf < 1) names none
        SELECT DISTINCT m.doc_id FROM matches m WHERE m.share >= p_min_concentration AND m.idf >= 1.0
    ),
    kept AS (  -- a word inside a matching two-word unit is counted with it, once
        SELECT m.* FROM matches m JOIN identified i ON i.doc_id = m.doc_id
        WHERE cardinality(m.positions) = 2 OR NOT EXISTS (
            SELECT 1 FROM matches o WHERE o.doc_id = m.doc_id AND cardinality(o.positions) = 2
                                      AND o.positions @> m.positions)
    ),
    scored AS (
        SELECT k.doc_id, sum(k.idf)::double precision AS score FROM kept k GROUP BY k.doc_id
        HAVING (SELECT count(DISTINCT p) FROM kept k2, unnest(k2.positions) p WHERE k2.doc_id = k.doc_id)
               >= p_min_terms
        ORDER BY score DESC, k.doc_id LIMIT p_max_documents + 1
    ),
    chosen AS (
        SELECT s.doc_id, s.score FROM scored s WHERE s.score >= p_ratio * (SELECT max(score) FROM scored)
    )
    SELECT (SELECT max(score) FROM scored),
           (SELECT array_agg(c.doc_id ORDER BY c.score DESC, c.doc_id) FROM chosen c),
           (SELECT coalesce(array_agg(DISTINCT p ORDER BY p), '{}')
            FROM kept k, unnest(k.positions) p WHERE k.doc_id IN (SELECT doc_id FROM chosen))
        INTO best, named_ids, naming_words;
    IF best IS NULL OR best < p_min_score OR cardinality(named_ids) > p_max_documents THEN
        named_ids := '{}';
        naming_words := '{}';
    END IF;
END $$;

REVOKE EXECUTE ON FUNCTION rag.period_year(text) FROM PUBLIC;
