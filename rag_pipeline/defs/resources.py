"""The one resource every asset, check and sensor uses: the settings (loaded once per run) and the index
database (started, if embedded, and migrated on first use in a process)."""

import dagster as dg
from pydantic import PrivateAttr

from rag_pipeline.config import Settings, load_settings
from rag_pipeline.index_database import prepare
from rag_pipeline.store.database import resolve_urls


class RagResource(dg.ConfigurableResource):
    """Where the configuration lives; everything else is derived from it (and the environment)."""

    config_file: str | None = None
    _settings: Settings | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        # Once per run (and per sensor tick): every step of the run sees the same settings.
        self._settings = load_settings(self.config_file)

    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings(self.config_file)
        return self._settings

    def database_url(self) -> str:
        """The index database, started (embedded) and prepared (rag_pipeline.index_database) once per process."""
        url = resolve_urls(self.settings()).index
        prepare(url, self.settings())
        return url
