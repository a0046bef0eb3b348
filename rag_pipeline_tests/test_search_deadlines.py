"""Search under a slow, throttling or failing reranker and a frozen database (issue 47, cases 3 and 9), on the real
service (uvicorn), the real database and a real local HTTP reranker: a search answers within its deadline in the
fused order, holds no database connection while it waits, and leaves /readyz ready; a Retry-After longer than the
time left is not waited for; a circuit breaker stops calling a reranker that keeps failing, then tries it once. The
deadline holds against an endpoint that trickles its answer, answers over the size cap are refused, a search out of
time sends nothing and charges nothing, a Retry-After opens the breaker for minutes at most, and at most
max_concurrent searches wait on the endpoint while the others skip it at once. A
frozen (SIGSTOPped) database, a server of this test's own, holds no service thread past the query timeout. The
retrievers refuse the arguments they would ignore."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import psycopg
import pytest

from rag_pipeline.config import RerankerConfig, ServiceConfig, ServiceToken
from rag_pipeline.endpoints.rerank import (
    MAX_ANSWER_BYTES,
    MAX_RETRY_AFTER_OPEN,
    EndpointReranker,
    RerankUnavailable,
)
from rag_pipeline.retrieval.search import SearchOptions, search
from rag_pipeline.retrieval.service import create_app
from rag_pipeline.store.database import EmbeddedPostgres, ensure_database, migrate
from rag_pipeline.store.deadline import WATCHDOG, DatabaseDeadlineExceeded
from rag_pipeline_tests.conftest import serving

TOKEN = "staff-token-" + "d" * 20
QUERY = "how far ahead should flights be booked"
DEADLINE = 1.5  # retrieval.search_deadline_seconds in these tests
SLACK = 2.5  # what a loaded two-core test machine may add to a request
COOL_DOWN = 3.0  # retrieval.reranker.breaker_cooldown_seconds


class ScriptedReranker:
    """POST /rerank on 127.0.0.1, answering as `mode` says: ok (passages holding `favourite` first), slow (after
    `delay` seconds), throttle (429 with `Retry-After: retry_after`), fail (500), trickle (the headers at once, then
    the answer a byte every 0.3 s), trickle_head (the whole response so), huge (an answer of 5 MiB), huge_unsized
    (the same without Content-Length). `calls` counts what it received."""

    def __init__(self, favourite: str = "flights") -> None:
        self.mode, self.delay, self.retry_after, self.favourite = "ok", 15.0, 25, favourite
        self.calls = 0
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                """Quiet: the test reads the counter."""

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server._lock:
                    server.calls += 1
                if server.mode == "slow":
                    server._stopped.wait(server.delay)
                elif server.mode in ("throttle", "fail"):
                    self.send_response(429 if server.mode == "throttle" else 500)
                    if server.mode == "throttle":
                        self.send_header("Retry-After", str(server.retry_after))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                results = [{"index": i, "relevance_score": 1.0 if server.favourite in text else 0.1 / (i + 1)}
                           for i, text in enumerate(body["texts"])]
                answer: dict[str, object] = {"results": results}
                if server.mode.startswith("huge"):
                    answer["padding"] = "x" * (5 * 1024 * 1024)
                data = json.dumps(answer).encode()
                head = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n"
                if server.mode != "huge_unsized":
                    head += f"Content-Length: {len(data)}\r\n".encode()
                head += b"\r\n"
                try:
                    if server.mode.startswith("trickle"):
                        if server.mode == "trickle":
                            self.wfile.write(head)
                            head = b""
                        for byte in head + data:
                            if server._stopped.wait(0.3):
                                return
                            self.wfile.write(bytes([byte]))
                    else:
                        self.wfile.write(head + data)
                except OSError:  # the client gave up waiting
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def reranked_service(clone) -> Iterator[tuple[str, ScriptedReranker, object, object]]:
    """The service with an endpoint reranker (its breaker opens after three failed searches, for COOL_DOWN s), two
    database connections and a DEADLINE-second search deadline."""
    with _reranked_service(clone, DEADLINE) as served:
        yield served


@contextmanager
def _reranked_service(clone, deadline: float, **reranker_settings) -> Iterator[tuple[str, ScriptedReranker, object, object]]:
    conn, settings = clone
    reranker = ScriptedReranker()
    retrieval = settings.retrieval.model_copy(update={
        "search_deadline_seconds": deadline,
        "reranker": RerankerConfig(endpoint=reranker.url, top_n=10, breaker_failures=3, breaker_cooldown_seconds=COOL_DOWN,
                                   **reranker_settings)})
    service = ServiceConfig(connections=2, database_timeout_seconds=2.0, tokens=(
        ServiceToken(name="bot", sha256=hashlib.sha256(TOKEN.encode()).hexdigest(), labels=["staff"]),))
    settings = settings.model_copy(update={"retrieval": retrieval, "service": service})
    try:
        with serving(create_app(settings, conn.info.dsn)) as base:
            ready_by = time.monotonic() + 180  # the query model loads before the service says ready
            while httpx.get(f"{base}/readyz", timeout=30).status_code != 200:
                assert time.monotonic() < ready_by, "the service never became ready"
                time.sleep(0.2)
            yield base, reranker, conn, settings
    finally:
        reranker.stop()


def _search(base: str, query: str = QUERY, timeout: float = 20) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = httpx.post(f"{base}/search", json={"query": query, "k": 5}, timeout=timeout,
                          headers={"Authorization": f"Bearer {TOKEN}"})
    return response, time.monotonic() - started


def _fused(conn, settings, query: str = QUERY) -> list[str]:
    """The order without a reranker, from the same query model the service uses."""
    options = SearchOptions.from_settings(settings, light_query_model=False,
                                          reranker=RerankerConfig())
    return [hit.chunk_id for hit in search(conn, query, ["staff"], k=5, options=options)]


def _metric(base: str, outcome: str) -> int:
    text = httpx.get(f"{base}/metrics", timeout=30).text
    found = re.search(rf'^rag_search_rerank_total{{outcome="{outcome}"}} (\d+)$', text, re.MULTILINE)
    assert found, text
    return int(found.group(1))


def test_a_slow_reranker_is_skipped_by_the_deadline_and_starves_no_caller_of_connections(reranked_service):
    base, reranker, conn, settings = reranked_service
    expected = _fused(conn, settings)
    reranker.mode = "slow"  # 15 s: each search took 3 x 10 s, a database connection in hand
    with ThreadPoolExecutor(8) as pool:
        searches = [pool.submit(_search, base) for _ in range(6)]  # three times the pool's two connections
        time.sleep(0.5)
        ready = httpx.get(f"{base}/readyz", timeout=20)  # asked while six searches wait on the reranker
        answers = [future.result() for future in searches]
    assert ready.status_code == 200, ready.text
    for response, took in answers:
        assert response.status_code == 200, response.text
        assert took < DEADLINE + SLACK, f"a search took {took:.1f} s"
        body = response.json()
        assert [hit["chunk_id"] for hit in body["results"]] == expected  # the fused order
        assert all(hit["rerank_score"] is None for hit in body["results"])
        assert body["rerank"] in ("skipped_deadline", "skipped_breaker_open")
    assert _metric(base, "skipped_deadline") >= 1
    assert _metric(base, "skipped_deadline") + _metric(base, "skipped_breaker_open") == 6


def test_a_retry_after_longer_than_the_time_left_is_not_waited_for(reranked_service, caplog):
    base, reranker, conn, settings = reranked_service
    reranker.mode = "throttle"  # 429 with Retry-After: 25 made one search take 50 s
    with caplog.at_level(logging.WARNING, logger="rag_pipeline"):
        response, took = _search(base)
    assert "reranker skipped (throttled), the fused order stands" in caplog.text and "HTTP 429" in caplog.text
    assert response.status_code == 200 and took < DEADLINE + SLACK, f"{response.status_code} after {took:.1f} s"
    assert response.json()["rerank"] == "skipped_throttled"
    assert [hit["chunk_id"] for hit in response.json()["results"]] == _fused(conn, settings)
    assert reranker.calls == 1  # not retried inline
    # and honoured across searches: nothing is sent before the 25 s it asked for are over
    assert _search(base)[0].json()["rerank"] == "skipped_breaker_open"
    assert reranker.calls == 1


def test_the_breaker_stops_calling_a_failing_reranker_then_tries_it_once(reranked_service):
    base, reranker, _, _ = reranked_service
    reranker.mode = "fail"
    for _ in range(3):  # breaker_failures: three searches in a row get no ranking
        response, _took = _search(base)
        assert response.status_code == 200 and response.json()["rerank"] in ("skipped_failed", "skipped_deadline")
    called = reranker.calls
    assert called >= 3
    assert "rag_search_reranker_breaker_open 1" in httpx.get(f"{base}/metrics", timeout=30).text
    for _ in range(3):  # open: not called at all
        response, took = _search(base)
        assert response.json()["rerank"] == "skipped_breaker_open" and took < DEADLINE + SLACK
    assert reranker.calls == called
    time.sleep(COOL_DOWN + 0.2)  # the cool-down is over; the endpoint is well again
    reranker.mode = "ok"
    response, _took = _search(base)
    assert response.json()["rerank"] == "reranked" and reranker.calls == called + 1  # one trial call
    assert "flights" in response.json()["results"][0]["text"] and response.json()["results"][0]["rerank_score"] == 1.0
    assert "rag_search_reranker_breaker_open 0" in httpx.get(f"{base}/metrics", timeout=30).text
    assert _search(base)[0].json()["rerank"] == "reranked" and reranker.calls == called + 2  # closed again
    assert _metric(base, "skipped_breaker_open") == 3 and _metric(base, "reranked") == 2


@pytest.mark.parametrize("mode", ["trickle", "trickle_head"])
def test_a_reranker_that_trickles_its_answer_is_cut_at_the_deadline(reranked_service, mode):
    base, reranker, conn, settings = reranked_service
    reranker.mode = mode  # a byte every 0.3 s: each byte reset httpx's read timeout, so no timeout ever fired
    response, took = _search(base)
    assert response.status_code == 200 and took < DEADLINE + SLACK, f"{response.status_code} after {took:.1f} s"
    assert response.json()["rerank"] == "skipped_deadline"
    assert [hit["chunk_id"] for hit in response.json()["results"]] == _fused(conn, settings)
    assert reranker.calls == 1  # no time was left for a retry


@pytest.mark.parametrize("mode", ["huge", "huge_unsized"])
def test_a_reranker_answer_over_the_size_cap_is_refused(reranked_service, mode, caplog):
    base, reranker, conn, settings = reranked_service
    reranker.mode = mode  # 5 MiB of valid JSON, with and without a Content-Length to refuse it by
    with caplog.at_level(logging.WARNING, logger="rag_pipeline"):
        response, took = _search(base)
    assert response.status_code == 200 and response.json()["rerank"] == "skipped_failed", response.text
    assert f"an answer over {MAX_ANSWER_BYTES} bytes, refused" in caplog.text
    assert [hit["chunk_id"] for hit in response.json()["results"]] == _fused(conn, settings)
    assert reranker.calls == 1  # refused, not retried


def test_a_search_out_of_time_before_its_reranker_neither_calls_nor_charges_it():
    reranker = ScriptedReranker()
    try:
        endpoint = EndpointReranker(RerankerConfig(endpoint=reranker.url, breaker_failures=2,
                                                   breaker_cooldown_seconds=COOL_DOWN))
        passages = ["flights are booked ahead", "hotel rooms"]
        # The database or the query model used the search's time, all of it or all but too little to be answered:
        # twice breaker_failures.
        for left in (-0.01, 0.05, -0.01, 0.05):
            with pytest.raises(RerankUnavailable) as caught:
                endpoint.scores(QUERY, passages, deadline=time.monotonic() + left)
            assert caught.value.reason == "deadline"
        assert reranker.calls == 0 and endpoint.breaker.state == "closed"
        assert not caught.value.called  # what tells the breaker the endpoint was not asked
        reranker.mode = "fail"  # now two real failures open it
        for _ in range(2):
            with pytest.raises(RerankUnavailable):
                endpoint.scores(QUERY, passages, deadline=time.monotonic() + DEADLINE)
        called = reranker.calls
        time.sleep(COOL_DOWN + 0.2)
        assert endpoint.breaker.state == "half_open"
        with pytest.raises(RerankUnavailable, match="deadline"):  # does not spend the trial
            endpoint.scores(QUERY, passages, deadline=time.monotonic() - 0.01)
        assert endpoint.breaker.state == "half_open" and reranker.calls == called
        reranker.mode = "ok"
        assert endpoint.scores(QUERY, passages, deadline=time.monotonic() + DEADLINE)[0] == 1.0  # the trial
        assert endpoint.breaker.state == "closed" and reranker.calls == called + 1
        endpoint.close()
    finally:
        reranker.stop()


def test_a_retry_after_of_a_year_opens_the_breaker_for_minutes_only(caplog):
    reranker = ScriptedReranker()
    try:
        reranker.mode, reranker.retry_after = "throttle", 31536000
        endpoint = EndpointReranker(RerankerConfig(endpoint=reranker.url, breaker_cooldown_seconds=COOL_DOWN))
        with caplog.at_level(logging.WARNING, logger="rag_pipeline"), \
                pytest.raises(RerankUnavailable, match="Retry-After 3.1536e"):
            endpoint.scores(QUERY, ["flights", "hotels"], deadline=time.monotonic() + DEADLINE)
        assert f"not called for {MAX_RETRY_AFTER_OPEN:.0f} s" in caplog.text
        assert MAX_RETRY_AFTER_OPEN - 5 < endpoint.breaker.seconds_open() <= MAX_RETRY_AFTER_OPEN == 300
        assert endpoint.breaker.longest_open == MAX_RETRY_AFTER_OPEN  # a cool-down under the cap: the cap
        longer = EndpointReranker(RerankerConfig(endpoint=reranker.url, breaker_cooldown_seconds=1800))
        with pytest.raises(RerankUnavailable):
            longer.scores(QUERY, ["flights", "hotels"], deadline=time.monotonic() + DEADLINE)
        assert 1795 < longer.breaker.seconds_open() <= 1800  # a longer cool-down: the cool-down
        endpoint.close()
        longer.close()
    finally:
        reranker.stop()


CAPPED_DEADLINE = 4.0  # long enough that every search below arrives while the two slots are held


def test_at_most_max_concurrent_searches_wait_on_a_slow_reranker(clone):
    with _reranked_service(clone, CAPPED_DEADLINE, max_concurrent=2) as (base, reranker, conn, settings):
        expected = _fused(conn, settings)
        reranker.mode = "slow"
        with ThreadPoolExecutor(10) as pool:
            searches = [pool.submit(_search, base) for _ in range(8)]
            time.sleep(0.5)
            probe_started = time.monotonic()
            ready, healthy = httpx.get(f"{base}/readyz", timeout=20), httpx.get(f"{base}/healthz", timeout=20)
            probes_took = time.monotonic() - probe_started
            answers = [future.result() for future in searches]
        assert ready.status_code == 200 and healthy.status_code == 200 and probes_took < SLACK
        outcomes = sorted(response.json()["rerank"] for response, _ in answers)
        assert outcomes == ["skipped_busy"] * 6 + ["skipped_deadline"] * 2, outcomes
        assert reranker.calls == 2  # the server counts: only the two slots' searches reached it
        busy = [took for response, took in answers if response.json()["rerank"] == "skipped_busy"]
        waited = [took for response, took in answers if response.json()["rerank"] == "skipped_deadline"]
        assert max(busy) < min(waited) and max(busy) < CAPPED_DEADLINE - 1, (busy, waited)  # at once, not at the deadline
        assert all([hit["chunk_id"] for hit in response.json()["results"]] == expected for response, _ in answers)
        assert _metric(base, "skipped_busy") == 6 and _metric(base, "skipped_deadline") == 2


def _server_processes(pgdata: Path) -> list[int]:
    """The postmaster of `pgdata` and its children (every backend)."""
    postmaster = int((pgdata / "postmaster.pid").read_text().split()[0])
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
                children.append(int(entry))
    return [postmaster, *children]


@pytest.fixture
def own_server() -> Iterator[EmbeddedPostgres]:
    """A server of this test's own, to freeze: never the session's."""
    workdir = Path(tempfile.mkdtemp(prefix="ragpg-frozen-"))  # short path: socket names are length-limited
    server = EmbeddedPostgres(workdir / "pg")
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_frozen_database_holds_no_service_thread_past_the_query_timeout(own_server, clone):
    _, settings = clone
    ensure_database(own_server.url("postgres"), "rag")
    url = own_server.url("rag")
    migrate(url)  # prepared, with no index version yet: every request reaches the database and says "not ready"
    query_timeout = 2.0
    service = ServiceConfig(connections=2, database_timeout_seconds=1.0, query_timeout_seconds=query_timeout,
                            tokens=(ServiceToken(name="bot", sha256=hashlib.sha256(TOKEN.encode()).hexdigest(),
                                                 labels=["staff"]),))
    with serving(create_app(settings.model_copy(update={"service": service}), url)) as base, \
            psycopg.connect(url, autocommit=True) as held:
        assert httpx.get(f"{base}/readyz", timeout=20).json()["error"]["message"] == \
            "there is no active index version yet"  # the database answers
        processes = _server_processes(own_server.pgdata)
        for pid in processes:
            os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(DatabaseDeadlineExceeded, match="did not answer within 1 s"):
                with WATCHDOG.guard(held, 1.0):
                    held.execute("SELECT 1")  # mid-query on a Unix socket: statement_timeout never fires
            assert time.monotonic() - started < 1.0 + SLACK
            with ThreadPoolExecutor(6) as pool:
                searches = [pool.submit(_search, base, QUERY, 8) for _ in range(4)]
                readies = [pool.submit(httpx.get, f"{base}/readyz", timeout=8) for _ in range(2)]
                started = time.monotonic()
                for response, took in (future.result() for future in searches):
                    assert response.status_code == 503 and response.json()["error"]["code"] == \
                        "database_unavailable", response.text
                    assert took < query_timeout + SLACK, f"a search was held {took:.1f} s"
                for future in readies:
                    assert future.result().status_code == 503
                assert time.monotonic() - started < query_timeout + SLACK
        finally:
            for pid in processes:
                os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + 30  # thawed, it serves again by itself
        while httpx.get(f"{base}/readyz", timeout=20).json()["error"]["message"] != \
                "there is no active index version yet":
            assert time.monotonic() < deadline, "the service did not recover"
            time.sleep(0.3)


def test_the_retrievers_refuse_the_arguments_they_would_ignore():
    from rag_pipeline.retrieval.integrations.langchain import RagPipelineRetriever as LangChainRetriever
    from rag_pipeline.retrieval.integrations.llamaindex import RagPipelineRetriever as LlamaIndexRetriever

    never_called = httpx.Client(base_url="http://127.0.0.1:9")  # a refusal comes before any request
    for retriever in (LangChainRetriever, LlamaIndexRetriever):
        with pytest.raises(TypeError, match="'labels'.*come from its API token"):
            retriever(token=TOKEN, http_client=never_called, labels=["hr"])
        with pytest.raises(TypeError, match="'index_version'.*active index version"):
            retriever(token=TOKEN, http_client=never_called, index_version=2)
    langchain = LangChainRetriever(token=TOKEN, http_client=never_called)
    with pytest.raises(TypeError, match="invoke does not take 'labels'"):
        langchain.invoke(QUERY, labels=["hr"])
    with pytest.raises(TypeError, match="invoke does not take 'index_version'"):
        langchain.invoke(QUERY, index_version=2)


def test_a_reranker_behind_the_environments_proxy_keeps_httpxs_transport(monkeypatch):
    """httpx speaks to a proxy the environment names only through its own transport: the deadline transport, which
    would go straight to the endpoint past the proxy (and its egress policy), is used only where no proxy applies."""
    from rag_pipeline.endpoints.deadline_transport import DeadlineTransport

    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY", "https_proxy", "http_proxy", "all_proxy",
                 "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    config = RerankerConfig(endpoint="http://reranker.internal:8080")
    direct = EndpointReranker(config)
    assert isinstance(direct._client._transport, DeadlineTransport)
    direct.close()
    monkeypatch.setenv("http_proxy", "http://proxy.internal:3128")
    proxied = EndpointReranker(config)
    assert not isinstance(proxied._client._transport, DeadlineTransport)
    assert proxied._client._mounts  # httpx mounted the proxy
    proxied.close()
    monkeypatch.setenv("no_proxy", "reranker.internal")
    bypassed = EndpointReranker(config)
    assert isinstance(bypassed._client._transport, DeadlineTransport)
    bypassed.close()
