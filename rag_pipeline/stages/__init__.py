"""The ingestion stages as plain functions, each with one public entry point:

    discover.discover -> parse.parse_pending -> chunk.chunk_pending -> index.index_pending

State lives in Postgres, not in Dagster's IO manager: each stage drains its own queue (documents in status
pending_parse / pending_chunk / pending_index) in keyset-paginated batches, so memory is bounded by the batch,
a failed run resumes where it stopped, and work is proportional to what changed. Every write is one
transaction per document that first re-checks, under a row lock, that the document is still in the state the
work was planned for.
"""
