"""Making an index database ready for this code: its schema migrated, the identities of index versions from
before model identities recorded, and the configured ranking written where SQL callers of rag.search read it.

Every entry point (the CLI, the Dagster resource, the search service) prepares the database through here, once
per process and database.
"""

from __future__ import annotations

import threading

from rag_pipeline import store
from rag_pipeline.config import Settings
from rag_pipeline.embedding.identity import adopt_model_identities
from rag_pipeline.retrieval.search import SearchOptions
from rag_pipeline.store.database import connect, migrate

_prepared: set[tuple[str, str]] = set()
_prepared_lock = threading.Lock()


def prepare(url: str, settings: Settings, reapply_functions: bool = False) -> list[str]:
    """Migrate `url`, adopt model identities and record the search settings (once per process per database and
    configuration); returns the migrations applied now."""
    key = (url, settings.model_dump_json(include={"embedding", "retrieval"}))
    with _prepared_lock:
        if key in _prepared and not reapply_functions:
            return []
        applied = migrate(url, reapply_functions=reapply_functions)
        with connect(url) as conn:
            adopt_model_identities(conn, settings.embedding)
            with conn.transaction():
                store.search.record_settings(conn, SearchOptions.from_settings(settings).sql_options())
        _prepared.add(key)
        return applied
