"""The identity scheme: how every id in the index is minted, in one place.

- doc_id: a document is its source and its path relative to the source root, never its bytes, so an edited
  file keeps its identity and a moved file is a deletion plus a new document.
- chunk_id: the document, the chunker version, the chunk's position and the hash of its text; an unchanged
  chunk of a re-parsed document keeps its id, a chunker change mints new ones.
- group_id: a near-duplicate group is named after the chunk that opened it, its ACL label set and the LSH
  parameters, so a relabelled chunk opens a new group instead of relabelling one others still hold.
- embedding input: the sha256 of the exact text that goes into the model (prefix and chunk); the embedding
  cache is keyed by it and the model, so identical inputs are embedded once.
- version table: index version N lives in table `index_v<N>`.
- model: the vectors' maker is its weights and the backend that ran them (`torch:sha256:…`,
  `onnx-int8:sha256:…`, `remote:<served name>`), never a folder: the embedding cache and every index version are
  keyed by it, so int8 vectors never mix with float ones and two machines with the same weights in different
  folders agree.

Ids are hex digests truncated to 128 bits where they are keys (collisions are out of reach at any corpus
size); text hashes are full sha256.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode("utf-8")).hexdigest()


def doc_id(source: str, rel_path: str) -> str:
    return _digest(source, rel_path)[:32]


def text_hash(text: str) -> str:
    """sha256 of a text (a chunk's content_hash)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def chunk_id(doc: str, chunker_version: str, ordinal: int, content_hash: str) -> str:
    return hashlib.sha256(f"{doc}|{chunker_version}|{ordinal}|{content_hash}".encode()).hexdigest()[:32]


def group_id(first_chunk_id: str, labels_key: str, lsh_key: str) -> str:
    return hashlib.sha256(f"{first_chunk_id}|{labels_key}|{lsh_key}".encode()).hexdigest()[:32]


def embedding_input_sha(text: str) -> str:
    """Cache key of one embedding input: the exact text that goes into the model."""
    return text_hash(text)


def version_table(version_id: int) -> str:
    return f"index_v{int(version_id)}"


def weights_digest(files: list[tuple[str, str]]) -> str:
    """The weights of a model folder: `files` is (path relative to the folder, sha256 of the file) for every file
    that decides the vectors; order does not matter."""
    return "sha256:" + _digest(*(f"{name}={sha}" for name, sha in sorted(files)))[:32]


@dataclass(frozen=True)
class ModelIdentity:
    """An embedding model as the index knows it (made by rag_pipeline.embedding.identity)."""

    backend: str  # torch | onnx-int8 | remote
    name: str  # as configured, a hub or package name or a folder: where it loads from, not part of the identity
    weights: str  # weights_digest of its files; for remote, the name the endpoint serves it under

    @property
    def key(self) -> str:
        """What the embedding cache and the index versions are keyed by: backend and weights."""
        return f"{self.backend}:{self.weights}"

    @property
    def backend_model(self) -> str:
        """The name as the configuration and get_embedder take it: the backend's prefix, then the name."""
        return self.name if self.backend == "torch" else f"{self.backend}:{self.name}"
