"""Every SQL statement of the package, one module per table family, composed with psycopg.sql and parameters.

- database     the server (embedded or external), connections, migrations, the index write lock
- documents    sources, discovery's reconciliation, the work queue, claims and status changes
- pages        parsed pages and dead letters
- chunks       chunks, the prefix cache and the embedding cache
- groups       near-duplicate groups and their LSH bands
- versions     index versions, their tables, rows and the active alias
- evaluations  golden-set evaluations and baselines
- search       the hybrid search query
- health       the read-only queries of the six checks

Transactions are the caller's: functions run on the connection they are given and commit nothing, so a caller
can make "replace this document's rows" one atomic unit. Statuses are bound as parameters from
rag_pipeline.status, never written as literals.
"""
