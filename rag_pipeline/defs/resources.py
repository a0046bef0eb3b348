"""The one resource every asset uses: settings, the database (started and migrated on first use)."""

import threading

import dagster as dg

from rag_pipeline.config import Settings, load_settings
from rag_pipeline.database import migrate, resolve_urls

_ready: set[str] = set()
_ready_lock = threading.Lock()


class RagResource(dg.ConfigurableResource):
    """Where the configuration lives; everything else is derived from it (and the environment)."""

    config_file: str | None = None

    def settings(self) -> Settings:
        return load_settings(self.config_file)

    def database_url(self) -> str:
        """The index database, started (embedded) and migrated once per process."""
        url = resolve_urls(self.settings()).index
        with _ready_lock:
            if url not in _ready:
                migrate(url)
                _ready.add(url)
        return url
