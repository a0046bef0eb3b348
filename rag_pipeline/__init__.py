"""rag_pipeline: a Dagster pipeline that builds and keeps true the PostgreSQL + pgvector index behind a RAG system.

Where things live (the README's module map has every module), from the bottom layer up:
- config, extras: the one typed configuration model; the optional parts of an install
- domain/: ids, document and version states, refs; sources/: scanners that yield DiscoveredFiles
- parsing/: file types, PDF text and tables, the layout tier, the cascade; text/: cleaning, chunking, prefixes, dedup
- store/: every SQL statement of the package (the database's own functions are in the top-level sql/)
- embedding/, endpoints/: models and remote endpoints; retrieval/: search, evaluation, service, integrations
- stages/: discover and process (parse, chunk, index); lifecycle/: versions, checks, erasure, alerts
- defs/: thin Dagster definitions; definitions: the code location; cli
"""
