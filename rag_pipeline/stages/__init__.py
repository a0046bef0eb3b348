"""The ingestion stages as plain functions:

    discover.discover -> process.process_pending (parse -> chunk -> index, one document at a time)

`process_pending` works every queued document through the stages asked for (`parse=`, `chunk=`, `index=`): parse
workers (rag_pipeline.workers.pool) lease documents one at a time from the queue in Postgres (store.work), and an
index thread embeds and writes what they hand on. State lives in Postgres, not in Dagster's IO manager, so a failed
run resumes where it stopped and work is proportional to what changed. Every write is one transaction per document
that first re-checks, under a row lock, that the document is still in the state the work was planned for.
"""
