"""One loaded embedder per model per process, whichever backend serves it: local (sentence-transformers), ONNX
int8, or a remote endpoint. A model name is backend-qualified (rag_pipeline.config.backend_model_name)."""

from __future__ import annotations

import threading
from pathlib import Path
from time import perf_counter
from typing import Any

from rag_pipeline.config import BACKEND_PREFIXES, REMOTE_PREFIX, EmbeddingConfig, split_backend
from rag_pipeline.embedding.local import Embedder
from rag_pipeline.embedding.locations import (
    ModelUnavailableError,
    ResolvedModel,
    resolve_model,
    weights_digest,
)
from rag_pipeline.embedding.onnx import OnnxEmbedder
from rag_pipeline.embedding.remote import RemoteEmbedder


def _weights_of(model: ResolvedModel) -> str:
    """A loaded model is kept per weights, not per folder: new weights in the same folder (a long-lived service or
    code server) load afresh instead of answering for the old ones."""
    if not model.is_local:
        return ""
    return weights_digest(Path(model.location))


_embedders: dict[tuple[str, ...], Any] = {}
_embedders_lock = threading.Lock()


def get_embedder(name: str, config: EmbeddingConfig | None = None) -> Any:
    """One loaded model per (location, device) per process: loading costs seconds, encoding milliseconds. `name` is
    backend-qualified (rag_pipeline.config.backend_model_name): `remote:NAME` is served by the configured endpoint,
    `onnx-int8:NAME` runs NAME's int8 export."""
    config = config or EmbeddingConfig()
    if name.startswith(BACKEND_PREFIXES["onnx-int8"]):
        model = resolve_model(name, config.models_dir)
        key = (name, model.location, _weights_of(model), "onnx-int8")
        with _embedders_lock:
            if key not in _embedders:
                _embedders[key] = OnnxEmbedder(name, model, config.models_dir)
            return _embedders[key]
    if name.startswith(REMOTE_PREFIX):
        if not config.endpoint:
            raise ModelUnavailableError(f"{name} is embedded by a remote endpoint: set embedding.backend remote and "
                                        "embedding.endpoint")
        key: tuple[str, ...] = (name, config.endpoint, config.endpoint_model or "")
        with _embedders_lock:
            if key not in _embedders:
                _embedders[key] = RemoteEmbedder(name, config)
            return _embedders[key]
    model = resolve_model(name, config.models_dir)
    key = (model.location, _weights_of(model), config.device)
    with _embedders_lock:
        if key not in _embedders:
            _embedders[key] = Embedder(model, device=config.device, batch_size=config.batch_size)
        return _embedders[key]


def _light_encoder(name: str, config: EmbeddingConfig) -> Any:
    """The numpy encoder for `name` (kept per process), or None where it does not reproduce the model or the
    model is not a local torch model on the CPU."""
    if split_backend(name)[0] != "torch" or config.device != "cpu":
        return None
    model = resolve_model(name, config.models_dir)
    if not Path(model.location).is_dir():
        return None
    key = (model.location, _weights_of(model), "light")
    with _embedders_lock:
        if key in _embedders:
            return _embedders[key]
    from rag_pipeline.embedding.light import load_bert_encoder

    encoder = load_bert_encoder(model.location)
    if encoder is None:
        return None
    with _embedders_lock:
        return _embedders.setdefault(key, encoder)


def _loaded_full(name: str, config: EmbeddingConfig) -> Any:
    model = resolve_model(name, config.models_dir)
    with _embedders_lock:
        return _embedders.get((model.location, _weights_of(model), config.device))


# Seconds of numpy encoding a process spends before it loads the full model for the rest: about what loading torch
# and sentence-transformers costs on a CPU (6-8 s on 2 cores, against 0.01-0.1 s a text). A search, an eval or a
# refresh of a few documents never loads it; a big run pays at most this much more than loading it at once
# (renting until the rent has cost the price of buying).
LIGHT_SECONDS = 5.0


class LightFirstEmbedder:
    """Queries and documents for a local torch model: the numpy encoder (rag_pipeline.embedding.light: the same
    vectors) until it has cost LIGHT_SECONDS in this process, then the full model; the full model at once where
    the numpy encoder does not reproduce it or it is loaded here already."""

    def __init__(self, name: str, config: EmbeddingConfig) -> None:
        self._name, self._config = name, config
        self._lock = threading.Lock()
        self._light_seconds = 0.0
        self._light = _light_encoder(name, config) if _loaded_full(name, config) is None else None
        self._full: Any = None if self._light is not None else get_embedder(name, config)
        self.dimensions = (self._light or self._full).dimensions

    def _model(self) -> tuple[Any, bool]:
        with self._lock:
            if self._full is None:  # loaded here since (a version's first build sizes it): no reason to rent
                self._full = _loaded_full(self._name, self._config)
            if self._full is None and self._light is not None and self._light_seconds < LIGHT_SECONDS:
                return self._light, True
            if self._full is None:
                self._full = get_embedder(self._name, self._config)
            return self._full, False

    def _encode(self, method: str, argument: Any) -> Any:
        model, light = self._model()
        started = perf_counter()
        try:
            return getattr(model, method)(argument)
        finally:
            if light:
                with self._lock:
                    self._light_seconds += perf_counter() - started

    def embed_query(self, text: str) -> Any:
        return self._encode("embed_query", text)

    def embed_documents(self, texts: list[str]) -> Any:
        """Text by text while the numpy encoder is within its budget (one call may hold hundreds of texts), the
        rest in one call of the full model."""
        import numpy as np

        vectors = []
        for done, text in enumerate(texts):
            model, light = self._model()
            if not light:
                rest = model.embed_documents(list(texts[done:]))
                return np.concatenate([np.stack(vectors), rest]) if vectors else rest
            vectors.append(self._encode("embed_documents", [text])[0])
        return np.stack(vectors) if vectors else self._model()[0].embed_documents([])


_light_first: dict[tuple[str, str, str], LightFirstEmbedder] = {}


def get_light_first_embedder(name: str, config: EmbeddingConfig | None = None) -> Any:
    """LightFirstEmbedder for a local torch model on the CPU (one per model per process); get_embedder's for every
    other backend."""
    config = config or EmbeddingConfig()
    if split_backend(name)[0] != "torch" or config.device != "cpu":
        return get_embedder(name, config)
    model = resolve_model(name, config.models_dir)
    key = (model.location, _weights_of(model), config.device)
    with _embedders_lock:
        found = _light_first.get(key)
    if found is None:
        found = LightFirstEmbedder(name, config)
        with _embedders_lock:
            found = _light_first.setdefault(key, found)
    return found


def get_query_embedder(name: str, config: EmbeddingConfig | None = None, *, light: bool = True) -> Any:
    """The embedder for queries: light first (get_light_first_embedder) by default, the full model at once with
    `light=False` (a long-running service, faster per query)."""
    return get_light_first_embedder(name, config) if light else get_embedder(name, config or EmbeddingConfig())
