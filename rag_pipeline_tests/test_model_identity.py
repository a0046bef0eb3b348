"""Model identity: the embedding cache and index versions name the weights and the backend, never a folder."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import pytest
from psycopg import sql

from rag_pipeline import store
from rag_pipeline.config import EmbeddingConfig
from rag_pipeline.domain import ids
from rag_pipeline.embedding import locations
from rag_pipeline.embedding.identity import (
    VersionModelError,
    adopt_model_identities,
    cache_key,
    configured_identity,
    identity_of,
    model_for_version,
)
from rag_pipeline.embedding.locations import resolve_model, weights_digest
from rag_pipeline.lifecycle.blue_green import start_version_build
from rag_pipeline.stages.chunk import ModelMismatchError
from rag_pipeline.stages.discover import discover
from rag_pipeline.stages.process import process_pending
from rag_pipeline.store.database import connect
from rag_pipeline_tests.conftest import database_before, port_note, upgrade_legacy

PACKAGED = Path(resolve_model("all-MiniLM-L6-v2").location)


@pytest.fixture(scope="module")
def copies(tmp_path_factory) -> dict[str, Path]:
    """The packaged MiniLM installed in two other folders, and a third copy whose configuration differs (as a
    fine-tuned checkpoint's would)."""
    root = tmp_path_factory.mktemp("models")
    folders = {name: root / name / "minilm" for name in ("a", "b", "changed")}
    for folder in folders.values():
        shutil.copytree(PACKAGED, folder)
    config = folders["changed"] / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "finetuned_from": "all-MiniLM-L6-v2"}))
    return folders


def test_the_same_weights_in_other_folders_are_one_model_and_other_weights_or_backends_are_not(copies):
    packaged = configured_identity(EmbeddingConfig(backend="torch"))
    a = configured_identity(EmbeddingConfig(model=str(copies["a"]), backend="torch"))
    b = configured_identity(EmbeddingConfig(model=str(copies["b"]), backend="torch"))
    assert a.key == b.key == packaged.key and packaged.key.startswith("torch:sha256:")
    assert str(copies["a"]) not in a.key and "minilm" not in a.key  # never a path or a folder name
    assert configured_identity(EmbeddingConfig(model=str(copies["changed"]), backend="torch")).key != packaged.key
    int8 = configured_identity(EmbeddingConfig(backend="onnx-int8"))
    assert int8.weights == packaged.weights and int8.key != packaged.key
    remote = configured_identity(EmbeddingConfig(backend="remote", endpoint="http://127.0.0.1:1/v1",
                                                 endpoint_model="BAAI/bge-small-en-v1.5"))
    assert remote.key == "remote:BAAI/bge-small-en-v1.5"
    # What does not change the vectors does not change the identity: a README, an export for another runtime.
    (copies["b"] / "README.md").write_text("installed by the platform team")
    (copies["b"] / "onnx").mkdir(exist_ok=True)
    (copies["b"] / "onnx" / "model.onnx").write_bytes(b"\0" * 64)
    assert weights_digest(copies["b"]) == weights_digest(copies["a"])


def test_a_files_digest_is_kept_between_processes_until_the_file_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cache = tmp_path / "cache" / "rag_pipeline" / "file-sha256"
    model = tmp_path / "model"
    model.mkdir()
    weights = model / "model.safetensors"
    weights.write_bytes(b"\1" * 4096)
    (model / "config.json").write_text("{}")

    def expected(weights_bytes: bytes) -> str:
        return ids.weights_digest([("config.json", hashlib.sha256(b"{}").hexdigest()),
                                   ("model.safetensors", hashlib.sha256(weights_bytes).hexdigest())])

    def in_a_new_process() -> str:
        locations._file_hashes.clear()
        return weights_digest(model)

    first = weights_digest(model)
    assert first == expected(b"\1" * 4096)
    entries = sorted(cache.iterdir())
    assert len(entries) == 2 and {e.read_text() for e in entries} == {
        hashlib.sha256(b"\1" * 4096).hexdigest(), hashlib.sha256(b"{}").hexdigest()}
    assert cache.stat().st_mode & 0o077 == 0  # the user's own
    # A later process reads the stored digests instead of hashing the files: a planted one shows it was read.
    for entry in entries:
        entry.write_text("0" * 64)
    assert in_a_new_process() != first
    for entry in entries:
        entry.unlink()
    assert in_a_new_process() == first  # stored again, truly
    assert len(list(cache.iterdir())) == 2
    # The file rewritten with its old size and modification time is hashed again (its change time moved), though
    # the digest of its previous version is still stored.
    before = weights.stat()
    time.sleep(0.01)
    weights.write_bytes(b"\2" * 4096)
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert weights.stat().st_mtime_ns == before.st_mtime_ns and weights.stat().st_size == before.st_size
    assert in_a_new_process() == expected(b"\2" * 4096)
    assert len(list(cache.iterdir())) == 3
    # A damaged entry is hashed again, never trusted.
    for entry in cache.iterdir():
        entry.write_text("not a digest")
    assert in_a_new_process() == expected(b"\2" * 4096)
    # A cache that cannot be written, a relative XDG_CACHE_HOME (ignored, as the XDG spec says) and no home at all
    # cost the hashing only.
    monkeypatch.setenv("XDG_CACHE_HOME", str(weights))  # a file: nothing can be created under it
    assert in_a_new_process() == expected(b"\2" * 4096)
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert in_a_new_process() == expected(b"\2" * 4096)
    assert not (tmp_path / "relative").exists() and (tmp_path / "home" / ".cache" / "rag_pipeline").is_dir()
    assert not any(p.name.startswith(".partial-") for p in cache.iterdir())


def test_a_worker_with_the_weights_elsewhere_refreshes_the_same_version(make_settings, db, db_url, tmp_path, copies):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for index in range(3):
        (corpus / f"note-{index}.md").write_text(port_note(index))
    sources = [{"name": "port", "root": str(corpus), "acl_labels": ["staff"]}]

    def refresh(model: Path, **embedding):
        settings = make_settings(sources=sources, execution={"isolation": False},
                                 embedding={"model": str(model), "models_dir": str(tmp_path / "models"),
                                            "backend": "torch", **embedding})
        discover(db_url, settings.sources)
        return settings, process_pending(db_url, settings)

    _, first = refresh(copies["a"])
    assert first.index.vectors_embedded > 0
    (active,) = store.versions.index_versions(db)
    key = configured_identity(EmbeddingConfig(backend="torch")).key
    assert active.model_identity == key and active.model_revision == key.removeprefix("torch:")
    # Another machine: the same weights in another folder. Same version, and the unchanged sections' vectors of an
    # edited note come from the cache the first machine filled.
    (corpus / "note-0.md").write_text(port_note(0) + "\n## Added later\n\nOne more paragraph about the harbour.\n")
    settings, second = refresh(copies["b"])
    assert second.index.documents_indexed == 1 and second.index.vectors_reused > 0
    assert [v.version_id for v in store.versions.index_versions(db)] == [active.version_id]
    assert db.execute("SELECT DISTINCT model FROM embedding_cache").fetchall() == [(key,)]
    assert model_for_version(active, settings.embedding) == str(copies["b"])
    # A process configured for another model (here: the changed copy) finds the version's weights under the
    # folder name the version was built from, in its own models folder, after the first machine's folder is gone.
    shutil.rmtree(copies["a"])
    elsewhere = EmbeddingConfig(model=str(copies["changed"]), models_dir=copies["b"].parent)
    assert model_for_version(active, elsewhere) == str(copies["b"].parent / "minilm")
    # Other weights under the same folder name are another model: refused, pointing at a blue/green build.
    (corpus / "note-4.md").write_text(port_note(4))
    with pytest.raises(ModelMismatchError, match="new index version"):
        refresh(copies["changed"])
    with pytest.raises(VersionModelError, match="no model here has those weights"):
        model_for_version(active, EmbeddingConfig(model=str(copies["changed"]), models_dir=tmp_path / "none"))


def test_auto_keeps_an_existing_indexs_backend_and_starts_a_new_index_on_int8(make_settings, db, db_url, tmp_path):
    auto = EmbeddingConfig()
    assert auto.backend == "auto"
    assert auto.for_index(None).backend == "onnx-int8"
    assert auto.for_index("all-MiniLM-L6-v2").backend == "torch"
    assert auto.for_index("onnx-int8:all-MiniLM-L6-v2").backend == "onnx-int8"
    assert auto.for_index("remote:all-MiniLM-L6-v2").backend == "onnx-int8"  # an endpoint must be named
    assert EmbeddingConfig(device="cuda").for_index(None).backend == "torch"  # int8 ONNX is the CPU's default
    assert EmbeddingConfig(backend="torch").for_index("onnx-int8:all-MiniLM-L6-v2").backend == "torch"

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for index in range(2):
        (corpus / f"note-{index}.md").write_text(port_note(index))
    sources = [{"name": "port", "root": str(corpus), "acl_labels": ["staff"]}]

    def refresh(**embedding):
        settings = make_settings(sources=sources, execution={"isolation": False}, embedding=embedding)
        discover(db_url, settings.sources)
        return settings, process_pending(db_url, settings)

    # A data folder from before `auto`: its index was embedded by torch. The upgrade (auto) refreshes the same
    # version with the same vectors: no silent swap to int8.
    refresh(backend="torch")
    (active,) = store.versions.index_versions(db)
    torch_key = configured_identity(EmbeddingConfig(backend="torch")).key
    assert active.model_identity == torch_key
    (corpus / "note-2.md").write_text(port_note(2))
    settings, upgraded = refresh()
    assert settings.embedding.backend == "auto" and upgraded.index.documents_indexed == 1
    assert [v.version_id for v in store.versions.index_versions(db)] == [active.version_id]
    assert db.execute("SELECT DISTINCT model FROM embedding_cache").fetchall() == [(torch_key,)]
    assert model_for_version(active, settings.embedding) == "all-MiniLM-L6-v2"
    # A new version of it follows it too; asking for int8 by name is a model change, refused for a refresh.
    assert start_version_build(db_url, settings, settings.embedding.model).model_identity == torch_key
    (corpus / "note-3.md").write_text(port_note(3))
    with pytest.raises(ModelMismatchError, match="onnx-int8"):
        refresh(backend="onnx-int8")


def test_versions_and_cache_rows_from_before_model_identities_are_adopted(pg_admin_url, tmp_path):
    """A database at legacy migration 017: its versions name a model and an install path, its cache rows the
    model's configured name. After 018 and adoption they are keyed by the weights; a version whose weights are on
    no machine here keeps no identity and says how to get one."""
    with database_before(pg_admin_url, tmp_path, "018") as url:
        with connect(url, autocommit=True) as conn:
            for version_id, model, path in ((1, "all-MiniLM-L6-v2", str(PACKAGED)),
                                            (2, "gone-model", "/nowhere/gone-model")):
                conn.execute("""INSERT INTO index_versions (version_id, table_name, embedding_model, model_revision,
                                    dimensions, chunker_version, parser_version, status)
                                OVERRIDING SYSTEM VALUE VALUES (%s, %s, %s, %s, 384, 'c', 'p', %s)""",
                             (version_id, f"index_v{version_id}", model, path, "active" if version_id == 1 else "retired"))
                conn.execute(sql.SQL("INSERT INTO embedding_cache (model, input_sha, embedding) VALUES (%s, %s, {})")
                             .format(sql.Literal("[" + ",".join(["0.5"] * 384) + "]") + sql.SQL("::halfvec")),
                             (model, f"sha-{version_id}"))
        assert upgrade_legacy(url)[0] == "018_model_identity.sql"
        with connect(url) as conn:
            adopted = adopt_model_identities(conn, EmbeddingConfig())
            assert len(adopted) == 1 and adopted[0].startswith("v1: all-MiniLM-L6-v2 -> torch:sha256:")
            assert adopt_model_identities(conn, EmbeddingConfig()) == []  # once only; v2 stays as it was
            first, second = sorted(store.versions.index_versions(conn), key=lambda v: v.version_id)
            key = configured_identity(EmbeddingConfig().for_index(first.embedding_model)).key  # auto follows it
            assert (first.embedding_model, first.model_identity) == ("all-MiniLM-L6-v2", key)
            assert first.model_revision == key.removeprefix("torch:")  # the weights, no longer a path
            assert cache_key(first) == key and second.model_identity is None
            cache = dict(conn.execute("SELECT input_sha, model FROM embedding_cache").fetchall())
            assert cache == {"sha-1": key, "sha-2": "gone-model"}  # the unknown model's rows wait for their weights
            with pytest.raises(VersionModelError, match="no model identity yet"):
                cache_key(second)


def test_the_identity_is_minted_in_one_place():
    model = ids.ModelIdentity("onnx-int8", "all-MiniLM-L6-v2", ids.weights_digest([("b", "2"), ("a", "1")]))
    assert model.weights == ids.weights_digest([("a", "1"), ("b", "2")])  # order of the walk does not matter
    assert model.key == f"onnx-int8:{model.weights}" and model.backend_model == "onnx-int8:all-MiniLM-L6-v2"
    assert identity_of("onnx-int8:all-MiniLM-L6-v2", EmbeddingConfig()).key == f"onnx-int8:{configured_identity(EmbeddingConfig()).weights}"


QUERIES = ("What was AMD's free cash flow in FY2015?", "travel policy", "x", "Ünïcödé 東京 résumé — $1,234.56 (in millions)",
           "Answer as an equity research analyst, in USD millions. " * 40)  # past max_seq_length: truncated alike


def test_the_numpy_encoder_gives_the_torch_models_vectors_for_queries_and_documents(monkeypatch):
    import numpy as np

    from rag_pipeline.embedding import embedders
    from rag_pipeline.embedding.light import BertEncoder, load_bert_encoder

    full = embedders.get_embedder("all-MiniLM-L6-v2")
    light = load_bert_encoder(resolve_model("all-MiniLM-L6-v2").location)
    assert isinstance(light, BertEncoder) and light.dimensions == full.dimensions
    for query in QUERIES:
        np.testing.assert_allclose(light.embed_query(query), full.embed_query(query), atol=2e-6)
    np.testing.assert_allclose(light.embed_documents(list(QUERIES)), full.embed_documents(list(QUERIES)), atol=2e-6)
    # A model it does not reproduce (MPNet: relative position buckets) is left to the full model.
    mpnet = Path(resolve_model("all-mpnet-base-v2").location)
    assert (mpnet / "modules.json").exists() and load_bert_encoder(str(mpnet)) is None

    monkeypatch.setattr(embedders, "_embedders", {})  # nothing loaded in this process
    monkeypatch.setattr(embedders, "_light_first", {})
    loads = []
    real_embedder = embedders.Embedder
    monkeypatch.setattr(embedders, "Embedder", lambda *args, **kwargs: loads.append(1) or real_embedder(*args, **kwargs))
    clock = iter(range(1000))  # each encoding "takes" one second by this clock
    monkeypatch.setattr(embedders, "perf_counter", lambda: float(next(clock)))
    monkeypatch.setattr(embedders, "LIGHT_SECONDS", 3.0)
    light_first = embedders.get_query_embedder("all-MiniLM-L6-v2")
    assert light_first is embedders.get_light_first_embedder("all-MiniLM-L6-v2")  # one per model per process
    np.testing.assert_allclose(light_first.embed_query(QUERIES[0]), full.embed_query(QUERIES[0]), atol=2e-6)
    assert loads == []  # one second of numpy so far
    # Two more texts fit the budget; past it the full model is loaded, once, and embeds the rest in one call.
    mixed = light_first.embed_documents(list(QUERIES[:4]))
    assert loads == [1]
    np.testing.assert_allclose(mixed, full.embed_documents(list(QUERIES[:4])), atol=2e-6)
    light_first.embed_query(QUERIES[1])
    assert loads == [1]
    # A service asks for the full model at once; a process that has it loaded rents nothing.
    assert isinstance(embedders.get_query_embedder("all-MiniLM-L6-v2", light=False), real_embedder) and loads == [1]


def test_the_numpy_encoder_refuses_a_folder_it_would_not_reproduce(tmp_path):
    """A folder whose vectors it cannot give exactly loads the full model instead (load_bert_encoder returns None)."""
    from rag_pipeline.embedding.light import load_bert_encoder

    source = Path(resolve_model("all-MiniLM-L6-v2").location)

    def variant(name: str, file: str, edit) -> str:
        folder = tmp_path / name
        shutil.copytree(source, folder, ignore=shutil.ignore_patterns("model.safetensors"))
        (folder / "model.safetensors").symlink_to(source / "model.safetensors")
        path = folder / file
        path.write_text(json.dumps(edit(json.loads(path.read_text()))))
        return str(folder)

    assert load_bert_encoder(variant("same", "config.json", lambda c: c)) is not None
    assert load_bert_encoder(variant("prompted", "config_sentence_transformers.json",
                                     lambda c: {**c, "prompts": {"query": "q: "}, "default_prompt_name": "query"})) is None
    assert load_bert_encoder(variant("lowercased", "sentence_bert_config.json",
                                     lambda c: {**c, "do_lower_case": True})) is None
    assert load_bert_encoder(variant("kwargs", "sentence_bert_config.json",
                                     lambda c: {**c, "model_args": {"torch_dtype": "float16"}})) is None
    assert load_bert_encoder(variant("relative", "config.json",
                                     lambda c: {**c, "position_embedding_type": "relative_key"})) is None
    assert load_bert_encoder(variant("max-pooled", "1_Pooling/config.json",
                                     lambda c: {**c, "pooling_mode_mean_tokens": False,
                                                "pooling_mode_max_tokens": True})) is None
    broken = variant("broken", "config.json", lambda c: c)
    (Path(broken) / "modules.json").write_text("{not json")
    assert load_bert_encoder(broken) is None  # unreadable: the full model reads it, or says why
