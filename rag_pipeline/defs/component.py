"""The pipeline as a Dagster Component: a user's `dg` project loads it from a YAML block.

    # <your project>/defs/rag/defs.yaml: `dg scaffold defs rag_pipeline.defs.component.RagPipelineComponent rag`
    type: rag_pipeline.defs.component.RagPipelineComponent
    attributes:
      config_file: rag_pipeline.yaml   # relative to this folder

Every asset, check, job, schedule and sensor of the pipeline comes with it, bound to that configuration (the same
definitions `rag_pipeline.definitions` builds for the project's own code location).

Inside someone else's project the Component keeps to its own yard, and says what is wrong when the project loads
(`dg check defs`), not when a run starts:
  * `config_file` resolves against the folder of defs.yaml; relative paths inside the configuration resolve against
    the configuration file's folder (as everywhere in the project). A missing file or source root is refused, named.
  * It uses the database the configuration names (`database_url` or RAG_DATABASE_URL). It starts an embedded
    PostgreSQL only when the configuration says `embedded_database: auto`, and then only with a `data_dir` outside
    the project's Python package (a database is not source code).
"""

# No `from __future__ import annotations`: Dagster's Resolvable reads the attributes' annotations as types.
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from rag_pipeline.config import ConfigError, Settings, load_settings

DEFS_YAML = """\
type: rag_pipeline.defs.component.RagPipelineComponent

attributes:
  # The pipeline's configuration: sources, database, embedding model, checks (every key: the project's
  # docs/configuration.md). Relative to this folder; relative paths inside it resolve against its own folder.
  config_file: rag_pipeline.yaml
"""

CONFIG_YAML = """\
# rag_pipeline's configuration, loaded by defs.yaml beside it.
# The index database: set database_url here or RAG_DATABASE_URL in the environment of the code location, the daemon
# and the runs. Inside your project the pipeline never starts a database of its own unless you write
# `embedded_database: auto` and a data_dir outside your Python package.
# database_url: postgresql://rag@db.internal:5432/rag

# Folders to index; each document carries its source's ACL labels (or its sidecar's). A relative root resolves
# against this file's folder.
sources: []
#  - {name: handbook, root: /srv/documents/handbook, acl_labels: [staff]}
"""


class RagPipelineScaffolder(dg.Scaffolder):
    """`dg scaffold defs rag_pipeline.defs.component.RagPipelineComponent <path>`: defs.yaml and a starting
    configuration beside it (an existing one is kept)."""

    def scaffold(self, request: dg.ScaffoldRequest) -> None:
        if request.scaffold_format != "yaml":
            raise ValueError("RagPipelineComponent is declared in YAML: scaffold it with --format yaml")
        request.target_path.mkdir(parents=True, exist_ok=True)
        (request.target_path / "defs.yaml").write_text(DEFS_YAML)
        config = request.target_path / "rag_pipeline.yaml"
        if not config.exists():
            config.write_text(CONFIG_YAML)


@dg.scaffold_with(RagPipelineScaffolder)
@dataclass
class RagPipelineComponent(dg.Component, dg.Resolvable):
    """rag_pipeline's ingestion, index versions, checks, schedules and sensors, from one configuration file."""

    config_file: str = "rag_pipeline.yaml"

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        path = Path(self.config_file).expanduser()
        if not path.is_absolute():
            path = Path(context.path) / path
        if not path.is_file():
            raise ConfigError(f"{context.path / 'defs.yaml'}: attributes.config_file: {path} does not exist "
                              "(a relative path resolves against the folder of defs.yaml)")
        settings = load_settings(path)
        check_yard(settings, package_folder(Path(context.defs_module_path)))
        # Imported here: `dg` imports this module whenever it lists components, in any environment this package is
        # installed in (the pipeline extra's modules may be absent there).
        from rag_pipeline.defs.code_location import build_definitions

        return build_definitions(settings, own_code_location=False)


def package_folder(defs_folder: Path) -> Path:
    """The outermost Python package folder holding the project's defs (src/<project>)."""
    folder = defs_folder.resolve()
    while (folder.parent / "__init__.py").exists():
        folder = folder.parent
    return folder


def check_yard(settings: Settings, package: Path) -> None:
    """What a Component in someone else's project may not do, refused at load with the key that says it."""
    where = settings.config_file
    for index, source in enumerate(settings.sources):
        if source.store_scheme is None and not source.folder.is_dir():
            raise ConfigError(f"{where}: sources[{index}].root: {source.root} is not a folder (a relative root "
                              f"resolves against the configuration file's folder, {where.parent if where else '.'})")
    if settings.database_url:
        return
    if "embedded_database" not in settings.model_fields_set or settings.embedded_database != "auto":
        raise ConfigError(f"{where}: database_url: not set. Inside a Dagster project the pipeline writes to the "
                          "database you name (database_url, or RAG_DATABASE_URL); it starts an embedded PostgreSQL "
                          "only when the configuration says `embedded_database: auto`, with a data_dir outside "
                          "the project's package")
    data_dir = settings.data_dir.resolve()
    if data_dir == package or package in data_dir.parents:
        raise ConfigError(f"{where}: data_dir: {data_dir} is inside the Python package {package}; an embedded "
                          "database keeps its files outside the source tree (an absolute path, or one relative "
                          "to the configuration file that leaves the package)")
