"""The ONNX Runtime int8 backend: exported once from the packaged MiniLM (file named by its weights), close to
torch's vectors, its own model identity, and an index built with it is searchable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from dagster import DagsterInstance

from rag_pipeline import store
from rag_pipeline.config import EmbeddingConfig, load_settings
from rag_pipeline.defs.runs import run_ingest
from rag_pipeline.embedding.bert_graph import bert_graph
from rag_pipeline.embedding.embedders import get_embedder
from rag_pipeline.embedding.identity import configured_identity
from rag_pipeline.embedding.light import BertEncoder, load_bert_encoder, read_bert_folder
from rag_pipeline.embedding.locations import resolve_model
from rag_pipeline.embedding.onnx import (
    OnnxEmbedder,
    _fast_tokenizer,
    _transformers_tokenizer,
    quantized_model_path,
)
from rag_pipeline.retrieval.search import SearchOptions, search
from rag_pipeline.workers.threads import torch_threads, usable_cores
from rag_pipeline_tests.conftest import MODELS_DIR

TEXTS = [
    "The warehouse robot charges at dock seven after every shift.",
    "Travel expenses above 500 euros need a manager's approval.",
    "Quarterly revenue rose by twelve percent on higher service margins.",
    "Ein Satz auf Deutsch über Sicherheitsregeln im Lager.",
    "Picking stations must be cleared before the welding arm starts. " * 30,
]


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


def test_int8_vectors_stay_close_to_torchs_and_the_export_is_reused(models_dir):
    model = resolve_model("all-MiniLM-L6-v2")
    onnx = OnnxEmbedder("onnx-int8:all-MiniLM-L6-v2", model, models_dir)
    path = quantized_model_path(model, models_dir)
    assert path.exists() and path.parent == models_dir / "onnx"
    exported_at = path.stat().st_mtime_ns
    theirs, ours = onnx.embed_documents(TEXTS), get_embedder("all-MiniLM-L6-v2").embed_documents(TEXTS)
    assert theirs.shape == ours.shape == (len(TEXTS), 384)
    cosines = np.sum(theirs * ours, axis=1)
    assert cosines.min() > 0.97 and cosines.mean() > 0.985, cosines
    assert np.allclose(np.linalg.norm(theirs, axis=1), 1, atol=1e-5)
    OnnxEmbedder("onnx-int8:all-MiniLM-L6-v2", model, models_dir)  # a second process would find the file
    assert path.stat().st_mtime_ns == exported_at


def test_an_index_built_with_int8_weights_is_its_own_version(models_dir, db, db_url, corpus, tmp_path):
    config = tmp_path / "rag.yaml"
    config.write_text(yaml.safe_dump({
        "database_url": db_url, "data_dir": str(tmp_path / "data"),
        "sources": [{"name": "sample", "root": str(corpus), "acl_labels": ["staff"]}],
        "embedding": {"models_dir": str(models_dir)},
    }))
    settings = load_settings(config)
    # The default: a new index embeds with int8 (an existing one keeps its backend: test_model_identity).
    assert settings.embedding.backend == "auto" and settings.embedding.for_index(None).backend == "onnx-int8"
    with DagsterInstance.ephemeral() as instance:
        summary = run_ingest(settings, instance=instance)
    assert summary["success"], summary.get("errors")
    active = store.versions.active_version(db)
    int8 = configured_identity(settings.embedding.for_index(None))
    torch = configured_identity(EmbeddingConfig(backend="torch"))
    # The same weights on another backend: the same digest, another key; the cache holds only the int8 vectors.
    assert int8.weights == torch.weights and int8.key == f"onnx-int8:{torch.weights}" != torch.key
    assert (active.embedding_model, active.model_revision, active.model_identity) == (
        "onnx-int8:all-MiniLM-L6-v2", int8.weights, int8.key)
    assert db.execute("SELECT DISTINCT model FROM embedding_cache").fetchall() == [(int8.key,)]
    hits = search(db, "how long does the robot battery last", ["staff"], k=3,
                  options=SearchOptions.from_settings(settings))
    assert hits and "battery" in " ".join(h.text.lower() for h in hits)
    assert EmbeddingConfig(backend="torch").backend_model == "all-MiniLM-L6-v2"  # torch keeps the plain name


def test_the_tokenizers_library_tokenizes_as_transformers_does():
    """The int8 backend reads tokenizer.json with `tokenizers` alone (a search imports no transformers): the same
    ids, masks and types as transformers' tokenizer, padded and truncated to the model's window."""
    model = resolve_model("all-MiniLM-L6-v2")
    texts = [*TEXTS, "", "Ünïcödé café — naïve 北京 🙂\ttab", "Revenue (in $ millions) 1,234.5 (12.3)%", "x " * 600]
    fast = _fast_tokenizer(Path(model.location), 256)(texts)
    slow = _transformers_tokenizer(model.location, 256)(texts)
    assert set(fast) == set(slow) and fast["input_ids"].shape == (len(texts), 256)
    for name in fast:
        assert np.array_equal(fast[name], slow[name]), name


def test_texts_run_one_at_a_time_on_the_cores_the_run_leaves_and_keep_their_vectors(models_dir):
    """While parse workers run, the run's embedder may use only the cores they leave (torch_threads). Each text runs
    alone, so its vector is the same whatever it is embedded with, bounded or not."""
    onnx = get_embedder("onnx-int8:all-MiniLM-L6-v2", EmbeddingConfig(models_dir=models_dir))
    assert onnx.parallel_runs() == usable_cores()
    together = onnx.embed_documents(TEXTS)
    with torch_threads(1):
        assert onnx.parallel_runs() == 1
        bounded = onnx.embed_documents(TEXTS)
    alone = np.stack([onnx.embed_documents([text])[0] for text in TEXTS])
    assert np.array_equal(together, bounded) and np.array_equal(together, alone)
    assert np.array_equal(onnx.embed_query(TEXTS[1]), together[1])  # the model has no query prompt


def test_the_bert_graph_computes_what_the_numpy_encoder_does_padded_or_not():
    """The ONNX graph written from the weights (no torch) is the same arithmetic as rag_pipeline.embedding.light:
    per text, and with a shorter text padded in a batch (its padding masked out)."""
    import onnxruntime

    folder = Path(resolve_model("all-MiniLM-L6-v2").location)
    bert = read_bert_folder(folder)
    session = onnxruntime.InferenceSession(bert_graph(bert).SerializeToString(), providers=["CPUExecutionProvider"])
    reference = BertEncoder(bert).embed_documents(TEXTS)
    tokenize = _fast_tokenizer(folder, bert.max_seq_length)
    batch = tokenize(TEXTS)  # padded to the longest
    hidden = session.run(["last_hidden_state"], batch)[0]
    mask = batch["attention_mask"][..., None].astype(np.float32)
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
    assert np.abs(pooled - reference).max() < 1e-5
    assert batch["attention_mask"].min() == 0  # the batch did pad some text


# Run in a child process where `import torch` (and transformers) fails, as in an install without the torch extra.
_WITHOUT_TORCH = """
import sys
sys.modules["torch"] = sys.modules["transformers"] = sys.modules["sentence_transformers"] = None
from pathlib import Path
from rag_pipeline.embedding.locations import ModelUnavailableError, resolve_model
from rag_pipeline.embedding.onnx import OnnxEmbedder
models_dir = Path(sys.argv[1])
model = OnnxEmbedder("onnx-int8:all-MiniLM-L6-v2", resolve_model("all-MiniLM-L6-v2"), models_dir)
import numpy as np
np.save(models_dir / "vectors.npy", model.embed_documents(sys.argv[3:]))
try:
    OnnxEmbedder("onnx-int8:x", resolve_model(sys.argv[2]), models_dir)
except ModelUnavailableError as exc:
    print(exc)
"""


def test_the_default_model_exports_and_embeds_without_torch_and_another_says_it_needs_it(tmp_path):
    """No torch in the process: all-MiniLM-L6-v2 is exported from its weights and embeds within int8's distance of
    the float model; a model that is not a plain BERT encoder (all-mpnet-base-v2) names the torch extra."""
    mpnet = MODELS_DIR / "all-mpnet-base-v2"
    assert (mpnet / "modules.json").is_file(), "make install puts all-mpnet-base-v2 in .models"
    done = subprocess.run([sys.executable, "-c", _WITHOUT_TORCH, str(tmp_path), str(mpnet), *TEXTS],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert list((tmp_path / "onnx").glob("*-int8.onnx")), "no int8 model was written"
    vectors = np.load(tmp_path / "vectors.npy")
    reference = load_bert_encoder(resolve_model("all-MiniLM-L6-v2").location).embed_documents(TEXTS)
    cosines = np.sum(vectors * reference, axis=1)
    assert cosines.min() > 0.97 and cosines.mean() > 0.985, cosines
    assert "not a plain BERT encoder" in done.stdout and "dagster-rag-pipeline[torch]" in done.stdout, done.stdout
    assert "WARNING" not in done.stderr  # the quantiser's advice is not printed
