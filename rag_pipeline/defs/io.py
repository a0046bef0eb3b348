"""An IO manager for the small JSON values one step of a run hands to another, kept in the index database:
a run whose steps are spread over machines (a Dask cluster) needs no shared filesystem for them."""

from __future__ import annotations

from typing import Any

import dagster as dg

from rag_pipeline import store
from rag_pipeline.defs.resources import RagResource
from rag_pipeline.store.database import connect

RUN_OUTPUTS = "rag_run_outputs"


class RunOutputsIOManager(dg.IOManager):
    """Op outputs are kept per run and step; an asset's value under its key (its latest materialization), so an
    asset materialised alone reads the value its upstream asset last had. Bound to the code location's resource
    (rag_pipeline.defs.resources.fixed_resource): no run config can point it at another database."""

    def __init__(self, rag: RagResource) -> None:
        self.rag = rag

    @staticmethod
    def _address(context: dg.OutputContext) -> tuple[str, str, str]:
        if context.has_asset_key:
            return "asset", context.asset_key.to_user_string(), "value"
        return context.run_id, context.step_key, context.name

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        with connect(self.rag.database_url()) as conn:
            store.run_outputs.store(conn, *self._address(context), obj)

    def load_input(self, context: dg.InputContext) -> Any:
        upstream = context.upstream_output
        assert upstream is not None
        with connect(self.rag.database_url()) as conn:
            return store.run_outputs.load(conn, *self._address(upstream))
