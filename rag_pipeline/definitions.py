"""The code location: `dg dev`, `dagster dev -m rag_pipeline.definitions` (or `-w workspace.yaml`) and
`rag-pipeline ui` load `defs`.

Loading reads the configuration ($RAG_CONFIG, else ./rag_pipeline.yaml) and nothing else: it connects to no
database, loads no model and writes no file. A bad configuration fails the code location with the same one-line
error the CLI prints.
"""

import os

from rag_pipeline.config import load_settings
from rag_pipeline.defs.code_location import build_definitions

defs = build_definitions(load_settings(os.environ.get("RAG_CONFIG")))
