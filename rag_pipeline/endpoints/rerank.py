"""Rerankers behind an endpoint, over the fused top-N:

* `rerank`: the Cohere / Jina / Hugging Face TEI API. POST {endpoint}/rerank with the query and the passages; the
  answer lists (index, score) pairs: `results[].relevance_score` (Cohere, Jina) or a bare list of `{index, score}`
  (TEI).
* `chat`: an OpenAI-compatible chat model as a listwise reranker (RankGPT's prompt): the passages numbered, the model
  answers with their numbers best first; a passage it leaves out keeps its fused order after the ones it ranked.

Both have a timeout per request and bounded retries (429, 5xx, timeouts, with Retry-After); an endpoint that gives
no usable answer raises EndpointError, and the search then keeps the fused order (rag_pipeline.retrieval.search).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

import httpx

from rag_pipeline.config import RerankerConfig
from rag_pipeline.endpoints.chat import RETRYABLE_STATUS, ChatClient, EndpointError
from rag_pipeline.endpoints.http_client import json_client
from rag_pipeline.endpoints.http_retry import retry_after_seconds
from rag_pipeline.endpoints.redaction import redact, redact_url

LISTWISE_PROMPT = """I will give you {count} passages, each with a number in brackets. Rank them by how well they \
answer or hold the evidence for the query.

Query: {query}

{passages}

Answer only with the passage numbers, most relevant first, like [2] > [1] > [3]. Leave out passages that do not \
help."""
MAX_RETRY_WAIT = 30.0  # seconds: a Retry-After longer than this is not waited for inside a search


class EndpointReranker:
    """Scores for (query, passages) from a rerank or chat endpoint: higher is more relevant, one per passage."""

    def __init__(self, config: RerankerConfig, transport: httpx.BaseTransport | None = None):
        if not config.endpoint:
            raise ValueError("retrieval.reranker.endpoint is not set")
        self.config = config
        self.endpoint = config.endpoint.rstrip("/")
        if config.protocol == "chat":
            self._chat = ChatClient(self.endpoint, config.endpoint_model or "", api_key_env=config.api_key_env,
                                    timeout_seconds=config.timeout_seconds, max_retries=config.max_retries,
                                    transport=transport)
        else:
            self._client = json_client(self.endpoint, api_key_env=config.api_key_env,
                                       timeout_seconds=config.timeout_seconds, transport=transport)

    def close(self) -> None:
        (self._chat if self.config.protocol == "chat" else self._client).close()

    def scores(self, query: str, passages: Sequence[str]) -> list[float]:
        if not passages:
            return []
        passages = [p[: self.config.passage_chars] for p in passages]
        if self.config.protocol == "chat":
            return self._listwise(query, passages)
        return self._rerank(query, passages)

    def _rerank(self, query: str, passages: list[str]) -> list[float]:
        body: dict[str, object] = {"query": query, "documents": passages, "texts": passages,
                                   "top_n": len(passages), "return_documents": False, "return_text": False}
        if self.config.endpoint_model:
            body["model"] = self.config.endpoint_model
        delay, last_error = 0.5, "no attempt made"
        for attempt in range(self.config.max_retries + 1):
            wait = delay
            try:
                response = self._client.post("/rerank", json=body)
                if response.status_code == 200:
                    return _scores_from(response.json(), len(passages))
                last_error = f"HTTP {response.status_code}: {response.text[:200]}"
                if response.status_code not in RETRYABLE_STATUS and response.status_code < 500:
                    break
                wait = max(delay, retry_after_seconds(response.headers.get("Retry-After")))
                if wait > MAX_RETRY_WAIT:
                    break
            except (httpx.HTTPError, ValueError) as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            if attempt < self.config.max_retries:
                time.sleep(wait)
                delay *= 2
        raise EndpointError(f"{redact_url(self.endpoint)} /rerank failed: {redact(last_error, self.endpoint)}")

    def _listwise(self, query: str, passages: list[str]) -> list[float]:
        numbered = "\n\n".join(f"[{number}] {' '.join(text.split())}" for number, text in enumerate(passages, 1))
        answer = self._chat.chat(LISTWISE_PROMPT.format(count=len(passages), query=query, passages=numbered),
                                 max_tokens=8 * len(passages) + 16)
        order: list[int] = []
        for number in (int(n) for n in re.findall(r"\[(\d{1,4})\]", answer)):
            if 1 <= number <= len(passages) and number - 1 not in order:
                order.append(number - 1)
        if not order:
            raise EndpointError(f"{redact_url(self.endpoint)} chat reranker answered no passage number")
        # ranked passages first (their rank as the score), the rest after them in the order they came
        scores = [0.0] * len(passages)
        for rank, index in enumerate(order):
            scores[index] = float(2 * len(passages) - rank)
        rest = [i for i in range(len(passages)) if i not in order]
        for position, index in enumerate(rest):
            scores[index] = float(len(passages) - position)
        return scores


def _scores_from(payload: object, count: int) -> list[float]:
    """One score per passage from a Cohere/Jina (`{"results": [...]}`) or TEI (`[...]`) answer; a passage the
    answer leaves out scores below every one it scored."""
    items = payload.get("results") if isinstance(payload, dict) else payload
    if not isinstance(items, list):
        raise ValueError(f"a rerank answer lists results, got {type(payload).__name__}")
    scored: dict[int, float] = {}
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("index"), int):
            raise ValueError(f"a rerank result needs an integer index, got {item!r}")
        score = item.get("relevance_score", item.get("score"))
        if not isinstance(score, (int, float)) or not 0 <= item["index"] < count:
            raise ValueError(f"a rerank result needs a number score and an index below {count}, got {item!r}")
        scored[item["index"]] = float(score)
    if not scored:
        raise ValueError("the rerank answer scored no passage")
    floor = min(scored.values()) - 1.0
    return [scored.get(index, floor) for index in range(count)]


_rerankers: dict[RerankerConfig, EndpointReranker] = {}


def get_endpoint_reranker(config: RerankerConfig) -> EndpointReranker:
    """One client (one connection pool) per configuration."""
    if config not in _rerankers:
        _rerankers[config] = EndpointReranker(config)
    return _rerankers[config]
