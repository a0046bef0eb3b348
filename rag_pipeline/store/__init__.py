"""Every SQL statement of the package but the database functions, one module per table family, composed with
psycopg.sql and parameters. The database's own functions and views (the search, BM25, routing) are in the
top-level `sql/functions/`; the schema's history in `sql/migrations/`.

- database     the server (embedded or external), connections, migrations, the index write lock
- deadline     client-side deadlines on connections, which hold when the server is frozen
- sources      the sources registry, scan locks and scan records
- scans        a scan reconciled with the documents table: staged, what is gone counted and deleted, changes applied
- queue        the work queue: pending documents, claims and status changes
- work         leased work units (one document at a time, across processes and machines)
- documents    documents as runs report them: refs, status counts, held documents
- pages        parsed pages and dead letters
- chunks       chunks, the prefix cache and the embedding cache
- groups       near-duplicate groups and their LSH bands
- versions     index versions, their tables, rows and the active alias
- evaluations  golden-set evaluations and baselines
- search       the search settings and the calls of the SQL search function
- health       the queries of the six checks
- erasure      erasure on request and its audit log
- run_outputs  what a run's steps hand each other, kept in the database

Callers use one convention: `from rag_pipeline import store`, then `store.versions.index_versions(conn)`.
Transactions are the caller's: functions run on the connection they are given and commit nothing, so a caller
can make "replace this document's rows" one atomic unit. Statuses are bound as parameters from
rag_pipeline.domain.status, never written as literals.
"""

from rag_pipeline.store import (  # noqa: F401  (the submodules are the package's interface)
    chunks,
    database,
    deadline,
    documents,
    erasure,
    evaluations,
    groups,
    health,
    pages,
    queue,
    run_outputs,
    scans,
    search,
    sources,
    versions,
    work,
)
