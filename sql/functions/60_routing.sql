-- Document routing: a query that names documents (by title, path or metadata: a company, a period, a form) is also
-- ranked within them (rag.search_version, 70_search.sql). It tells a name from a topic:
--   * a query is read word by word; stop words name nothing; a word also counts squashed, and two adjacent words
--     written as one, because file names squash names ("COCACOLA_2021_10K", "AMERICANEXPRESS_2022_10K",
--     "sql-createtable.html"); a period with a two-digit year ("FY22", "FY'22", "Q3 FY23", "1Q22", "H1-22") also
--     counts as its year (00-69 are 2000-2069, 70-99 are 1970-1999; only routing reads a word this way, the BM25
--     terms of chunks and queries are unchanged);
--   * a word identifies documents only when its name is rare among documents and its text is concentrated in
--     them: of the chunks where the word weighs most (its top 200 postings), at least p_min_concentration lie in
--     documents whose names carry it. A company's name is said mostly in its own filings; "create" is said on
--     every page. A word only names carry (no chunk has it) identifies too;
--   * a document is named through at least one identifying word; words concentrated at least half as much (a
--     period: "2018" is also said in the 2019 filing) add their idf to its score; at least p_min_terms distinct
--     query words must match.

-- The term ids a piece of text gives a document name (rag_name_terms' configurations), English stop words left
-- out (the neutral configuration keeps "the", "of" and the "s" of "Lowe's"): to compare query words with names.
-- Separate functions, not inlined, keep rag.named_documents cheap to plan.
CREATE OR REPLACE FUNCTION rag.name_term_ids(p_text text) RETURNS integer[] LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(DISTINCT rag_term_id(l.term)), '{}')
    FROM unnest(ARRAY['english', 'simple']::regconfig[]) AS cfg, rag_lexemes(cfg, p_text) l
    WHERE coalesce(cardinality(ts_lexize('english_stem', l.term)), 1) > 0
$$;

CREATE OR REPLACE FUNCTION rag.is_stop_word(p_word text) RETURNS boolean LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT NOT EXISTS (SELECT 1 FROM rag_lexemes('english', p_word))
$$;

-- The year a period code with a two-digit year stands for ("FY22", "FY'22", "Q3FY23", "1Q22" -> 2022, 2023,
-- 2022), NULL for any other word.
CREATE OR REPLACE FUNCTION rag.period_year(p_word text) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN m IS NOT NULL THEN (m[1]::integer + CASE WHEN m[1]::integer < 70 THEN 2000 ELSE 1900 END)::text END
    FROM regexp_match(lower(regexp_replace(p_word, '[^[:alnum:]]+', '', 'g')),
                      '^(?:fy|q[1-4]|h[12]|[1-4]q|[12]h)(?:fy)?([0-9]{2})$') AS m
$$;

-- The periods a query says, word by word ("2022", "FY22", "FY2022", "Q3", "3Q22", "Q3-2022", "2022Q3"; not an
-- amount: "$2,050") and whether it asks for the latest ("latest", "newest", "most recent"): document routing prefers
-- the documents of that period, and abstention reads it (rag_pipeline.retrieval.periods reads the same in Python;
-- a test holds them to the same answers).
CREATE OR REPLACE FUNCTION rag.asked_periods(p_text text, OUT years integer[], OUT quarters integer[],
                                             OUT latest boolean)
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    WITH words AS (  -- each word without the punctuation around it ("2022?", "(FY22)"), in lower case
        SELECT t.n, lower(regexp_replace(t.word, '^[^[:alnum:]]+|[^[:alnum:]]+$', '', 'g')) AS w
        FROM regexp_split_to_table(coalesce(p_text, ''), '\s+') WITH ORDINALITY AS t(word, n) WHERE t.n <= 256
    ),
    read AS (  -- a year alone ("2022", "FY2022", not "$2,050"), a period code ("FY22", "Q3FY23"), a quarter
               -- ("Q3", "3Q22", "Q3-2022", "2022Q3")
        SELECT coalesce(substring(w from '^(?:fy)?((?:19|20)[0-9]{2})$'),
                        substring(w from '^(?:q[1-4]|[1-4]q)[-/]?(?:fy)?((?:19|20)[0-9]{2})$'),
                        substring(w from '^((?:19|20)[0-9]{2})[-/]?q[1-4]$'),
                        rag.period_year(w))::integer AS y,
               coalesce(substring(w from '^q([1-4])(?:[-/]?(?:fy)?(?:[0-9]{2}|(?:19|20)[0-9]{2}))?$'),
                        substring(w from '^([1-4])q(?:[-/]?(?:fy)?(?:[0-9]{2}|(?:19|20)[0-9]{2}))?$'),
                        substring(w from '^(?:19|20)[0-9]{2}[-/]?q([1-4])$'))::integer AS q
        FROM words WHERE w !~ '[$€£¥,]'
    )
    SELECT (SELECT array_agg(DISTINCT y) FROM read WHERE y IS NOT NULL),
           (SELECT array_agg(DISTINCT q) FROM read WHERE q IS NOT NULL),
           EXISTS (SELECT 1 FROM words WHERE w IN ('latest', 'newest'))
           OR EXISTS (SELECT 1 FROM words a JOIN words b ON b.n = a.n + 1 WHERE a.w = 'most' AND b.w = 'recent')
$$;

-- Of the chunks where p_words weigh most (the top 200 postings of their terms in the version, stop words left
-- out), the share that lie in documents whose names carry one of p_name_terms; NULL when no chunk holds the words.
CREATE OR REPLACE FUNCTION rag.name_concentration(p_version integer, p_words text[], p_name_terms integer[])
RETURNS double precision LANGUAGE plpgsql STABLE AS $$
DECLARE
    t text := rag.version_table(p_version);
    share double precision;
BEGIN
    EXECUTE format($q$
        SELECT avg((d.name_terms && $2)::integer) FROM (
            SELECT p.lexical_id FROM (
                SELECT DISTINCT rag_term_id(l.term) AS term_id
                FROM %2$I params, unnest(params.configs || 'simple'::regconfig) AS cfg, unnest($1) AS w,
                     rag_lexemes(cfg, w) l
                WHERE coalesce(cardinality(ts_lexize('english_stem', l.term)), 1) > 0) ct,
            LATERAL (SELECT lexical_id, weight FROM %3$I WHERE term_id = ct.term_id ORDER BY weight DESC LIMIT 200) p
            ORDER BY p.weight DESC LIMIT 200) top
        JOIN %1$I v ON v.lexical_id = top.lexical_id JOIN documents d ON d.doc_id = v.doc_id$q$,
        t, t || '_bm25_params', t || '_postings')
        INTO share USING p_words, p_name_terms;
    RETURN share;
END $$;

-- The documents a query names (best first) and the positions of the query words that named them (1-based,
-- whitespace-separated words): see the head of this file for when a document counts as named.
CREATE OR REPLACE FUNCTION rag.document_names(
    p_version integer, p_text text, p_labels text[], p_min_score double precision, p_ratio double precision,
    p_max_documents integer, p_min_terms integer, p_min_concentration double precision,
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
    identified AS (  -- a name most documents carry (idf < 1) names none; a period alone names none (it chooses among
                     -- the documents a name names: "In 2013, what share ..." asks about 2013, not about a 2013 report)
        SELECT DISTINCT m.doc_id FROM matches m
        WHERE m.share >= p_min_concentration AND m.idf >= 1.0
          AND EXISTS (SELECT 1 FROM words w, rag.asked_periods(w.word) p
                      WHERE w.n = ANY(m.positions) AND p.years IS NULL AND p.quarters IS NULL)
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
    close AS (
        SELECT s.doc_id, s.score FROM scored s WHERE s.score >= p_ratio * (SELECT max(score) FROM scored)
    ),
    asked AS (SELECT * FROM rag.asked_periods(p_text)),
    -- Of the documents named, those of the period asked for: the quarter and the year, else the year (a quarter's
    -- question is also answered by the annual report), else, for "the latest", the newest period. A period no named
    -- document has keeps them all (the search says so: rag_pipeline.retrieval.periods).
    dated AS (
        SELECT c.doc_id, c.score, (i ->> 'year')::integer AS year, (i ->> 'quarter')::integer AS quarter,
               coalesce(i ->> 'period_end', (i ->> 'year') || '-12-31') AS period_end, i ->> 'kind' AS kind
        FROM close c JOIN documents d ON d.doc_id = c.doc_id,
             LATERAL rag.document_identity(d.title, d.metadata, d.identity) AS i
    ),
    matched AS (
        SELECT dt.*, CASE WHEN dt.year = ANY(a.years) AND dt.quarter = ANY(a.quarters) THEN 2
                          WHEN dt.year = ANY(a.years) AND (a.quarters IS NULL OR dt.quarter IS NULL) THEN 1
                          ELSE 0 END AS fit,
               coalesce(a.latest, false) AND a.years IS NULL AS wants_latest
        FROM dated dt, asked a
    ),
    -- for "the latest annual report", the documents of the kind the query says, if any is
    said_kind AS (
        SELECT m.* FROM matched m
        WHERE m.kind = (SELECT k.kind FROM matched k
                        WHERE p_text ~* ('\m' || regexp_replace(k.kind, '([^[:alnum:] ])', '\\\1', 'g') || '\M')
                        ORDER BY length(k.kind) DESC LIMIT 1)
    ),
    pool AS (SELECT * FROM said_kind UNION ALL SELECT * FROM matched WHERE NOT EXISTS (SELECT 1 FROM said_kind)),
    chosen AS (
        SELECT m.doc_id, m.score FROM matched m
        WHERE CASE WHEN (SELECT max(fit) FROM matched) > 0 THEN m.fit = (SELECT max(fit) FROM matched)
                   WHEN m.wants_latest AND EXISTS (SELECT 1 FROM pool WHERE period_end IS NOT NULL)
                       THEN m.doc_id IN (SELECT doc_id FROM pool)
                            AND m.period_end = (SELECT max(period_end) FROM pool)
                   ELSE true END
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

CREATE OR REPLACE FUNCTION rag.named_documents(
    p_version integer, p_text text, p_labels text[], p_min_score double precision, p_ratio double precision,
    p_max_documents integer, p_min_terms integer, p_min_concentration double precision,
    p_cap integer DEFAULT 1000
) RETURNS text[] LANGUAGE sql STABLE AS $$
    SELECT named_ids FROM rag.document_names(p_version, p_text, p_labels, p_min_score, p_ratio, p_max_documents,
                                             p_min_terms, p_min_concentration, p_cap)
$$;

-- Why a search should say "no evidence" rather than rank the nearest text, or NULL to rank:
--   * the query names something the caller's index does not hold: a name (a capital and three lower-case letters or
--     more, not opening a sentence, not a stop word; acronyms are left alone, questions define them) that no chunk
--     the caller may read and no document name it may read carries, under any of the version's text configurations
--     ("What was PepsiCo's free cash flow?" over filings of other companies);
--   * the query names documents (p_named, from routing) and a year, and none of those documents is of that year or
--     of the p_lookback years after it (a filing states its year and the years before it), or, for a quarter, none
--     is an annual report of that year or a quarterly one of that quarter or later: "Kraft Heinz's net sales for
--     fiscal 2021" over its 2019 annual report, JPMorgan's "3Q23" over its second-quarter 2023 report.
-- Only what the caller may read is consulted: whether a word is held elsewhere is not told.
CREATE OR REPLACE FUNCTION rag.abstention(
    p_version integer, p_text text, p_labels text[], p_named text[], p_unknown_names boolean, p_lookback integer
) RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    t text := rag.version_table(p_version);
    missing text;
    asked record;
    held boolean;
BEGIN
    IF p_unknown_names THEN
        EXECUTE format($q$
            WITH words AS (
                SELECT w.n, w.word FROM regexp_split_to_table($1, '\s+') WITH ORDINALITY AS w(word, n)
                WHERE w.n <= 256 AND w.word <> ''
            ),
            bare AS (  -- a word without its possessive and its punctuation
                SELECT w.n, w.word,
                       regexp_replace(regexp_replace(w.word, '[''’]s\W*$', ''), '[^[:alnum:]&-]+', '', 'g') AS name
                FROM words w
            ),
            names AS (  -- a name: a capital and three lower-case letters or more ("Tyson", "PepsiCo"; not an acronym
                        -- a question defines, "DPO", "CAGR", "PwC"), not the first word of a sentence, not a stop word;
                        -- with the words next to it squashed (a file name writes "Globex Industries" GLOBEXINDUSTRIES)
                SELECT b.n, b.name, ARRAY[b.name, before.name || b.name, b.name || after.name] AS forms
                FROM bare b JOIN words prev ON prev.n = b.n - 1
                LEFT JOIN bare before ON before.n = b.n - 1 LEFT JOIN bare after ON after.n = b.n + 1
                WHERE b.word ~ '^["“‘(]?[[:upper:]][[:lower:]]{3}' AND prev.word !~ '[.?!:]["”’)]?$'
                  AND NOT rag.is_stop_word(b.word)
            )
            SELECT nm.name FROM names nm
            WHERE NOT EXISTS (
                SELECT 1 FROM %2$I params, unnest(params.configs || 'simple'::regconfig) AS cfg,
                     unnest(nm.forms) AS form, rag_lexemes(cfg, form) l
                WHERE EXISTS (SELECT 1 FROM %3$I p JOIN %1$I v ON v.lexical_id = p.lexical_id
                              WHERE p.term_id = rag_term_id(l.term) AND v.acl_labels && $2)
                   OR EXISTS (SELECT 1 FROM documents d
                              WHERE d.name_terms @> ARRAY[rag_term_id(l.term)] AND d.acl_labels && $2))
            ORDER BY nm.n LIMIT 1$q$, t, t || '_bm25_params', t || '_postings')
            -- words written together apart: "Latinos/Hispanics", "Nike?Round"
            INTO missing USING regexp_replace(replace(p_text, '/', ' / '), '([.?!;:])([[:upper:]])', '\1 \2', 'g'),
                               p_labels;
        IF missing IS NOT NULL THEN
            RETURN format('the index holds nothing about %s', missing);
        END IF;
    END IF;
    IF p_lookback IS NOT NULL AND cardinality(p_named) > 0 THEN
        SELECT * INTO asked FROM rag.asked_periods(p_text);
        IF asked.years IS NOT NULL THEN
            -- a quarterly report of the year asked holds its quarter and those before it, not a later one
            SELECT bool_or(i ->> 'year' IS NULL
                           OR EXISTS (SELECT 1 FROM unnest(asked.years) y
                                      WHERE (i ->> 'year')::integer BETWEEN y AND y + p_lookback
                                        AND NOT coalesce((i ->> 'year')::integer = y AND i ->> 'quarter' IS NOT NULL
                                                          AND (SELECT min(q) FROM unnest(asked.quarters) q)
                                                              > (i ->> 'quarter')::integer, false)))
                INTO held
                FROM documents d, LATERAL rag.document_identity(d.title, d.metadata, d.identity) AS i
                WHERE d.doc_id = ANY(p_named);
            IF NOT coalesce(held, true) THEN
                RETURN format('no document of %s among those the query names',
                              concat_ws(' ', (SELECT string_agg('Q' || q, '/' ORDER BY q) FROM unnest(asked.quarters) q),
                                        array_to_string(asked.years, ', ')));
            END IF;
        END IF;
    END IF;
    RETURN NULL;
END $$;

-- The query without the words at p_positions (whitespace-separated, 1-based): the words that named the documents
-- a list is ranked within, where every chunk is the company's and the period's, so they rank nothing there.
CREATE OR REPLACE FUNCTION rag.without_words(p_text text, p_positions integer[]) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(string_agg(w.word, ' ' ORDER BY w.n), '')
    FROM regexp_split_to_table(p_text, '\s+') WITH ORDINALITY AS w(word, n)
    WHERE NOT w.n = ANY(p_positions)
$$;

REVOKE EXECUTE ON FUNCTION rag.name_term_ids(text), rag.is_stop_word(text), rag.without_words(text, integer[]),
                           rag.name_concentration(integer, text[], integer[]),
                           rag.document_names(integer, text, text[], double precision, double precision, integer,
                                              integer, double precision, integer),
                           rag.named_documents(integer, text, text[], double precision, double precision, integer,
                                               integer, double precision, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rag.period_year(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION rag.asked_periods(text), rag.abstention(integer, text, text[], text[], boolean, integer)
    FROM PUBLIC;
