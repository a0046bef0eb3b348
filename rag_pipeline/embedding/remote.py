"""The remote backend: vectors from an OpenAI-compatible `/embeddings` endpoint."""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from rag_pipeline.config import EmbeddingConfig
from rag_pipeline.embedding.locations import served_model_name
from rag_pipeline.endpoints.http_retry import retry_after_seconds


class RemoteEmbedder:
    """Vectors from an OpenAI-compatible `/embeddings` endpoint (text-embeddings-inference, vLLM, Ollama,
    Infinity, hosted APIs): batches of `batch_size` inputs, `max_concurrency` requests in flight, retries of 429,
    5xx and network errors with backoff that honours Retry-After, an API key from the environment. Vectors are
    L2-normalised here, as the local backend's are."""

    RETRYABLE = frozenset({408, 409, 425, 429})

    def __init__(self, name: str, config: EmbeddingConfig, transport: Any = None):
        from rag_pipeline.endpoints.http_client import json_client  # httpx only where an endpoint is used

        self.name = name
        self.served_name = served_model_name(name, config)
        self.endpoint = (config.endpoint or "").rstrip("/")
        self.batch_size = config.batch_size
        self.max_retries = config.max_retries
        self.max_concurrency = config.max_concurrency
        self._client = json_client(self.endpoint, api_key_env=config.api_key_env,
                                   timeout_seconds=config.timeout_seconds, transport=transport)
        self._dimensions: int | None = None

    @property
    def dimensions(self) -> int:
        if self._dimensions is None:
            self._dimensions = int(self._request(["dimension probe"]).shape[1])
        return self._dimensions

    def _request(self, texts: list[str]) -> np.ndarray:
        import httpx

        from rag_pipeline.endpoints.redaction import redact, redact_url

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


class EmbeddingEndpointError(RuntimeError):
    """The embeddings endpoint gave no usable answer after all retries."""


