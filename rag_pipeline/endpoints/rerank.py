"""Rerankers behind an endpoint, over the fused top-N:

* `rerank`: the Cohere / Jina / Hugging Face TEI API. POST {endpoint}/rerank with the query and the passages; the
  answer lists (index, score) pairs: `results[].relevance_score` (Cohere, Jina) or a bare list of `{index, score}`
  (TEI).
* `chat`: an OpenAI-compatible chat model as a listwise reranker (RankGPT's prompt): the passages numbered, the model
  answers with their numbers best first; a passage it leaves out keeps its fused order after the ones it ranked.

Both have a timeout per request and bounded retries (429, 5xx, timeouts, with Retry-After), all within the search's
deadline: a Retry-After longer than the time left is not waited for, and a request ends at the deadline however the
endpoint trickles its answer (rag_pipeline.endpoints.deadline_transport), an answer over MAX_ANSWER_BYTES refused. A
circuit breaker per endpoint stops calling one that keeps failing; at most `max_concurrent` searches wait on an
endpoint at once, the others skip it at once. An endpoint that gives no usable answer raises RerankUnavailable (an
EndpointError) saying why, and the search then keeps the fused order (rag_pipeline.retrieval.search).
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import httpx

from rag_pipeline.config import RerankerConfig
from rag_pipeline.endpoints.chat import RETRYABLE_STATUS, EndpointError
from rag_pipeline.endpoints.deadline_transport import DeadlineTransport, proxied, within
from rag_pipeline.endpoints.http_client import json_client
from rag_pipeline.endpoints.http_retry import retry_after_seconds
from rag_pipeline.endpoints.redaction import redact, redact_url

LISTWISE_PROMPT = """I will give you {count} passages, each with a number in brackets. Rank them by how well they \
answer or hold the evidence for the query.

Query: {query}

{passages}

Answer only with the passage numbers, most relevant first, like [2] > [1] > [3]. Leave out passages that do not \
help."""
MAX_RETRY_WAIT = 30.0  # seconds: a Retry-After longer than this is not waited for, even without a deadline
# A Retry-After opens the breaker for at most this long (or breaker_cooldown_seconds, if longer): one header, or a
# proxy's mistake, must not turn reranking off for a year; a trial after it costs one fast skipped search.
MAX_RETRY_AFTER_OPEN = 300.0
MIN_ATTEMPT_SECONDS = 0.1  # a request sent with less time left would time out and be charged to the breaker
MAX_ANSWER_BYTES = 4 * 1024 * 1024  # a rerank or chat answer for top_n passages is kilobytes; more is refused
SKIP_REASONS = ("deadline", "throttled", "failed", "breaker_open", "busy")

log = logging.getLogger(__name__)
T = TypeVar("T")


class RerankUnavailable(EndpointError):
    """No ranking from the endpoint for this search. `reason`: deadline (no answer in the time left), throttled (a
    Retry-After longer than the time left), failed (errors after the retries), breaker_open or busy (not called).
    `called`: whether a request was sent; one that was not says nothing about the endpoint."""

    def __init__(self, reason: str, message: str, retry_after: float = 0.0, called: bool = True):
        super().__init__(message)
        self.reason, self.retry_after, self.called = reason, retry_after, called


class CircuitBreaker:
    """Closed: calls go through. After `failures` failed calls in a row it opens: no call for `cooldown` seconds
    (or until a Retry-After the endpoint sent, if later, up to max(cooldown, MAX_RETRY_AFTER_OPEN)), then one trial
    call while the others still skip; the trial's success closes it, its failure opens it again."""

    def __init__(self, failures: int, cooldown: float, clock: Callable[[], float] = time.monotonic):
        self.failures, self.cooldown, self._clock = failures, cooldown, clock
        self.longest_open = max(cooldown, MAX_RETRY_AFTER_OPEN)
        self._lock = threading.Lock()
        self._in_a_row = 0
        self._open_until: float | None = None  # None: closed
        self._trial: int | None = None  # the thread whose trial call after the cool-down is in flight

    @property
    def state(self) -> str:
        with self._lock:
            if self._open_until is None:
                return "closed"
            return "half_open" if self._clock() >= self._open_until else "open"

    def seconds_open(self) -> float:
        """How long until the next call is let through (0: now)."""
        with self._lock:
            return 0.0 if self._open_until is None else max(0.0, self._open_until - self._clock())

    def allow(self) -> bool:
        """Whether to call now; a True after the cool-down is the trial call, and must be followed by
        succeeded(), failed() or released()."""
        with self._lock:
            if self._open_until is None:
                return True
            if self._clock() < self._open_until or self._trial is not None:
                return False
            self._trial = threading.get_ident()
            return True

    def succeeded(self) -> None:
        with self._lock:
            self._in_a_row, self._open_until, self._trial = 0, None, None

    def released(self) -> None:
        """An allowed call that sent nothing: neither a success nor a failure, and a trial it held is not spent."""
        with self._lock:
            if self._trial == threading.get_ident():
                self._trial = None

    def failed(self, retry_after: float = 0.0) -> bool:
        """Counts a failed call; True when it opened the breaker. A Retry-After opens it at once, for as long as it
        asks (the endpoint said when to come back), up to `longest_open`."""
        with self._lock:
            self._in_a_row += 1
            was_closed, now, until = self._open_until is None, self._clock(), None
            if self._trial is not None or self._in_a_row >= self.failures:
                until = now + self.cooldown
            if retry_after > 0:
                until = max(until or now, now + min(retry_after, self.longest_open))
            if until is not None:
                self._open_until = max(until, self._open_until or until)
            self._trial = None
            return was_closed and self._open_until is not None


class EndpointReranker:
    """Scores for (query, passages) from a rerank or chat endpoint: higher is more relevant, one per passage."""

    def __init__(self, config: RerankerConfig, transport: httpx.BaseTransport | None = None):
        if not config.endpoint:
            raise ValueError("retrieval.reranker.endpoint is not set")
        self.config = config
        self.endpoint = config.endpoint.rstrip("/")
        self.breaker = CircuitBreaker(config.breaker_failures, config.breaker_cooldown_seconds)
        self._slots = threading.BoundedSemaphore(config.max_concurrent)
        # Behind a proxy the environment names, httpx's own transport (which speaks to it) is kept: then only the
        # checks between chunks bound the request, not every socket wait.
        if transport is None and not proxied(self.endpoint):
            transport = DeadlineTransport(config.max_concurrent)
        self._client = json_client(self.endpoint, api_key_env=config.api_key_env,
                                   timeout_seconds=config.timeout_seconds, transport=transport)
        self._client.headers["Accept-Encoding"] = "identity"  # the size cap counts what is held, not a gzip bomb

    def close(self) -> None:
        self._client.close()

    def scores(self, query: str, passages: Sequence[str], deadline: float | None = None) -> list[float]:
        """One score per passage, by `deadline` (time.monotonic(); None: the retries' own limits only), or
        RerankUnavailable saying why not. Calls go through the breaker: one that is open raises at once, as does
        one with no time left or no free slot (max_concurrent); those sent nothing and count for nothing."""
        if not passages:
            return []
        if deadline is not None and time.monotonic() >= deadline:  # the database or the query model took the time
            raise RerankUnavailable("deadline", f"{redact_url(self.endpoint)} not called: the search's deadline "
                                    "passed before its turn", called=False)
        if not self._slots.acquire(blocking=False):  # a worker thread waiting here would be one the service lacks
            raise RerankUnavailable("busy", f"{redact_url(self.endpoint)} not called: {self.config.max_concurrent} "
                                    "searches already wait on it", called=False)
        try:
            if not self.breaker.allow():
                raise RerankUnavailable("breaker_open", f"{redact_url(self.endpoint)} not called: its circuit "
                                        f"breaker is open after {self.config.breaker_failures} failed searches in a "
                                        "row or a Retry-After", called=False)
            return self._scores(query, [p[: self.config.passage_chars] for p in passages], deadline)
        finally:
            self._slots.release()

    def _scores(self, query: str, passages: list[str], deadline: float | None) -> list[float]:
        try:
            if self.config.protocol == "chat":
                scores = self._listwise(query, passages, deadline)
            else:
                scores = self._post("/rerank", self._rerank_body(query, passages), deadline,
                                    lambda answer: _scores_from(answer, len(passages)))
        except RerankUnavailable as exc:
            if not exc.called:
                self.breaker.released()
            elif self.breaker.failed(exc.retry_after):
                log.warning("reranker %s: circuit breaker open, not called for %.0f s: %s", redact_url(self.endpoint),
                            self.breaker.seconds_open(), exc)
            raise
        except BaseException:
            self.breaker.failed()
            raise
        self.breaker.succeeded()
        return scores

    def _rerank_body(self, query: str, passages: list[str]) -> dict[str, object]:
        body: dict[str, object] = {"query": query, "documents": passages, "texts": passages,
                                   "top_n": len(passages), "return_documents": False, "return_text": False}
        if self.config.endpoint_model:
            body["model"] = self.config.endpoint_model
        return body

    def _post(self, path: str, body: dict[str, object], deadline: float | None, read: Callable[[Any], T]) -> T:
        """`read` of the JSON answer to a POST, retried (429, 5xx, timeouts, an answer `read` refuses) while time is
        left. No wait, request or Retry-After outlives `deadline`: what would is skipped instead."""
        deadline = math.inf if deadline is None else deadline
        delay, last_error, called = 0.5, "no attempt made", False

        def unavailable(reason: str, why: str, retry_after: float = 0.0) -> RerankUnavailable:
            # The endpoint's path or query may hold a key: errors (which reach logs) name its host only.
            return RerankUnavailable(reason, f"{redact_url(self.endpoint)} {path} gave no ranking ({reason}): "
                                     f"{redact(why, self.endpoint)}", retry_after, called)

        for attempt in range(self.config.max_retries + 1):
            left = deadline - time.monotonic()
            if left <= MIN_ATTEMPT_SECONDS:  # too little time to be answered: not sent, and not the endpoint's fault
                raise unavailable("deadline", f"no answer within the search's deadline; last: {last_error}")
            wait = delay
            try:
                called = True
                # Streamed, within the deadline: the transport cuts every socket wait at it, this loop stops between
                # chunks past it, and an answer over MAX_ANSWER_BYTES is never held whole.
                with within(deadline), self._client.stream("POST", path, json=body,
                                                           timeout=min(self.config.timeout_seconds, left)) as response:
                    answer = _read_capped(response, deadline)
                if answer is None:
                    raise unavailable("failed", f"HTTP {response.status_code}: an answer over {MAX_ANSWER_BYTES} "
                                      "bytes, refused")
                if response.status_code == 200:
                    return read(json.loads(answer))
                last_error = f"HTTP {response.status_code}: {answer[:200].decode('utf-8', 'replace')}"
                if response.status_code not in RETRYABLE_STATUS and response.status_code < 500:
                    break  # the endpoint will never accept this request: retrying only wastes the time left
                asked = retry_after_seconds(response.headers.get("Retry-After"))
                if asked > min(MAX_RETRY_WAIT, deadline - time.monotonic()):
                    raise unavailable("throttled", f"{last_error}; Retry-After {asked:g} s is longer than the time "
                                      "left", asked)
                wait = max(delay, asked)
            except httpx.TimeoutException as exc:
                last_error = f"{type(exc).__name__}: {exc or 'timed out'}"
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            if attempt < self.config.max_retries:
                if time.monotonic() + wait >= deadline:
                    raise unavailable("deadline", f"no time left for a retry; last: {last_error}")
                time.sleep(wait)
                delay *= 2
        raise unavailable("deadline" if time.monotonic() >= deadline else "failed", last_error)

    def _listwise(self, query: str, passages: list[str], deadline: float | None) -> list[float]:
        numbered = "\n\n".join(f"[{number}] {' '.join(text.split())}" for number, text in enumerate(passages, 1))
        body = {"model": self.config.endpoint_model or "", "temperature": 0, "max_tokens": 8 * len(passages) + 16,
                "messages": [{"role": "user", "content": LISTWISE_PROMPT.format(count=len(passages), query=query,
                                                                                 passages=numbered)}]}
        answer = self._post("/chat/completions", body, deadline,
                            lambda answer: str(answer["choices"][0]["message"]["content"]))
        order: list[int] = []
        for number in (int(n) for n in re.findall(r"\[(\d{1,4})\]", answer)):
            if 1 <= number <= len(passages) and number - 1 not in order:
                order.append(number - 1)
        if not order:
            raise RerankUnavailable("failed", f"{redact_url(self.endpoint)} chat reranker answered no passage number")
        # ranked passages first (their rank as the score), the rest after them in the order they came
        scores = [0.0] * len(passages)
        for rank, index in enumerate(order):
            scores[index] = float(2 * len(passages) - rank)
        rest = [i for i in range(len(passages)) if i not in order]
        for position, index in enumerate(rest):
            scores[index] = float(len(passages) - position)
        return scores


def _read_capped(response: httpx.Response, deadline: float) -> bytes | None:
    """The answer's body, or None when it is over MAX_ANSWER_BYTES; a timeout once `deadline` has passed."""
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > MAX_ANSWER_BYTES:
        return None
    body = bytearray()
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) > MAX_ANSWER_BYTES:
            return None
        if time.monotonic() >= deadline:
            raise httpx.ReadTimeout("the answer was still arriving at the search's deadline")
    return bytes(body)


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
_rerankers_lock = threading.Lock()


def get_endpoint_reranker(config: RerankerConfig) -> EndpointReranker:
    """One client (one connection pool) and one circuit breaker per configuration, shared by the process's
    searches: the breaker counts every search's failures."""
    with _rerankers_lock:
        if config not in _rerankers:
            _rerankers[config] = EndpointReranker(config)
        return _rerankers[config]
