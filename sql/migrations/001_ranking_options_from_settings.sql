-- The ranking functions keep no defaults of their own: what a caller leaves out is read from rag.search_settings,
-- which holds the configured ranking (and the configuration's defaults). Their parameters that repeated a default
-- of the configuration (bm25.depth, bm25.max_query_terms, document_routing.min_terms and .min_concentration) lose
-- it, which CREATE OR REPLACE cannot do: they are dropped here and sql/functions/ creates them again. Nothing
-- depends on them (the functions that call them resolve them when they run).
DROP FUNCTION IF EXISTS rag.named_documents(integer, text, text[], double precision, double precision, integer,
                                            integer, double precision, integer);
DROP FUNCTION IF EXISTS rag.document_names(integer, text, text[], double precision, double precision, integer,
                                           integer, double precision, integer);
DROP FUNCTION IF EXISTS rag.bm25_ranking(integer, text, text[], integer, integer, integer, text[], integer);
