"""The index in applications' hands: the SQL function and its role-bound labels, the stable reporting view, the HTTP
search service, and the LangChain and LlamaIndex retrievers, on the real database and model."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import time
import uuid

import psycopg
import pytest
from fastapi.testclient import TestClient
from pgvector import HalfVector
from pgvector.psycopg import register_vector
from psycopg import sql

from rag_pipeline import store
from rag_pipeline.config import EmbeddingConfig, ServiceConfig, ServiceToken, split_backend
from rag_pipeline.domain import ids
from rag_pipeline.embedding import embedders
from rag_pipeline.embedding.embedders import get_embedder
from rag_pipeline.lifecycle import blue_green
from rag_pipeline.retrieval.search import SearchOptions, search
from rag_pipeline.retrieval.service import create_app

QUERY = "how far ahead should flights be booked"
FINANCE_DOC = "finance/q3-report.pdf"  # labelled finance only (its folder's _meta.json)
STAFF_TOKEN, FINANCE_TOKEN = "staff-token-" + "x" * 20, "finance-token-" + "y" * 20


@pytest.fixture
def role(clone):
    """A login role that may only EXECUTE rag.search, bound to the label staff."""
    conn, _ = clone
    name = f"app_{uuid.uuid4().hex[:8]}"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    conn.execute(sql.SQL("GRANT USAGE ON SCHEMA rag TO {}").format(sql.Identifier(name)))
    conn.execute(sql.SQL("GRANT EXECUTE ON FUNCTION rag.search(halfvec, text, text[], integer, text) TO {}")
                 .format(sql.Identifier(name)))
    conn.execute("INSERT INTO rag.role_labels (role_name, labels) VALUES (%s::regrole, '{staff}')", (name,))
    yield name
    conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
    conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def _as(conn: psycopg.Connection, role_name: str) -> psycopg.Connection:
    app = psycopg.connect(psycopg.conninfo.make_conninfo(conn.info.dsn, user=role_name), autocommit=True)
    register_vector(app)  # as an application with pgvector's client does (or it sends '[...]'::halfvec text)
    return app


def _vector(text: str) -> HalfVector:
    """The query as the clone's index embeds it (a new index's default, int8 ONNX), as an application would."""
    return HalfVector(get_embedder(EmbeddingConfig().backend_model).embed_query(text))


def test_a_role_with_execute_alone_searches_with_its_own_labels_and_reads_nothing_else(clone, role):
    conn, settings = clone
    with _as(conn, role) as app:
        rows = app.execute("SELECT chunk_id, path FROM rag.search(%s, %s, %s, 5, 'hybrid')",
                           (_vector(QUERY), QUERY, ["staff"])).fetchall()
        # The same ranking as the pipeline's own search, which runs the same function.
        expected = search(conn, QUERY, ["staff"], k=5, options=SearchOptions.from_settings(settings))
        assert [r[0] for r in rows] == [h.chunk_id for h in expected] and rows
        assert rows[0][1] == "handbook/travel-policy.md"
        sparse = app.execute("SELECT path FROM rag.search(NULL, 'quarterly revenue', '{staff}', 10, 'sparse')")
        assert FINANCE_DOC not in {r[0] for r in sparse.fetchall()}
        # Passing a label the role is not bound to is refused, not widened (nor silently narrowed).
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="may not search with labels"):
            app.execute("SELECT * FROM rag.search(NULL, 'quarterly revenue', '{staff,finance}', 10, 'sparse')")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="no unlabelled search"):
            app.execute("SELECT * FROM rag.search(NULL, 'quarterly revenue', '{}', 10, 'sparse')")
        for statement in ("SELECT count(*) FROM documents", "SELECT count(*) FROM index_v1",
                          "SELECT count(*) FROM rag.indexed_chunks", "SELECT * FROM rag.role_labels",
                          "SELECT * FROM rag.search_version(1, NULL, 'x', '{staff}', 1, 'sparse', '{}')",
                          "UPDATE rag.role_labels SET labels = '{finance}'"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute(statement)
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="384"):
            app.execute("SELECT * FROM rag.search(%s, 'x', '{staff}', 5, 'dense')", (HalfVector([0.1] * 8),))
    # A role that could plant an operator or function where the definer resolves names is refused.
    conn.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(role)))
    with _as(conn, role) as app, pytest.raises(psycopg.errors.InsufficientPrivilege, match="may create objects"):
        app.execute("SELECT * FROM rag.search(NULL, 'travel', '{staff}', 5, 'sparse')")
    conn.execute(sql.SQL("REVOKE CREATE ON SCHEMA public FROM {}").format(sql.Identifier(role)))
    # A role without a row in rag.role_labels may not search at all, whatever it passes.
    conn.execute("DELETE FROM rag.role_labels WHERE role_name = %s::regrole", (role,))
    with _as(conn, role) as app, pytest.raises(psycopg.errors.InsufficientPrivilege, match="no row"):
        app.execute("SELECT * FROM rag.search(NULL, 'travel', '{staff}', 5, 'sparse')")


def test_grants_and_views_on_the_stable_surface_survive_promotion_and_rollback(clone, role):
    conn, _ = clone
    admin = f"admin_{uuid.uuid4().hex[:8]}"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(admin)))
    try:
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA rag TO {0}; GRANT SELECT ON rag.indexed_chunks TO {0};"
                             " GRANT EXECUTE ON FUNCTION rag.active_rows() TO {0}").format(sql.Identifier(admin)))
        # A user's own report on the view does not block a promotion (the old active_chunks view did).
        conn.execute("CREATE VIEW chunks_per_label AS SELECT unnest(acl_labels) AS label, count(*) AS n"
                     " FROM rag.indexed_chunks GROUP BY 1")
        before = dict(conn.execute("SELECT label, n FROM chunks_per_label").fetchall())
        assert before["staff"] > 0 and before["finance"] > 0  # administrators see every row with its labels
        active = store.versions.active_version(conn)
        model = ids.ModelIdentity(*split_backend(active.embedding_model), active.model_revision)
        candidate = store.versions.create_version(conn, model, active.dimensions, active.chunker_version,
                                                 active.parser_version)
        blue_green.promote(conn, candidate.version_id, None, force=True, reason="grant survival drill")
        with _as(conn, role) as app:  # the empty new version answers: nothing, but no permission error
            assert app.execute("SELECT * FROM rag.search(%s, %s, '{staff}', 5, 'hybrid')",
                               (_vector(QUERY), QUERY)).fetchall() == []
        with _as(conn, admin) as reader:
            assert reader.execute("SELECT count(*) FROM rag.indexed_chunks").fetchone()[0] == 0
        blue_green.rollback(conn)
        with _as(conn, role) as app:
            assert app.execute("SELECT count(*) FROM rag.search(%s, %s, '{staff}', 5, 'hybrid')",
                               (_vector(QUERY), QUERY)).fetchone()[0] == 5
        with _as(conn, admin) as reader:
            assert reader.execute("SELECT count(*) FROM rag.indexed_chunks").fetchone()[0] == sum(
                1 for _ in conn.execute(sql.SQL("SELECT 1 FROM {}").format(sql.Identifier(active.table_name))))
        assert dict(conn.execute("SELECT label, n FROM chunks_per_label").fetchall()) == before
    finally:
        conn.execute("DROP VIEW IF EXISTS chunks_per_label")
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(admin)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(admin)))


@pytest.fixture
def service(clone, monkeypatch):
    """The search service over the clone: a staff token given by its sha256, a finance token read from the
    environment."""
    conn, settings = clone
    tokens = (ServiceToken(name="handbook-bot", sha256=hashlib.sha256(STAFF_TOKEN.encode()).hexdigest(),
                           labels=["staff"]),
              ServiceToken(name="finance-bot", env="FINANCE_BOT_TOKEN", labels=["finance"]))
    settings = settings.model_copy(update={"service": ServiceConfig(tokens=tokens, max_k=20, max_request_bytes=2048)})
    app = create_app(settings, conn.info.dsn, environ={"FINANCE_BOT_TOKEN": FINANCE_TOKEN})
    with TestClient(app) as client:
        yield client, conn


def _search(client, token: str | None, **body):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return client.post("/search", json=body, headers=headers)


def test_the_service_searches_with_the_tokens_labels_and_refuses_everything_else(service):
    client, conn = service
    answer = _search(client, STAFF_TOKEN, query=QUERY, k=3)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["version"] == "v1" and len(body["results"]) == 3 and body["model"].startswith("onnx-int8:sha256:")
    first = body["results"][0]
    assert first["path"] == "handbook/travel-policy.md" and first["chunk_id"] and "flags" in first
    staff_paths = {r["path"] for r in _search(client, STAFF_TOKEN, query="quarterly revenue", k=20).json()["results"]}
    finance = _search(client, FINANCE_TOKEN, query="quarterly revenue", k=20).json()["results"]
    assert FINANCE_DOC not in staff_paths and finance and {r["path"] for r in finance} == {FINANCE_DOC}

    def refused(response, status: int, code: str) -> None:
        assert response.status_code == status, response.text
        assert response.json()["error"]["code"] == code

    refused(_search(client, None, query=QUERY), 401, "unauthenticated")
    refused(_search(client, "not-a-token", query=QUERY), 401, "unauthenticated")
    refused(client.post("/search", json={"query": QUERY}, headers={"Authorization": f"Basic {STAFF_TOKEN}"}),
            401, "unauthenticated")
    refused(_search(client, STAFF_TOKEN, query=QUERY, labels=["finance"]), 403, "labels_from_token")
    refused(_search(client, STAFF_TOKEN, query=QUERY, k=21), 422, "invalid_request")
    refused(_search(client, STAFF_TOKEN, query=QUERY, mode="exhaustive"), 422, "invalid_request")
    refused(_search(client, STAFF_TOKEN, query=""), 422, "invalid_request")
    refused(_search(client, STAFF_TOKEN, query="x" * 2001), 422, "invalid_request")
    refused(_search(client, STAFF_TOKEN, query="x" * 4000), 413, "request_too_large")

    def chunked():  # no Content-Length: the limit holds as the body arrives
        yield b'{"query": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}'

    refused(client.post("/search", content=chunked(), headers={"Authorization": f"Bearer {STAFF_TOKEN}",
                                                                "Content-Type": "application/json"}),
            413, "request_too_large")
    assert client.get("/healthz").json() == {"status": "ok"}
    assert _ready(client).json() == {"status": "ready"}  # details only for a token holder
    ready = _ready(client, {"Authorization": f"Bearer {STAFF_TOKEN}"}).json()
    assert ready["status"] == "ready" and ready["version"]["label"] == "v1"
    assert ready["version"]["identity"].startswith("onnx-int8:sha256:")
    assert set(ready["checks"]) >= {"acl_coverage", "deletion_replay"}  # recorded by the ingest's checks
    assert "/search" in client.get("/openapi.json").json()["paths"]


def test_a_token_whose_labels_no_document_has_is_named_in_the_log_never_to_its_caller(clone, caplog):
    """A misspelt label in service.tokens reaches nothing (nothing is widened; the token's other labels still find
    their documents); the operator reads which labels no document has in the service's log, once, and the caller's
    answer says nothing about it."""
    conn, settings = clone
    token = "misspelt-" + "m" * 20
    tokens = (ServiceToken(name="typo-bot", sha256=hashlib.sha256(token.encode()).hexdigest(),
                           labels=["staff", "Finanse"]),)
    app = create_app(settings.model_copy(update={"service": ServiceConfig(tokens=tokens)}), conn.info.dsn)
    with TestClient(app) as client, caplog.at_level(logging.WARNING, logger="rag_pipeline.retrieval.service"):
        answers = [_search(client, token, query=QUERY) for _ in range(2)]
    # its staff documents are found (nothing widened, nothing lost); the misspelt finance label reaches nothing
    assert all(a.status_code == 200 and a.json()["results"] for a in answers), answers[0].text
    assert FINANCE_DOC not in {r["path"] for a in answers for r in a.json()["results"]}
    told = [r.getMessage() for r in caplog.records if "labels no document" in r.getMessage()]
    assert told == ["search service: token typo-bot carries labels no document of v1 has: Finanse (labels match "
                    "exactly)"], told
    assert "Finanse" not in answers[0].text


def _ready(client, headers: dict[str, str] | None = None, seconds: float = 120):
    """/readyz's first 200 answer (the query model loads in the background after the start)."""
    deadline = time.monotonic() + seconds
    while (answer := client.get("/readyz", headers=headers or {})).status_code != 200:
        assert answer.status_code == 503 and answer.json()["error"]["code"] == "not_ready", answer.text
        assert time.monotonic() < deadline, f"not ready after {seconds} s: {answer.text}"
        time.sleep(0.2)
    return answer


def test_the_service_loads_its_query_model_before_it_says_ready(clone, monkeypatch):
    """A load balancer sends traffic once /readyz says ready: the first search must not load the model."""
    conn, settings = clone
    settings = settings.model_copy(update={"service": ServiceConfig(tokens=(ServiceToken(
        name="handbook-bot", sha256=hashlib.sha256(STAFF_TOKEN.encode()).hexdigest(), labels=["staff"]),))})
    monkeypatch.setattr(embedders, "_embedders", {})  # this process has no model loaded yet
    loads = []
    real_embedder = embedders.OnnxEmbedder  # the clone's index is int8 (a new index's default)
    monkeypatch.setattr(embedders, "OnnxEmbedder",
                        lambda *args, **kwargs: loads.append(1) or real_embedder(*args, **kwargs))
    with TestClient(create_app(settings, conn.info.dsn)) as client:
        first = client.get("/readyz")
        assert first.status_code == 200 or "loading" in first.json()["error"]["message"], first.text
        _ready(client)
        assert loads == [1]  # loaded by the warm-up, before ready
        assert _search(client, STAFF_TOKEN, query=QUERY, k=3).status_code == 200
        assert loads == [1]  # the first search found it loaded


def test_a_query_model_that_fails_to_load_keeps_the_service_unready_until_a_retry_loads_it(monkeypatch):
    from types import SimpleNamespace

    from rag_pipeline.embedding.locations import ModelUnavailableError
    from rag_pipeline.retrieval import service

    attempts = []

    def query_embedder(version, options):
        attempts.append(version.label)
        if attempts == ["v1"]:  # the embedding endpoint is down at the start
            raise ModelUnavailableError("connection refused")
        return SimpleNamespace(embed_query=lambda text: [0.0])

    monkeypatch.setattr(service, "query_embedder", query_embedder)
    monkeypatch.setattr(service, "cache_key", lambda version: version.label)
    warmup = service.QueryModelWarmup(SearchOptions())
    v1, v2 = SimpleNamespace(label="v1"), SimpleNamespace(label="v2")

    def settled(version) -> str | None:
        deadline = time.monotonic() + 30
        while (reason := warmup.not_ready_because(version)) == "the query model is loading":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        return reason

    assert settled(v1) == "the query model could not be loaded; the service log says why"
    assert warmup.not_ready_because(v1) == settled(v1) and attempts == ["v1"]  # not retried at once
    monkeypatch.setattr(warmup, "RETRY_SECONDS", 0.0)
    assert settled(v1) is None and attempts == ["v1", "v1"]
    # Promoted to another model: still ready while it loads (every replica unready at once drains the fleet).
    assert warmup.not_ready_because(v2) is None


def test_the_service_is_not_ready_without_an_active_version_and_refuses_to_start_without_tokens(service, clone):
    client, conn = service
    conn.execute("DELETE FROM index_alias")
    assert client.get("/readyz").status_code == 503
    assert _search(client, STAFF_TOKEN, query=QUERY).status_code == 503
    _, settings = clone
    from rag_pipeline.config import ConfigError

    with pytest.raises(ConfigError, match="no API tokens"):
        create_app(settings, conn.info.dsn)
    missing = ServiceConfig(tokens=(ServiceToken(name="bot", env="UNSET_TOKEN_VARIABLE", labels=["staff"]),))
    with pytest.raises(ConfigError, match=r"service.tokens\[0\].env"):
        create_app(settings.model_copy(update={"service": missing}), conn.info.dsn, environ={})
    twice = ServiceConfig(tokens=(ServiceToken(name="a", env="T1", labels=["staff"]),
                                  ServiceToken(name="b", env="T2", labels=["finance"])))
    with pytest.raises(ConfigError, match=r"service.tokens\[1\]: the same token"):
        create_app(settings.model_copy(update={"service": twice}), conn.info.dsn, environ={"T1": "x" * 20, "T2": "x" * 20})


def test_the_langchain_and_llamaindex_retrievers_return_labelled_documents(service):
    from rag_pipeline.retrieval.integrations.client import SearchServiceError
    from rag_pipeline.retrieval.integrations.langchain import RagPipelineRetriever as LangChainRetriever
    from rag_pipeline.retrieval.integrations.llamaindex import RagPipelineRetriever as LlamaIndexRetriever

    client, _ = service
    documents = LangChainRetriever(token=STAFF_TOKEN, k=3, http_client=client).invoke(QUERY)
    assert len(documents) == 3 and documents[0].metadata["path"] == "handbook/travel-policy.md"
    assert {"chunk_id", "page_start", "page_end", "score", "flags"} <= set(documents[0].metadata)
    assert documents[0].id == documents[0].metadata["chunk_id"] and "days" in documents[0].page_content
    nodes = LlamaIndexRetriever(token=FINANCE_TOKEN, k=5, mode="sparse", http_client=client).retrieve(
        "quarterly revenue")
    assert nodes and {n.node.metadata["path"] for n in nodes} == {FINANCE_DOC}
    assert all(n.score > 0 and n.node.node_id == n.node.metadata["chunk_id"] for n in nodes)
    with pytest.raises(SearchServiceError, match="401"):
        LangChainRetriever(token="wrong", http_client=client).invoke(QUERY)
    with pytest.raises(ValueError, match="API token"):
        LangChainRetriever(http_client=client)


def test_the_retrievers_import_neither_dagster_nor_docling_nor_torch():
    code = ("import sys, rag_pipeline.retrieval.integrations.langchain, rag_pipeline.retrieval.integrations.llamaindex; "
            "print(sorted(m for m in ('dagster', 'docling', 'torch', 'sentence_transformers') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]"


def test_cli_search_asks_a_running_service_with_its_tokens_labels_and_loads_no_model(clone, tmp_path, monkeypatch,
                                                                                       capsys):
    """`rag-pipeline search --service URL` (or RAG_SEARCH_URL) sends RAG_SEARCH_TOKEN to a running service: the
    labels are the token's, never the command line's; the process imports no model stack, no database driver and
    reads no configuration."""
    import http.server
    import threading

    import httpx

    from rag_pipeline import cli
    from rag_pipeline_tests.conftest import HEAVY_MODULES, imported_modules, serving

    conn, settings = clone
    tokens = (ServiceToken(name="handbook-bot", sha256=hashlib.sha256(STAFF_TOKEN.encode()).hexdigest(),
                           labels=["staff"]),
              ServiceToken(name="finance-bot", sha256=hashlib.sha256(FINANCE_TOKEN.encode()).hexdigest(),
                           labels=["finance"]))
    served = settings.model_copy(update={"service": ServiceConfig(tokens=tokens, max_k=20),
                                         "retrieval": settings.retrieval.model_copy(update={"k": 4})})
    app = create_app(served, conn.info.dsn)
    monkeypatch.chdir(tmp_path)  # the clone's rag_pipeline.yaml: the CLI reads it as a user's would
    with serving(app) as base:
        deadline = time.monotonic() + 120
        while httpx.get(f"{base}/readyz").status_code != 200:
            assert time.monotonic() < deadline, "the service did not get ready"
            time.sleep(0.2)
        direct = httpx.post(f"{base}/search", json={"query": QUERY, "k": 3},
                            headers={"Authorization": f"Bearer {STAFF_TOKEN}"}).json()["results"]
        traced = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "rag_pipeline.cli", "search", QUERY, "--service", base,
             "-k", "3", "--json"], capture_output=True, text=True, timeout=120, cwd=tmp_path,
            env={**{k: v for k, v in os.environ.items() if not k.startswith("RAG_")}, "RAG_SEARCH_TOKEN": STAFF_TOKEN})
        assert traced.returncode == 0, traced.stderr[-3000:]
        assert json.loads(traced.stdout) == direct and direct[0]["path"] == "handbook/travel-policy.md"
        assert imported_modules(traced.stderr) & {*HEAVY_MODULES, "psycopg", "pgvector", "numpy", "pydantic"} == set()

        def run(*argv: str) -> tuple[int, str, str]:
            code = cli.main(["search", *argv])
            out, err = capsys.readouterr()
            return code, out, err

        monkeypatch.setenv("RAG_SEARCH_TOKEN", FINANCE_TOKEN)
        monkeypatch.setenv("RAG_SEARCH_URL", base)  # configured once: every search asks the service
        code, out, _ = run("quarterly revenue", "-k", "20", "--json")
        assert code == 0 and {hit["path"] for hit in json.loads(out)} == {FINANCE_DOC}
        code, out, _ = run("quarterly revenue", "-k", "20")
        assert code == 0 and out.startswith(" 1. similarity ") and f"sample:{FINANCE_DOC} p.1" in out
        monkeypatch.setenv("RAG_SEARCH_TOKEN", STAFF_TOKEN)
        code, out, _ = run("quarterly revenue", "--json")  # no -k: the service's retrieval.k
        staff_hits = json.loads(out)
        assert code == 0 and len(staff_hits) == 4 and FINANCE_DOC not in {hit["path"] for hit in staff_hits}

        # Labels from the command line are refused, never mixed with the token's; so is a version the service
        # does not serve, a URL a token must not go to, a wrong, malformed or missing token, a k over max_k.
        code, _, err = run("quarterly revenue", "--labels", "finance")
        assert code == cli.EXIT_USAGE and "--labels" in err and "RAG_SEARCH_URL" in err
        code, _, err = run(QUERY, "--index-version", "1")
        assert code == cli.EXIT_USAGE and "--index-version" in err
        for url, why in (("file:///etc/passwd", "must be http(s)"), ("http://[::1", "malformed"),
                         ("http://127.0.0.1:http", "malformed"), (f"http://bot:pw@{base[7:]}", "user or password")):
            code, _, err = run(QUERY, "--service", url)
            assert code == cli.EXIT_USAGE and why in err and "Traceback" not in err, (url, err)
        code, _, err = run(QUERY, "-k", "21")
        assert code == cli.EXIT_USAGE and "k: at most 20" in err
        monkeypatch.setenv("RAG_SEARCH_TOKEN", STAFF_TOKEN + "\n")  # as read from a secret file
        code, _, err = run(QUERY)
        assert code == cli.EXIT_USAGE and "trailing newline" in err and STAFF_TOKEN not in err
        monkeypatch.setenv("RAG_SEARCH_TOKEN", "not-a-token")
        code, _, err = run(QUERY)
        assert code == cli.EXIT_USAGE and "401 unauthenticated" in err
        monkeypatch.delenv("RAG_SEARCH_TOKEN")
        code, _, err = run(QUERY)
        assert code == cli.EXIT_USAGE and "RAG_SEARCH_TOKEN" in err
        monkeypatch.delenv("RAG_SEARCH_URL")
        code, _, err = run(QUERY)  # neither labels nor a service: nothing searched
        assert code == cli.EXIT_USAGE and "--labels" in err and "--service" in err

    # Gone: a runtime error in one line. A redirect is not followed, so the token reaches no other server; an
    # answer that is not a search's is an error, not an empty result.
    monkeypatch.setenv("RAG_SEARCH_TOKEN", STAFF_TOKEN)
    code, _, err = run(QUERY, "--service", base)
    assert code == cli.EXIT_ERROR and err.startswith(f"error: search service: unreachable: {base}")
    seen: list[tuple[int, str | None]] = []

    class Answering(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            seen.append((self.server.server_port, self.headers.get("Authorization")))
            target = getattr(self.server, "redirect_to", None)
            self.send_response(307 if target else 200)
            body = b"" if target else b"<html>a proxy's page</html>"
            if target:
                self.send_header("Location", target)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with (http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answering) as elsewhere,
          http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answering) as redirecting):
        redirecting.redirect_to = f"http://127.0.0.1:{elsewhere.server_port}/search"
        for server in (elsewhere, redirecting):
            threading.Thread(target=server.serve_forever, daemon=True).start()
        redirected = run(QUERY, "--service", f"http://127.0.0.1:{redirecting.server_port}")
        not_a_search = run(QUERY, "--service", f"http://127.0.0.1:{elsewhere.server_port}")
        elsewhere.shutdown()
        redirecting.shutdown()
    assert redirected[0] == cli.EXIT_ERROR and "HTTP 307 redirect" in redirected[2] and "not followed" in redirected[2]
    assert not_a_search[0] == cli.EXIT_ERROR and "invalid_response" in not_a_search[2]
    assert seen == [(redirecting.server_port, f"Bearer {STAFF_TOKEN}"), (elsewhere.server_port, f"Bearer {STAFF_TOKEN}")]
