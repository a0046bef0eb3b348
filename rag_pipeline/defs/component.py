"""The pipeline as a Dagster Component: a user's `dg` project loads it from a YAML block.

    # <your project>/defs/rag/defs.yaml
    type: rag_pipeline.defs.component.RagPipelineComponent
    attributes:
      config_file: rag_pipeline.yaml   # relative to this folder

Every asset, check, job, schedule and sensor of the pipeline comes with it, bound to that configuration (the same
definitions `rag_pipeline.definitions` builds for the project's own code location).
"""

from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from rag_pipeline.config import load_settings
from rag_pipeline.defs.code_location import build_definitions


@dataclass
class RagPipelineComponent(dg.Component, dg.Resolvable):
    """rag_pipeline's ingestion, index versions, checks, schedules and sensors, from one configuration file."""

    config_file: str = "rag_pipeline.yaml"

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        path = Path(self.config_file).expanduser()
        if not path.is_absolute():
            path = Path(context.path) / path
        return build_definitions(load_settings(path), own_code_location=False)
