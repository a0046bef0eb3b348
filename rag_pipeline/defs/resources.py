"""The one resource every asset, check and sensor uses: the settings the code location loaded, and the index
database (started, if embedded, and migrated on first use in a process).

The configuration is fixed when the code location loads: the resource has an empty config schema, so no run
(launchpad, GraphQL, a schedule's or sensor's run request) can point it at another configuration file, database,
data folder, source root or label. A run config that tries is refused before the run starts."""

from __future__ import annotations

import dagster as dg

from rag_pipeline.config import Settings
from rag_pipeline.lifecycle.prepare import prepare
from rag_pipeline.store.database import resolve_urls


class RagResource:
    """The loaded settings; everything else is derived from them (and the environment)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    def settings(self) -> Settings:
        return self._settings

    def database_url(self) -> str:
        """The index database, started (embedded) and prepared (rag_pipeline.lifecycle.prepare) once per process."""
        url = resolve_urls(self._settings).index
        prepare(url, self._settings)
        return url


def fixed_resource(value: object, description: str) -> dg.ResourceDefinition:
    """`value` as a resource whose run config must be empty: `{}` refuses every key."""
    return dg.ResourceDefinition(resource_fn=lambda _context: value, config_schema={}, description=description)


Rag = dg.ResourceParam[RagResource]  # how assets, ops, checks and sensors ask for it
