"""What an embedding model's vectors are called: the weights and the backend that ran them, never a folder.

The embedding cache and every index version are keyed by it (rag_pipeline.domain.ids.ModelIdentity.key), so

- int8 vectors (onnx-int8) never mix with float ones (torch), nor a retrained checkpoint's with the old one's:
  another key is another version, built beside the active one (blue/green);
- two machines with the same weights installed in different folders agree, and share cache rows and versions.

The weights are the sha256 of every file in the model's folder that decides its vectors (weights, configuration,
tokenizer; not its README or exports for other runtimes). A remote endpoint's weights cannot be read from here:
it is named by the model name it serves (`embedding.endpoint_model`), which must therefore name the weights.
"""

from __future__ import annotations

import logging
from pathlib import Path

import psycopg

from rag_pipeline import store
from rag_pipeline.config import EmbeddingConfig, split_backend
from rag_pipeline.domain.ids import ModelIdentity
from rag_pipeline.embedding.locations import (
    ModelUnavailableError,
    ResolvedModel,
    resolve_model,
    served_model_name,
    weights_digest,
)
from rag_pipeline.store.versions import IndexVersion

log = logging.getLogger(__name__)

def _local_folder(model: ResolvedModel, download: bool) -> Path:
    """The folder a model loads from: its own, or its Hugging Face hub snapshot (fetched only when `download`)."""
    if model.is_local:
        return Path(model.location)
    from huggingface_hub import snapshot_download

    names = [model.location] + ([] if "/" in model.location else [f"sentence-transformers/{model.location}"])
    errors = []
    # What is in the cache first (no network on every search); fetched only when allowed and missing.
    for local_only in (True, False) if download else (True,):
        for repo in names:
            try:
                return Path(snapshot_download(repo, local_files_only=local_only))
            except Exception as exc:  # the hub library raises many kinds: offline, not found, bad name
                errors.append(f"{repo}: {type(exc).__name__}")
    raise ModelUnavailableError(
        f"embedding model {model.name!r} is not a local folder, a packaged or installed model"
        + ("" if download else ", or in the Hugging Face cache") + f" ({'; '.join(errors)}); set embedding.model to "
        "a folder holding it")


def identity_of(backend_model: str, config: EmbeddingConfig, *, download: bool = True) -> ModelIdentity:
    """The identity of a backend-qualified model name (`onnx-int8:all-MiniLM-L6-v2`) as it resolves here. A
    remote name is served by the configured endpoint under embedding.endpoint_model (default: the name)."""
    backend, name = split_backend(backend_model)
    if backend == "remote":
        return ModelIdentity("remote", name, served_model_name(backend_model, config))
    folder = _local_folder(resolve_model(name, config.models_dir), download)
    return ModelIdentity(backend, name, weights_digest(folder))


def for_database(conn: psycopg.Connection, config: EmbeddingConfig) -> EmbeddingConfig:
    """`config` with `embedding.backend: auto` made concrete for the database's index: its active version's
    backend, or the new-index default when there is none (EmbeddingConfig.for_index)."""
    if config.backend != "auto":
        return config
    active = store.versions.active_version(conn)
    return config.for_index(active.embedding_model if active else None)


def configured_identity(config: EmbeddingConfig) -> ModelIdentity:
    """The identity of the configured model on its configured backend (made concrete: for_database)."""
    return identity_of(config.backend_model, config)


class VersionModelError(ModelUnavailableError):
    """No model on this machine gives an index version's vectors."""


def version_settings(version: IndexVersion) -> dict[str, str]:
    """The embedding settings under which a refresh embeds with `version`'s model (what to set after a swap)."""
    backend, name = split_backend(version.embedding_model)
    return {"embedding.model": name, "embedding.backend": backend}


def cache_key(version: IndexVersion) -> str:
    """The key of `version`'s vectors in the embedding cache."""
    if version.model_identity is None:  # from before model identities, and no machine has identified its weights
        raise VersionModelError(
            f"index version {version.label} ({version.embedding_model}) has no model identity yet: its weights were "
            "not found where it was built. Run the pipeline once where embedding.model points at them (the "
            "identity is recorded then), or build a new version (`rag-pipeline index build`)")
    return version.model_identity


def model_for_version(version: IndexVersion, config: EmbeddingConfig) -> str:
    """The model (as get_embedder takes it) that gives `version`'s vectors on this machine: the configured one when
    its weights are the version's, else the version's own name if it resolves here to those weights. Never a model
    with other weights: its vectors would not be comparable with the version's."""
    key, backend_model = cache_key(version), version.embedding_model
    backend, name = split_backend(backend_model)
    config = config.for_index(backend_model)
    # The version's name may be a folder of the machine that built it: the same folder name under this machine's
    # models folder is tried too.
    moved = ModelIdentity(backend, str(Path(config.models_dir) / Path(name).name), "").backend_model
    tried: list[str] = []
    for candidate in (config.backend_model, backend_model, moved):
        if candidate in tried:
            continue
        tried.append(candidate)
        try:
            if identity_of(candidate, config, download=candidate == config.backend_model).key == key:
                return candidate
        except ModelUnavailableError:
            continue
    raise VersionModelError(
        f"index version {version.label} was embedded by {backend_model} ({key}); no model here has those weights (tried "
        f"{', '.join(tried)}): set embedding.model and embedding.backend to a copy of them")


def _legacy_identity(version: IndexVersion, config: EmbeddingConfig) -> ModelIdentity | None:
    """The identity of a version recorded before model identities, from the folder it was loaded from then
    (model_revision held it) or its name as it resolves here; None when its weights are not on this machine."""
    backend, name = split_backend(version.embedding_model)
    if backend == "remote":
        return identity_of(version.embedding_model, config)
    folders = [Path(version.model_revision)] if version.model_revision else []
    try:
        folders.append(_local_folder(resolve_model(name, config.models_dir), download=False))
    except ModelUnavailableError:
        pass  # the recorded folder may still be there
    for folder in folders:
        if folder.is_dir() and (folder / "config.json").exists():
            return ModelIdentity(backend, name, weights_digest(folder))
    return None


def adopt_model_identities(conn: psycopg.Connection, config: EmbeddingConfig) -> list[str]:
    """Record the identity of every version from before model identities whose weights are on this machine, and
    move its embedding-cache rows (keyed by its configured name until now) to that identity: one transaction per
    version. Versions whose weights are not here are left for a machine that has them. Returns what changed."""
    adopted = []
    for version in store.versions.versions_without_identity(conn):
        conn.commit()  # the folder is hashed outside any transaction
        identity = _legacy_identity(version, config)
        if identity is None:
            log.warning("index version %s (%s): its weights are not on this machine; its model identity is recorded "
                        "by the next run that has them", version.label, version.embedding_model)
            continue
        with conn.transaction():
            store.versions.lock_registry(conn)
            if not store.versions.record_identity(conn, version.version_id, identity):
                continue  # another process recorded it (and moved the cache rows) first
            moved = store.chunks.rekey_embedding_cache(conn, version.embedding_model, identity.key)
        adopted.append(f"{version.label}: {version.embedding_model} -> {identity.key} ({moved} cached vectors)")
        log.info("index version %s", adopted[-1])
    return adopted
