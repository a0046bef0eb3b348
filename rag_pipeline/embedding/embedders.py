"""One loaded embedder per model per process, whichever backend serves it: local (sentence-transformers), ONNX
int8, or a remote endpoint. A model name is backend-qualified (rag_pipeline.config.backend_model_name)."""

from __future__ import annotations

import threading
from pathlib import Path
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
                _embedders[key] = OnnxEmbedder(name, model, config.models_dir, config.batch_size)
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


def get_query_embedder(name: str, config: EmbeddingConfig | None = None, *, light: bool = False) -> Any:
    """The embedder for queries: with `light`, for a process that only embeds a few queries (a command-line search
    or eval), the numpy encoder where the model's folder is one it reproduces and no full model is loaded here
    already; otherwise (and for other backends) the full one, as get_embedder."""
    config = config or EmbeddingConfig()
    if not light or split_backend(name)[0] != "torch" or config.device != "cpu":
        return get_embedder(name, config)
    model = resolve_model(name, config.models_dir)
    weights = _weights_of(model)
    with _embedders_lock:
        loaded = (_embedders.get((model.location, weights, config.device))
                  or _embedders.get((model.location, weights, "light")))
    if loaded is not None:
        return loaded
    from rag_pipeline.embedding.light import load_bert_query_encoder

    encoder = load_bert_query_encoder(model.location) if Path(model.location).is_dir() else None
    if encoder is None:
        return get_embedder(name, config)
    with _embedders_lock:
        return _embedders.setdefault((model.location, weights, "light"), encoder)

