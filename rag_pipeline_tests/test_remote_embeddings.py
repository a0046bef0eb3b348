"""Remote embeddings: an OpenAI-compatible /v1/embeddings endpoint on 127.0.0.1 serving the real packaged MiniLM.
Its vectors match the local model's; 429 is retried after Retry-After; a remote index is its own version; a worker
that embeds remotely runs without torch."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
from dagster import DagsterInstance

from rag_pipeline import store
from rag_pipeline.config import EmbeddingConfig, load_settings
from rag_pipeline.defs.runs import run_ingest
from rag_pipeline.embedding.embedders import get_embedder
from rag_pipeline.embedding.locations import resolve_model
from rag_pipeline.embedding.remote import EmbeddingEndpointError, RemoteEmbedder
from rag_pipeline.retrieval.search import SearchOptions, search
from rag_pipeline.stages.chunk import ModelMismatchError
from rag_pipeline_tests.embedding_server import EmbeddingServer

TEXTS = [
    "The warehouse robot charges at dock seven after every shift.",
    "Travel expenses above 500 euros need a manager's approval.",
    "Quarterly revenue rose by twelve percent on higher service margins.",
    "Ein Satz auf Deutsch über Sicherheitsregeln im Lager.",
    "",
    "x " * 600,  # longer than the model's window: truncated alike on both sides
]


@pytest.fixture(scope="module")
def server():
    served = EmbeddingServer(resolve_model("all-MiniLM-L6-v2").location)
    yield served
    served.stop()


def remote_config(server: EmbeddingServer, **overrides) -> EmbeddingConfig:
    return EmbeddingConfig(backend="remote", endpoint=server.url, **overrides)


def test_remote_vectors_match_the_local_model(server):
    remote = RemoteEmbedder("remote:all-MiniLM-L6-v2", remote_config(server, batch_size=2, max_concurrency=3))
    local = get_embedder("all-MiniLM-L6-v2")
    theirs, ours = remote.embed_documents(TEXTS), local.embed_documents(TEXTS)
    assert theirs.shape == ours.shape == (len(TEXTS), 384)
    cosines = np.sum(theirs * ours, axis=1) / (np.linalg.norm(theirs, axis=1) * np.linalg.norm(ours, axis=1))
    assert cosines.min() > 1 - 1e-3, cosines
    assert remote.dimensions == 384
    query = remote.embed_query("when does the robot charge")
    assert float(query @ local.embed_query("when does the robot charge")) > 1 - 1e-3


def test_429_waits_for_retry_after_and_a_refusal_fails_at_once(server, monkeypatch):
    monkeypatch.setenv("EMBED_KEY", "s3cret")
    remote = RemoteEmbedder("remote:all-MiniLM-L6-v2", remote_config(server, api_key_env="EMBED_KEY"))
    server.throttle_next, server.retry_after = 1, "2"
    started = time.monotonic()
    assert remote.embed_documents(["one text"]).shape == (1, 384)
    assert time.monotonic() - started >= 2  # the endpoint asked for two seconds, not the 0.5 s backoff
    assert server.authorization[-1] == "Bearer s3cret"
    wrong = RemoteEmbedder("remote:no-such-model", remote_config(server, max_retries=5))
    started = time.monotonic()
    with pytest.raises(EmbeddingEndpointError, match="HTTP 404"):
        wrong.embed_documents(["one text"])
    assert time.monotonic() - started < 2  # a 404 is never retried


def _settings(tmp_path, db_url, corpus, **embedding):
    path = tmp_path / f"rag_{len(list(tmp_path.glob('rag_*.yaml')))}.yaml"
    import yaml

    path.write_text(yaml.safe_dump({
        "database_url": db_url, "data_dir": str(tmp_path / "data"),
        "sources": [{"name": "sample", "root": str(corpus), "acl_labels": ["staff"]}],
        "embedding": embedding,
    }))
    return load_settings(path)


def test_an_index_built_remotely_is_its_own_version_and_searchable(server, db, db_url, corpus, tmp_path):
    settings = _settings(tmp_path, db_url, corpus, backend="remote", endpoint=server.url)
    with DagsterInstance.ephemeral() as instance:
        summary = run_ingest(settings, instance=instance)
    assert summary["success"], summary.get("errors")
    assert summary["vectors_embedded"] > 0
    active = store.versions.active_version(db)
    assert active.embedding_model == "remote:all-MiniLM-L6-v2" and active.dimensions == 384
    hits = search(db, "how long does the robot battery last", ["staff"], k=3,
                  options=SearchOptions.from_settings(settings))
    assert hits and "battery" in " ".join(h.text.lower() for h in hits)
    cached = db.execute("SELECT DISTINCT model FROM embedding_cache").fetchall()
    assert cached == [("remote:all-MiniLM-L6-v2",)]  # never mixed with the local backend's vectors
    # The same weights run locally are another backend: a new index version, not an overwrite.
    local = _settings(tmp_path, db_url, corpus)
    with DagsterInstance.ephemeral() as instance:
        refused = run_ingest(local, instance=instance)
    assert not refused["success"]
    assert any("a model, weights or backend change is a new index version" in e for e in refused["errors"])
    assert ModelMismatchError.__doc__  # the error class the message comes from


def test_an_endpoint_serving_another_size_writes_nothing(server, db, db_url, corpus, tmp_path):
    settings = _settings(tmp_path, db_url, corpus, backend="remote", endpoint=server.url)
    with DagsterInstance.ephemeral() as instance:
        assert run_ingest(settings, instance=instance)["success"]
    (corpus / "new.md").write_text("# A new note\n\nThe loading dock opens at six in the morning.\n")
    server.truncate_to = 256
    try:
        with DagsterInstance.ephemeral() as instance:
            summary = run_ingest(settings, instance=instance)
    finally:
        server.truncate_to = None
    assert not summary["success"]
    assert any("256-dimensional vectors" in e for e in summary["errors"]), summary["errors"]
    status = db.execute("SELECT status FROM documents WHERE rel_path = 'new.md'").fetchone()[0]
    assert status == "pending_index"  # left queued, nothing written


NO_TORCH = """
import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch.") or name == "sentence_transformers":
            raise ImportError(f"{name} is not installed on this worker")
sys.meta_path.insert(0, NoTorch())
from rag_pipeline.config import load_settings
from rag_pipeline.stages.discover import discover
from rag_pipeline.stages.process import process_pending
settings = load_settings(sys.argv[1])
discover(settings.database_url, settings.sources)
stats = process_pending(settings.database_url, settings)
assert "torch" not in sys.modules
print(stats.index.documents_indexed, stats.index.vectors_embedded)
"""


def test_a_worker_that_embeds_remotely_needs_no_torch(server, db_url, corpus, tmp_path):
    settings = _settings(tmp_path, db_url, corpus, backend="remote", endpoint=server.url)
    done = subprocess.run([sys.executable, "-c", NO_TORCH, str(settings.config_file)], capture_output=True, text=True,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    documents, embedded = map(int, done.stdout.split()[-2:])
    assert documents > 0 and embedded > 0
