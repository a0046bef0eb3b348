"""Contextual prefixes: a short text that situates a chunk in its document, for embedding and BM25.

The default is a deterministic template (title › section path › page). Optionally an LLM behind any
OpenAI-compatible chat endpoint (vLLM, Ollama, a hosted API) writes one situating sentence per chunk;
the caller caches it by (document content, chunk content, prompt version) so each is paid for once.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from rag_pipeline.config import PrefixConfig

log = logging.getLogger(__name__)

PROMPT_TEMPLATE = """<document>
{document}
</document>
Here is a chunk we want to situate within the whole document:
<chunk>
{chunk}
</chunk>
Give one short sentence that situates this chunk within the overall document, to improve search retrieval \
of the chunk. Answer only with that sentence."""


class PrefixError(RuntimeError):
    """The endpoint did not produce a prefix after all retries."""


@dataclass(frozen=True)
class PrefixRequest:
    chunk_hash: str
    chunk_text: str


class LlmPrefixer:
    """A client for an OpenAI-compatible /chat/completions endpoint with timeouts, retries and bounded concurrency."""

    def __init__(self, config: PrefixConfig, transport: httpx.BaseTransport | None = None):
        if not config.endpoint or not config.model:
            raise PrefixError("prefix.mode is 'llm' but prefix.endpoint or prefix.model is not set")
        self.config = config
        headers = {"Content-Type": "application/json"}
        api_key = os.environ.get(config.api_key_env) if config.api_key_env else None
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.Client(
            base_url=config.endpoint.rstrip("/"), headers=headers, timeout=config.timeout_seconds, transport=transport
        )

    def close(self) -> None:
        self._client.close()

    def _complete(self, document: str, chunk: str) -> str:
        body = {
            "model": self.config.model,
            "messages": [{"role": "user", "content": PROMPT_TEMPLATE.format(document=document, chunk=chunk)}],
            "temperature": 0,
            "max_tokens": self.config.max_tokens,
        }
        delay = 0.5
        last_error = "no attempt made"
        for attempt in range(1, self.config.max_retries + 2):
            try:
                response = self._client.post("/chat/completions", json=body)
                if response.status_code == 200:
                    text = response.json()["choices"][0]["message"]["content"]
                    return " ".join(str(text).split())
                last_error = f"HTTP {response.status_code}: {response.text[:200]}"
                if response.status_code not in (408, 409, 429) and response.status_code < 500:
                    break  # a request the server will never accept: do not retry
            except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            if attempt <= self.config.max_retries:
                time.sleep(delay)
                delay *= 2
        raise PrefixError(f"prefix endpoint {self.config.endpoint} failed: {last_error}")

    def prefixes(self, document: str, requests: Sequence[PrefixRequest]) -> dict[str, str]:
        """One situating sentence per chunk (by chunk hash), at most `max_concurrency` requests in flight."""
        excerpt = document[: self.config.document_chars]
        unique = {r.chunk_hash: r.chunk_text for r in requests}
        with ThreadPoolExecutor(max_workers=self.config.max_concurrency) as pool:
            futures = {h: pool.submit(self._complete, excerpt, text) for h, text in unique.items()}
            return {h: future.result() for h, future in futures.items()}
