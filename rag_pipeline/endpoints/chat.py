"""A small client for OpenAI-compatible chat endpoints (vLLM, Ollama, hosted APIs): timeouts, retries with
exponential backoff on transient errors, an optional API key from the environment."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rag_pipeline.endpoints.redaction import redact, redact_url
from rag_pipeline.workers.budget import waiting_on_endpoint

if TYPE_CHECKING:
    import httpx

RETRYABLE_STATUS = {408, 409, 425, 429}


class EndpointError(RuntimeError):
    """The endpoint gave no usable answer after all retries."""


class ChatClient:
    def __init__(
        self,
        endpoint: str,
        model: str,
        *,
        api_key_env: str | None = None,
        timeout_seconds: float = 30.0,
        max_retries: int = 3,
        transport: httpx.BaseTransport | None = None,
    ):
        # httpx (and the command-line tools its package imports) only where an endpoint is used: a parse or a
        # refresh that calls none does not pay for it.
        from rag_pipeline.endpoints.http_client import json_client

        self.endpoint = endpoint.rstrip("/")
        self.model = model
        self.max_retries = max_retries
        self._client = json_client(self.endpoint, api_key_env=api_key_env, timeout_seconds=timeout_seconds,
                                   transport=transport)

    def close(self) -> None:
        self._client.close()

    def chat(self, content: str | list[dict[str, Any]], max_tokens: int) -> str:
        """One user message in, the assistant's text out (whitespace as the model wrote it)."""
        # Waiting on the network is not parse time: a worker's time budget stops while it waits.
        with waiting_on_endpoint():
            return self._chat(content, max_tokens)

    def _chat(self, content: str | list[dict[str, Any]], max_tokens: int) -> str:
        import httpx

        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": content}],
            "temperature": 0,
            "max_tokens": max_tokens,
        }
        delay = 0.5
        last_error = "no attempt made"
        for attempt in range(self.max_retries + 1):
            try:
                response = self._client.post("/chat/completions", json=body)
                if response.status_code == 200:
                    content = response.json()["choices"][0]["message"]["content"]
                    if not isinstance(content, str):  # null: a reasoning model that spent its tokens thinking
                        raise TypeError(f"the answer holds no text ({type(content).__name__})")
                    return content
                last_error = f"HTTP {response.status_code}: {response.text[:200]}"
                if response.status_code not in RETRYABLE_STATUS and response.status_code < 500:
                    break  # the server will never accept this request: retrying only wastes time
            except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            if attempt < self.max_retries:
                time.sleep(delay)
                delay *= 2
        # The endpoint's path or query may hold a key: errors (which reach logs and metadata) name its host only.
        raise EndpointError(f"{redact_url(self.endpoint)} failed: {redact(last_error, self.endpoint)}")
