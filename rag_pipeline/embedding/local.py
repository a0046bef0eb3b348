"""The local backend: a sentence-transformers model (and cross-encoder reranker) loaded in this process."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rag_pipeline.embedding.locations import ModelUnavailableError, ResolvedModel, require_local_models
from rag_pipeline.workers.threads import apply_torch_bound

# Torch's OpenMP threads spin for a while after each parallel region. Between two queries that is the time the
# database backend runs the search on the same cores: spinning threads made the query path's p95 half again slower
# on two cores (hybrid at 100k chunks, 41 -> 35 ms passive), while batch embedding is unchanged. It takes effect
# only when set before torch loads (as it is here, when this module is imported first); an operator's own value wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

def _load_error(model: ResolvedModel, exc: Exception) -> ModelUnavailableError:
    hint = (
        "" if model.is_local else
        " It is not a local folder or a packaged model, so it must be downloadable from the Hugging Face hub"
        " (or already in its cache); set embedding.model / RAG_EMBEDDING_MODEL to a local folder otherwise."
    )
    return ModelUnavailableError(f"cannot load embedding model {model.name!r} from {model.location}: {exc}.{hint}")


def _quiet_loading() -> None:
    """No "Loading weights" progress bar: it is written straight to the terminal, through the CLI's own bars and
    into every log; a load that fails says so in its error."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


class Embedder:
    """A loaded sentence-transformers model with asymmetric query/document prompts where it has them."""

    def __init__(self, model: ResolvedModel, device: str = "cpu", batch_size: int = 32):
        require_local_models()
        _quiet_loading()
        from sentence_transformers import SentenceTransformer

        try:
            self._model = SentenceTransformer(model.location, device=device)
        except Exception as exc:
            raise _load_error(model, exc) from exc
        apply_torch_bound()  # torch was loaded just now, maybe while parse workers share the cores
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


class Reranker:
    """A cross-encoder that scores (query, passage) pairs: slower than the bi-encoder, so it only reorders the
    fused top-N."""

    def __init__(self, folder: Path, device: str = "cpu", batch_size: int = 16):
        require_local_models()
        _quiet_loading()
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


_rerankers_lock = threading.Lock()


def get_reranker(folder: Path, device: str = "cpu", batch_size: int = 16) -> Reranker:
    key = (str(Path(folder).resolve()), device)
    with _rerankers_lock:
        if key not in _rerankers:
            _rerankers[key] = Reranker(Path(folder), device, batch_size)
        return _rerankers[key]
