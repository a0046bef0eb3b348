"""The HTTP client every model endpoint speaks through (chat, embeddings, rerank): JSON, a bearer key read from
the environment variable the configuration names (never the key itself in configuration), the endpoint kept out of
logs (its path or query may carry a key)."""

from __future__ import annotations

import os

import httpx

from rag_pipeline.endpoints.redaction import keep_out_of_logs


def json_client(endpoint: str, *, api_key_env: str | None, timeout_seconds: float,
                transport: httpx.BaseTransport | None = None) -> httpx.Client:
    """A client for `endpoint` (without its trailing slash). An unset or empty variable sends no key."""
    endpoint = endpoint.rstrip("/")
    keep_out_of_logs(endpoint)
    headers = {"Content-Type": "application/json"}
    api_key = os.environ.get(api_key_env) if api_key_env else None
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return httpx.Client(base_url=endpoint, headers=headers, timeout=timeout_seconds, transport=transport)
