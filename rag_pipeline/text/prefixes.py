"""Contextual prefixes: a short text that situates a chunk in its document, for embedding and BM25.

The default is a deterministic template (title › section path › page). Optionally an LLM behind any
OpenAI-compatible chat endpoint (vLLM, Ollama, a hosted API) writes one situating sentence per chunk;
the caller caches it by (document content, chunk content, prompt version) so each is paid for once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from rag_pipeline.config import PrefixConfig
from rag_pipeline.endpoints.chat import ChatClient, EndpointError

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
    """Situating sentences from an OpenAI-compatible endpoint, at most `max_concurrency` requests in flight."""

    def __init__(self, config: PrefixConfig):
        if not config.endpoint or not config.model:
            raise PrefixError("prefix.mode is 'llm' but prefix.endpoint or prefix.model is not set")
        self.config = config
        self._client = ChatClient(
            config.endpoint, config.model, api_key_env=config.api_key_env,
            timeout_seconds=config.timeout_seconds, max_retries=config.max_retries,
        )

    def close(self) -> None:
        self._client.close()

    def _complete(self, document: str, chunk: str) -> str:
        try:
            answer = self._client.chat(PROMPT_TEMPLATE.format(document=document, chunk=chunk), self.config.max_tokens)
        except EndpointError as exc:
            raise PrefixError(f"prefix endpoint {exc}") from exc
        return " ".join(answer.split())

    def prefixes(self, document: str, requests: Sequence[PrefixRequest]) -> dict[str, str]:
        """One situating sentence per chunk (by chunk hash)."""
        excerpt = document[: self.config.document_chars]
        unique = {r.chunk_hash: r.chunk_text for r in requests}
        with ThreadPoolExecutor(max_workers=self.config.max_concurrency) as pool:
            futures = {h: pool.submit(self._complete, excerpt, text) for h, text in unique.items()}
            return {h: future.result() for h, future in futures.items()}
