"""LLM contextual prefixes over real HTTP against a small OpenAI-compatible server on 127.0.0.1."""

import pytest
from dagster import DagsterInstance
from pydantic import ValidationError

from rag_pipeline import store
from rag_pipeline.config import PrefixConfig
from rag_pipeline.defs.runs import run_ingest
from rag_pipeline.retrieval.search import search
from rag_pipeline.text.identity import prefix_name
from rag_pipeline.text.prefixes import LlmPrefixer, PrefixError, PrefixRequest
from rag_pipeline_tests.chat_server import FakeChatServer


@pytest.fixture
def chat_server():
    server = FakeChatServer()
    yield server
    server.stop()


def test_client_retries_and_reports_failures(chat_server):
    config = PrefixConfig(mode="llm", endpoint=chat_server.url, model="m", max_retries=2, timeout_seconds=5)
    prefixer = LlmPrefixer(config)
    chat_server.fail_next = 2
    result = prefixer.prefixes("Doc text", [PrefixRequest("h1", "Battery facts")])
    assert result == {"h1": "Situated: this part covers Battery matters."}
    assert chat_server.calls == 3
    assert chat_server.bodies[-1]["model"] == "m" and chat_server.bodies[-1]["temperature"] == 0
    chat_server.fail_next = 10
    with pytest.raises(PrefixError, match="HTTP 503"):
        prefixer.prefixes("Doc text", [PrefixRequest("h2", "Other")])
    prefixer.close()
    with pytest.raises(ValidationError, match="mode llm needs endpoint and model"):
        PrefixConfig(mode="llm")
    with pytest.raises(ValidationError, match="'template' or 'llm'"):
        PrefixConfig(mode="magic")


def test_llm_prefixes_are_paid_once(make_settings, corpus, chat_server, db):
    source = [{"name": "sample", "root": str(corpus), "acl_labels": ["staff"]}]
    prefix = {"mode": "llm", "endpoint": chat_server.url, "model": "test-model", "max_retries": 0}
    with DagsterInstance.ephemeral() as instance:
        first = run_ingest(make_settings(source, prefix=prefix), instance=instance)
        assert first["success"], first.get("errors")
        chunks = db.execute("SELECT prefix, text FROM chunks").fetchall()
        assert chunks and all("Situated: this part covers" in p for p, _ in chunks)
        assert all("Situated" not in t for _, t in chunks)  # stored apart from the chunk text
        calls_after_first = chat_server.calls
        # One call per distinct chunk of each document (the cache is per document: derived text keeps its ACL).
        per_document = db.execute("SELECT count(DISTINCT (doc_id, content_hash)) FROM chunks").fetchone()[0]
        assert calls_after_first == per_document

        # Re-chunking the same content pays nothing: every prefix comes from the cache.
        db.execute("UPDATE documents SET status = 'pending_chunk' WHERE status = 'indexed'")
        again = run_ingest(make_settings(source, prefix=prefix), instance=instance)
        assert again["documents_chunked"] == 5 and again["vectors_embedded"] == 0
        assert chat_server.calls == calls_after_first

        # A chunker change pays only for chunks whose text is new.
        first_texts = {t for _, t in chunks}
        second = run_ingest(make_settings(source, prefix=prefix, chunking={"max_tokens": 60}), instance=instance)
        assert second["documents_chunked"] == 5
        new_chunks = {
            (doc_id, text) for doc_id, text in db.execute("SELECT doc_id, text FROM chunks").fetchall()
            if text not in first_texts
        }
        assert new_chunks and chat_server.calls - calls_after_first == len(new_chunks)

        hits = search(db, "how long does the battery last", ["staff"], k=3)
        identity = db.execute("SELECT rag.document_identity(title, metadata, identity) FROM documents WHERE doc_id = %s",
                              (hits[0].doc_id,)).fetchone()[0]
        assert hits[0].prefix.startswith(prefix_name(identity, hits[0].path)) and "Situated" in hits[0].prefix
        assert "Situated" not in hits[0].text
        # BM25 sees the prefix too: the word is in prefixes only
        assert store.search.bm25_ranking(db, store.versions.active_version(db), "situated", ("staff",), 3).chunk_ids


def test_a_failing_endpoint_leaves_documents_queued_and_the_index_intact(make_settings, corpus, chat_server, db):
    source = [{"name": "sample", "root": str(corpus), "acl_labels": ["staff"]}]
    with DagsterInstance.ephemeral() as instance:
        assert run_ingest(make_settings(source), instance=instance)["success"]
        rows_before = db.execute("SELECT count(*) FROM rag.indexed_chunks").fetchone()[0]
        chat_server.fail_next = 1000
        prefix = {"mode": "llm", "endpoint": chat_server.url, "model": "m", "max_retries": 0}
        broken = run_ingest(make_settings(source, prefix=prefix, chunking={"max_tokens": 150}), instance=instance)
        assert broken["success"] and broken["documents_chunked"] == 0
        assert db.execute("SELECT count(*) FROM documents WHERE status = 'pending_chunk'").fetchone()[0] == 5
        assert db.execute("SELECT count(*) FROM rag.indexed_chunks").fetchone()[0] == rows_before
        chat_server.fail_next = 0
        healed = run_ingest(make_settings(source, prefix=prefix, chunking={"max_tokens": 150}), instance=instance)
        assert healed["documents_chunked"] == 5
        assert db.execute("SELECT count(*) FROM documents WHERE status = 'pending_chunk'").fetchone()[0] == 0
