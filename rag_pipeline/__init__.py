"""rag_pipeline: a Dagster pipeline that builds and keeps true the PostgreSQL + pgvector index behind a RAG system.

Where things live (the README's "Development" section has the tree):
- configuration: config (one typed model), the identity scheme: ids, document and version states: status
- domain modules, no SQL and no Dagster: sources, parsing, cascade, cleaning, chunking, prefixes, dedup,
  embedding, safety, retrieval, evaluation, health, alerts, versions (the blue/green lifecycle)
- stages/: discover, parse, chunk, index, each one public function over the database
- store/: every SQL statement, one module per table family, and the migrations
- defs/: thin Dagster definitions; definitions: the code location; runs: the CLI's bridge to Dagster; cli
"""
