"""The search service under bad input and faults, on a real uvicorn server over the real database: text the
database cannot hold is a 422, a database that stops answering is a fast 503 with Retry-After, a client that
sends its headers or body slowly is cut off, and every error has the one documented shape."""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from psycopg import sql

from rag_pipeline.config import ServiceConfig, ServiceToken
from rag_pipeline.retrieval.service import create_app, header_timeout_protocol
from rag_pipeline_tests.conftest import serving

TOKEN = "staff-token-" + "z" * 20
HEADER_SECONDS, BODY_SECONDS, DATABASE_SECONDS = 1.0, 1.0, 2.0


@pytest.fixture
def server(clone, pg_admin_url) -> Iterator[tuple[str, object]]:
    conn, settings = clone
    config = ServiceConfig(
        tokens=(ServiceToken(name="bot", sha256=hashlib.sha256(TOKEN.encode()).hexdigest(), labels=["staff"]),),
        header_timeout_seconds=HEADER_SECONDS, body_timeout_seconds=BODY_SECONDS,
        database_timeout_seconds=DATABASE_SECONDS)
    app = create_app(settings.model_copy(update={"service": config}), conn.info.dsn)
    with serving(app, http=header_timeout_protocol(HEADER_SECONDS)) as base:
        yield base, conn


def _search(base: str, **body) -> httpx.Response:
    return httpx.post(f"{base}/search", json=body, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)


def _shape(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert set(response.json()) == {"error"} and response.json()["error"]["code"] == code, response.text


def test_text_the_database_cannot_hold_is_a_422(server):
    base, _ = server
    _shape(_search(base, query="travel\x00policy"), 422, "invalid_request")
    lone_surrogate = b'{"query": "travel \\ud800 policy"}'
    _shape(httpx.post(f"{base}/search", content=lone_surrogate, timeout=30,
                      headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}),
           422, "invalid_request")
    _shape(httpx.post(f"{base}/search", content=b"{not json", timeout=30,
                      headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}),
           422, "invalid_request")
    assert _search(base, query="travel policy", k=2).status_code == 200  # the service is still fine


def test_every_status_speaks_one_json_shape(server):
    base, _ = server
    _shape(httpx.get(f"{base}/no-such-page", timeout=30), 404, "not_found")
    _shape(httpx.get(f"{base}/search", timeout=30), 405, "method_not_allowed")
    _shape(httpx.post(f"{base}/search", json={"query": "x"}, timeout=30), 401, "unauthenticated")


def test_a_database_that_stops_answering_gives_a_fast_503_with_retry_after(server, pg_admin_url):
    import psycopg

    base, conn = server
    assert _search(base, query="travel policy", k=2).status_code == 200
    name = conn.info.dbname
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(sql.Identifier(name)))
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        try:
            started = time.monotonic()
            answer = _search(base, query="travel policy", k=2)
            took = time.monotonic() - started
            _shape(answer, 503, "database_unavailable")
            assert answer.headers["Retry-After"].isdigit()
            assert took < DATABASE_SECONDS + 1.5, f"503 after {took:.1f} s"
            ready = httpx.get(f"{base}/readyz", timeout=30)
            assert ready.status_code == 503 and "Retry-After" in ready.headers
        finally:
            admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(sql.Identifier(name)))
    deadline = time.monotonic() + 30  # and it recovers by itself once the database is back
    while _search(base, query="travel policy", k=2).status_code != 200:
        assert time.monotonic() < deadline, "the service did not recover"
        time.sleep(0.5)


def _closed_within(sock: socket.socket, seconds: float) -> bytes:
    """What the server sent before it closed the connection, waiting at most `seconds`."""
    sock.settimeout(seconds)
    received = b""
    while True:
        chunk = sock.recv(4096)  # socket.timeout (a failure) if the server keeps the connection open
        if not chunk:
            return received
        received += chunk


def test_a_client_that_trickles_its_headers_is_cut_off(server):
    base, _ = server
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        started = time.monotonic()
        sock.sendall(b"POST /search HTTP/1.1\r\nHost: x\r\n")
        closed = False
        for _ in range(int(HEADER_SECONDS * 10)):  # one byte each 0.25 s: each would reset a keep-alive timer
            time.sleep(0.25)
            try:
                sock.sendall(b"X")
            except OSError:
                closed = True
                break
        if not closed:
            _closed_within(sock, HEADER_SECONDS * 3)
        assert time.monotonic() - started < HEADER_SECONDS * 4


def test_a_client_that_stalls_its_body_gets_408_and_is_cut_off(server):
    base, _ = server
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        started = time.monotonic()
        sock.sendall(b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + TOKEN.encode() + b"\r\nContent-Length: 100\r\n\r\n{\"query\": ")
        answer = _closed_within(sock, BODY_SECONDS * 5)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b'"request_timeout"' in answer
        assert time.monotonic() - started < BODY_SECONDS * 4
