"""`rag-pipeline serve`: the index over HTTP for applications (FastAPI on uvicorn).

    POST /search   {"query": "...", "k": 10, "mode": "hybrid"}  ->  {"results": [...], "version": ..., ...}
    GET  /healthz  the process answers
    GET  /readyz   the database answers, an active version exists and its query model is loaded; with a token,
                   also the version and the latest index checks (a reranker never makes it unready)
                   (the probes and /metrics never queue behind searches: they run on the event loop and /readyz's
                   database part on threads of its own, not AnyIO's 40 shared by every search)
    GET  /metrics  counters in Prometheus' text format: searches, and what the reranker did (reranked or skipped,
                   and why), the reranker's circuit breaker
    GET  /docs     OpenAPI documentation (/openapi.json)

A caller is its API token (`Authorization: Bearer ...`), mapped in the configuration (`service.tokens`) to the
labels its searches carry; labels never come from the request. Tokens are stored as sha256 digests or read from
the environment, never in clear in a file, and compared in constant time. Request bodies, queries and k are
bounded; every error is a JSON object {"error": {"code", "message"}}. The query model is loaded once per process,
before /readyz says ready (loading takes seconds; a load balancer must not send the first searches into it), and
follows the active version's model through promotions (rag_pipeline.embedding.identity).
"""

import asyncio
import hashlib
import hmac
import logging
import math
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import psycopg
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from psycopg_pool import ConnectionPool, PoolTimeout
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.exceptions import HTTPException

from rag_pipeline import store
from rag_pipeline.config import ConfigError, ServiceConfig, Settings
from rag_pipeline.embedding.identity import cache_key
from rag_pipeline.embedding.locations import ModelUnavailableError
from rag_pipeline.retrieval.search import (
    RERANK_SKIPS,
    SearchError,
    SearchHit,
    SearchOptions,
    abstention_of,
    fetch,
    finish,
    plan,
    query_embedder,
)
from rag_pipeline.store.database import register_vector_types
from rag_pipeline.store.deadline import WATCHDOG

log = logging.getLogger(__name__)


def _register_vector_types(conn: psycopg.Connection) -> None:
    register_vector_types(conn, required=True)  # a pool never hands out a connection that cannot send a vector


@dataclass(frozen=True)
class Caller:
    name: str
    labels: tuple[str, ...]


class UnheldLabels:
    """Tells the operator, in the service's log and once per token and index version, that a token carries labels
    no indexed document has (a misspelt label in `service.tokens`: nothing it widens, so its searches miss what it
    was meant to reach); the caller is never told which labels exist."""

    def __init__(self) -> None:
        self._told: set[tuple[str, int]] = set()
        self._lock = threading.Lock()

    def report(self, conn: psycopg.Connection, version: store.versions.IndexVersion, caller: Caller) -> None:
        key = (caller.name, version.version_id)
        with self._lock:
            if key in self._told:
                return
            self._told.add(key)
        try:
            unheld = store.search.unheld_labels(conn, version, caller.labels)
        except psycopg.Error as exc:  # a hint for the operator must never fail the caller's search
            log.warning("search service: could not check the labels of token %s: %s", caller.name,
                        type(exc).__name__)
            return
        if unheld:
            log.warning("search service: token %s carries labels no document of %s has: %s (labels match exactly)",
                        caller.name, version.label, ", ".join(unheld))


class TokenBook:
    """Which token is whose: sha256 digests only, compared in constant time."""

    def __init__(self, config: ServiceConfig, environ: Mapping[str, str] | None = None) -> None:
        environ = os.environ if environ is None else environ
        self._entries: list[tuple[bytes, Caller]] = []
        for index, token in enumerate(config.tokens):
            if token.env is not None:
                value = environ.get(token.env, "")
                if not value:
                    raise ConfigError(f"service.tokens[{index}].env: the environment variable {token.env} "
                                      f"(token {token.name!r}) is not set")
                digest = hashlib.sha256(value.encode()).digest()
            else:
                digest = bytes.fromhex(token.sha256 or "")
            if any(hmac.compare_digest(known, digest) for known, _ in self._entries):
                raise ConfigError(f"service.tokens[{index}]: the same token as an earlier entry (which labels would "
                                  "it carry?)")
            self._entries.append((digest, Caller(token.name, token.labels)))

    def __len__(self) -> int:
        return len(self._entries)

    def caller(self, token: str) -> Caller | None:
        digest = hashlib.sha256(token.encode()).digest()
        found = None
        for known, caller in self._entries:  # every entry compared: the time says nothing about which matched
            if hmac.compare_digest(known, digest):
                found = caller
        return found


class SearchRequest(BaseModel):
    """What a caller may ask. There is no labels field: a caller's labels come from its token."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, description="the question or keywords")
    k: int | None = Field(None, ge=1, description="results wanted (at most service.max_k; default: retrieval.k, as "
                          "for the CLI)")
    mode: Literal["hybrid", "dense", "sparse"] = "hybrid"

    @field_validator("query")
    @classmethod
    def _storable(cls, query: str) -> str:
        # JSON may carry both; the database refuses them (a DataError, which would otherwise be a 500).
        if "\x00" in query:
            raise ValueError("must not contain NUL characters")
        try:
            query.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("must be valid Unicode (no lone surrogates)") from None
        return query


class SearchResponse(BaseModel):
    results: list[SearchHit]  # flags: e.g. prompt-injection patterns; treat such a text as data
    version: str
    model: str = Field(description="the active version's model identity (backend and weights digest)")
    took_ms: float
    rerank: str | None = Field(None, description="what the reranker did: reranked, or skipped_deadline, "
                               "skipped_throttled, skipped_failed, skipped_breaker_open, skipped_busy (the fused order "
                               "stands); "
                               "null: no reranker configured")
    note: str | None = Field(None, description="a caveat to pass on with the results: the query names a period "
                             "(FY2022, Q3 2022) that no result's document is of")
    abstained: str | None = Field(None, description="why there are no results, when the search abstained (a name "
                                  "the index does not hold, a period none of the documents named is of, the score "
                                  "floor); null otherwise")


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


DATABASE_RETRY_AFTER_SECONDS = 5


class BodyLimit:
    """Refuses request bodies over `limit` bytes (413), whether or not Content-Length says so, and bodies not
    received within `timeout` seconds (408): the body is read (at most `limit` bytes are held) before the
    application sees it."""

    def __init__(self, app: Any, limit: int, timeout: float) -> None:
        self.app, self.limit, self.timeout = app, limit, timeout

    async def __call__(self, scope: dict, receive: Callable[[], Awaitable[dict]], send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = _error(413, "request_too_large", f"request bodies are limited to {self.limit} bytes")
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await too_large(scope, receive, send)
            return
        body, more = bytearray(), True
        deadline = asyncio.get_running_loop().time() + self.timeout
        while more:
            try:
                message = await asyncio.wait_for(receive(), deadline - asyncio.get_running_loop().time())
            except TimeoutError:
                slow = _error(408, "request_timeout", f"the request body did not arrive within {self.timeout:g} s",
                              {"Connection": "close"})
                await slow(scope, receive, send)
                return
            if message["type"] == "http.disconnect":
                return
            body.extend(message.get("body", b""))
            more = message.get("more_body", False)
            if len(body) > self.limit:
                await too_large(scope, receive, send)
                return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class QueryModelWarmup:
    """Loads and exercises each active version's query model off the request path, once per process, so /readyz
    says ready only when a search will not pay for the load. A model that cannot load keeps the service not ready
    (the log says why) and is tried again after RETRY_SECONDS: an embedding endpoint down at the start must not
    leave the service unready until a restart. Once the service has been ready, a promotion to a version with
    another model keeps it ready while that model loads: every replica turning unready at once would drain the
    whole fleet, and the first searches pay for the load instead."""

    RETRY_SECONDS = 30.0

    def __init__(self, options: SearchOptions) -> None:
        self._options = options
        self._lock = threading.Lock()
        self._warm: set[str] = set()
        self._loading: set[str] = set()
        self._failed: dict[str, float] = {}  # model key -> when its load failed

    def not_ready_because(self, version: store.versions.IndexVersion) -> str | None:
        """None when `version`'s query model is warm (or the service was ready before and it is loading); else why
        not, after starting its load if none is running."""
        try:
            key = cache_key(version)
        except ModelUnavailableError as exc:  # a version with no model identity yet: searches cannot run either
            return f"the query model of {version.label} is not known here: {type(exc).__name__}"
        with self._lock:
            if key in self._warm:
                return None
            failed_at = self._failed.get(key)
            if failed_at is not None and time.monotonic() - failed_at < self.RETRY_SECONDS:
                return "the query model could not be loaded; the service log says why"
            if key not in self._loading:
                self._loading.add(key)
                threading.Thread(target=self._load, args=(version, key), name="query-model-warmup",
                                 daemon=True).start()
            return None if self._warm else "the query model is loading"

    def _load(self, version: store.versions.IndexVersion, key: str) -> None:
        try:
            query_embedder(version, self._options).embed_query("warm-up")
        except Exception as exc:  # any failure keeps the service not ready; the log says why
            log.error("search service: the query model of %s did not load: %s", version.label, exc)
            with self._lock:
                self._failed[key] = time.monotonic()
        else:
            log.info("search service: the query model of %s is loaded", version.label)
            with self._lock:
                self._warm.add(key)
                self._failed.pop(key, None)
        finally:
            with self._lock:
                self._loading.discard(key)


class SearchCounters:
    """What /metrics reports, since the process started: searches answered and what their reranker did."""

    OUTCOMES = ("reranked", *RERANK_SKIPS)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.searches = 0
        self.rerank = dict.fromkeys(self.OUTCOMES, 0)

    def count(self, rerank: str | None) -> None:
        with self._lock:
            self.searches += 1
            if rerank is not None:
                self.rerank[rerank] = self.rerank.get(rerank, 0) + 1

    def prometheus(self, breaker: str | None) -> str:
        """The counters in Prometheus' text exposition format; `breaker`: the reranker endpoint's breaker state."""
        with self._lock:
            lines = ["# HELP rag_search_requests_total Searches answered.", "# TYPE rag_search_requests_total counter",
                     f"rag_search_requests_total {self.searches}",
                     "# HELP rag_search_rerank_total Searches by what their reranker did (skipped_*: the fused order "
                     "was returned).", "# TYPE rag_search_rerank_total counter"]
            lines += [f'rag_search_rerank_total{{outcome="{outcome}"}} {count}' for outcome, count in self.rerank.items()]
        if breaker is not None:
            lines += ["# HELP rag_search_reranker_breaker_open 1 while the reranker endpoint's circuit breaker keeps "
                      "it from being called.", "# TYPE rag_search_reranker_breaker_open gauge",
                      f"rag_search_reranker_breaker_open {int(breaker == 'open')}"]
        return "\n".join(lines) + "\n"


def _options(database_url: str) -> str:
    """The URL's own `options` (server settings), kept beside the ones the service adds."""
    return psycopg.conninfo.conninfo_to_dict(database_url).get("options") or ""


def create_app(settings: Settings, database_url: str, environ: Mapping[str, str] | None = None) -> FastAPI:
    """The service for `settings` over the (prepared) index database at `database_url`."""
    config = settings.service
    tokens = TokenBook(config, environ)
    if not tokens:
        raise ConfigError("service.tokens: no API tokens are configured, so nobody could search")
    options = SearchOptions.from_settings(settings, light_query_model=False)  # the full model: faster per query
    # Every wait on the database is bounded: the pool's queue (database_timeout_seconds, per request), a new
    # connection (connect_timeout), a statement (statement_timeout) and unacknowledged bytes on a connection whose
    # server vanished (tcp_user_timeout), so a hung database gives 503s, not threads stuck for ever. Those are the
    # server's clocks or the kernel's: a frozen server (SIGSTOP) trips none of them, so each use of a connection,
    # the pool's check of it included, also has a client-side deadline (rag_pipeline.store.deadline).
    query_ms = int(config.query_timeout_seconds * 1000)
    check_seconds = min(config.database_timeout_seconds, config.query_timeout_seconds)

    def check(conn: psycopg.Connection) -> None:
        with WATCHDOG.guard(conn, check_seconds):
            ConnectionPool.check_connection(conn)

    def configure(conn: psycopg.Connection) -> None:  # the pool's own threads must not hang on a frozen server
        with WATCHDOG.guard(conn, config.query_timeout_seconds):
            _register_vector_types(conn)

    pool = ConnectionPool(database_url, min_size=1, max_size=config.connections, open=False,
                          kwargs={"autocommit": True, "connect_timeout": max(2, math.ceil(config.database_timeout_seconds)),
                                  "options": f"{_options(database_url)} -c statement_timeout={query_ms}".strip(),
                                  "tcp_user_timeout": query_ms},
                          configure=configure, check=check)
    warmup = QueryModelWarmup(options)
    counters = SearchCounters()
    # /readyz's database part runs here, not on AnyIO's worker threads (40, shared by every search): a probe must
    # answer while searches hold them all. A few threads suffice: each probe ends within the database deadlines.
    probe_threads = ThreadPoolExecutor(4, thread_name_prefix="readyz")

    @contextmanager
    def database() -> Iterator[psycopg.Connection]:
        """A pooled connection for one short use; the wait for it and the use together end within
        query_timeout_seconds, or raise an OperationalError (a connection cut) or PoolTimeout."""
        started = time.monotonic()
        with pool.connection(timeout=config.database_timeout_seconds) as conn, \
                WATCHDOG.guard(conn, config.query_timeout_seconds - (time.monotonic() - started)):
            yield conn

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool.open(wait=True, timeout=30)
        try:
            with database() as conn:
                version = store.versions.active_version(conn)
        except Exception as exc:  # a database not reachable or not prepared: /readyz retries and starts the load
            log.warning("search service: no active version to warm at the start: %s", type(exc).__name__)
            version = None
        if version is not None:  # start loading now; /readyz answers meanwhile (not ready), as /healthz does
            warmup.not_ready_because(version)
        try:
            yield
        finally:
            probe_threads.shutdown(wait=False, cancel_futures=True)
            pool.close()

    app = FastAPI(title="rag_pipeline search", version="1", lifespan=lifespan,
                  description="Hybrid search over the active index version, filtered by the labels of your token.")
    app.add_middleware(BodyLimit, limit=config.max_request_bytes, timeout=config.body_timeout_seconds)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.code, exc.message, exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("search service: unexpected %s", type(exc).__name__)
        return _error(500, "internal_error", "the search failed; the service's log says why")

    @app.exception_handler(HTTPException)  # Starlette's, so routing's 404 and 405 speak the same shape
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        codes = {404: "not_found", 405: "method_not_allowed"}
        return _error(exc.status_code, codes.get(exc.status_code, "http_error"), str(exc.detail),
                      dict(exc.headers) if exc.headers else None)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        if any(tuple(e["loc"]) == ("body", "labels") for e in exc.errors()):
            return _error(403, "labels_from_token", "a caller's labels come from its API token, never from the request")
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}" for e in exc.errors())
        return _error(422, "invalid_request", problems)

    def caller(request: Request) -> Caller:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "unauthenticated", "send your API token as 'Authorization: Bearer <token>'",
                           {"WWW-Authenticate": "Bearer"})
        found = tokens.caller(token.strip())
        if found is None:
            raise ApiError(401, "unauthenticated", "unknown API token", {"WWW-Authenticate": "Bearer"})
        return found

    unheld_labels = UnheldLabels()

    # Evaluated here, not postponed: FastAPI reads the dependency from the annotation.
    @app.post("/search", response_model=SearchResponse, responses={401: {}, 403: {}, 413: {}, 422: {}, 503: {}})
    def search_endpoint(request: SearchRequest, who: Annotated[Caller, Depends(caller)]) -> dict[str, Any]:
        if len(request.query) > config.max_query_chars:
            raise ApiError(422, "invalid_request", f"query: at most {config.max_query_chars} characters")
        if request.k is not None and request.k > config.max_k:
            raise ApiError(422, "invalid_request", f"k: at most {config.max_k}")
        k = min(settings.retrieval.k, config.max_k) if request.k is None else request.k
        started, deadline_start = time.perf_counter(), time.monotonic()
        try:
            # A connection is held only while the database works: never while the query is embedded (the model
            # may be an endpoint) nor while a reranker is waited for, so a slow endpoint starves no other caller.
            with database() as conn:
                version = store.versions.active_version(conn)
            if version is None:
                raise ApiError(503, "not_ready", "there is no active index version yet")
            planned = plan(request.query, who.labels, k=k, mode=request.mode, version=version, options=options,
                           started=deadline_start)
            with database() as conn:
                fetched = fetch(conn, planned)
                abstained = None if fetched else abstention_of(conn, planned)
                unheld_labels.report(conn, version, who)  # once per token and version: then free
        except SearchError as exc:
            raise ApiError(422, "invalid_request", str(exc)) from None
        except (PoolTimeout, psycopg.OperationalError) as exc:  # fail fast: a client can retry elsewhere
            log.warning("search service: the database does not answer: %s", type(exc).__name__)
            raise ApiError(503, "database_unavailable", "the index database does not answer; retry later",
                           {"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)}) from None
        except ModelUnavailableError as exc:
            log.error("search service: %s", exc)
            raise ApiError(503, "model_unavailable", "the query model is not available here") from None
        result = finish(planned, fetched, abstained)  # the reranker, within the search's deadline; the fused order otherwise
        counters.count(result.rerank)
        return {"results": [hit.to_dict() for hit in result.hits], "version": version.label,
                "model": version.model_identity or "", "took_ms": round((time.perf_counter() - started) * 1000, 2),
                "rerank": result.rerank, "note": result.note, "abstained": result.abstained}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:  # nothing here blocks: answered on the event loop
        breaker = None
        if options.reranker.endpoint:
            from rag_pipeline.endpoints.rerank import get_endpoint_reranker

            breaker = get_endpoint_reranker(options.reranker).breaker.state
        return PlainTextResponse(counters.prometheus(breaker), media_type="text/plain; version=0.0.4")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:  # on the event loop: it answers while every worker thread is busy
        return {"status": "ok"}

    def database_state() -> tuple[store.versions.IndexVersion | None, list[Any]]:
        with database() as conn:
            return store.versions.active_version(conn), store.health.latest_checks(conn)

    @app.get("/readyz", responses={503: {}})
    async def readyz(request: Request) -> JSONResponse:
        """Ready or not for anyone (a load balancer's probe); the version and the checks only for a token holder."""
        try:
            version, checks = await asyncio.get_running_loop().run_in_executor(probe_threads, database_state)
        except Exception as exc:  # any failure to reach the database means not ready; the log says which
            log.warning("search service not ready: %s", type(exc).__name__)
            return _error(503, "not_ready", "the index database does not answer",
                          {"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)})
        if version is None:
            return _error(503, "not_ready", "there is no active index version yet")
        waiting_for_model = warmup.not_ready_because(version)
        if waiting_for_model:
            return _error(503, "not_ready", waiting_for_model, {"Retry-After": "1"})
        try:
            caller(request)
        except ApiError:
            return JSONResponse({"status": "ready"})
        return JSONResponse({
            "status": "ready",
            "version": {"label": version.label, "model": version.embedding_model, "identity": version.model_identity,
                        "dimensions": version.dimensions, "rows": version.row_count},
            "checks": {name: {"passed": passed, "summary": summary, "checked_at": checked_at.isoformat()}
                       for name, passed, summary, checked_at in checks},
        })

    return app


def header_timeout_protocol(seconds: float) -> type:
    """uvicorn's HTTP/1.1 protocol with a deadline for the request line and headers, which uvicorn lacks: a
    client that trickles its headers (each byte resets uvicorn's keep-alive timer) is disconnected after `seconds`
    from the connection or from the end of the previous response."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderTimeoutProtocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(seconds, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # the headers are in
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderTimeoutProtocol


def serve(settings: Settings, database_url: str, announce: Callable[[], None] | None = None) -> None:
    """Build the app (a configuration it refuses raises ConfigError here, before `announce` says anything), then
    listen until stopped."""
    import uvicorn

    app = create_app(settings, database_url)
    if announce is not None:
        announce()
    uvicorn.run(app, host=settings.service.host, port=settings.service.port, log_level="info",
                http=header_timeout_protocol(settings.service.header_timeout_seconds))
