"""Source discovery: walk a source folder, confine every path to its root, read sidecar metadata.

Sidecars:
- `<file>.meta.json` next to a file applies to that file;
- `_meta.json` in a folder applies to every file below it (a nearer folder wins key by key).
Keys: `acl_labels` (list or comma string), `title`, `password` (kept out of stored metadata), anything else.
The most specific `acl_labels` replaces the inherited ones: an explicit `[]` means "nobody", and such a
document is held back (default-deny), never indexed.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from rag_pipeline import ids
from rag_pipeline.config import SourceConfig, parse_labels

FILE_SIDECAR_SUFFIX = ".meta.json"
FOLDER_SIDECAR = "_meta.json"
# Keys a sidecar may set that must never be stored or shown.
SECRET_KEYS = frozenset({"password"})


class UnsafePathError(ValueError):
    """A path from a source resolves outside the source's root."""


def confine(root: Path, candidate: Path) -> Path:
    """Resolve `candidate` (following symlinks) and insist it stays inside `root`."""
    resolved_root = root.resolve()
    resolved = candidate.resolve()
    if resolved != resolved_root and not resolved.is_relative_to(resolved_root):
        raise UnsafePathError(f"{candidate} resolves outside the source root {resolved_root}")
    return resolved


def safe_join(root: Path, rel_path: str) -> Path:
    """Join a stored relative path back onto its root, refusing anything that escapes it."""
    pure = PurePosixPath(rel_path)
    if pure.is_absolute() or ".." in pure.parts or not rel_path:
        raise UnsafePathError(f"refusing relative path {rel_path!r}")
    return confine(root, root.joinpath(*pure.parts))


@dataclass(frozen=True)
class DiscoveredFile:
    source: str
    rel_path: str  # POSIX, relative to the source root
    doc_id: str
    size_bytes: int
    mtime_ns: int
    acl_labels: tuple[str, ...]
    title: str | None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def fingerprint(self) -> str:
        # Cheap by design: deciding to skip a file must not read it.
        return f"{self.size_bytes}:{self.mtime_ns}"


@dataclass
class ScanProblem:
    rel_path: str
    problem: str


def _read_sidecar(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"unreadable sidecar {path.name}: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"sidecar {path.name} must hold a JSON object")
    return data


def _matches(rel_path: str, patterns: tuple[str, ...]) -> bool:
    name = rel_path.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(rel_path, p) or fnmatch.fnmatch(name, p) for p in patterns)


def is_sidecar(name: str) -> bool:
    return name == FOLDER_SIDECAR or name.endswith(FILE_SIDECAR_SUFFIX)


def scan_source(source: SourceConfig, problems: list[ScanProblem] | None = None) -> Iterator[DiscoveredFile]:
    """Yield every matching regular file under the source root, in a stable order.

    Files that escape the root (symlinks), unreadable sidecars and non-regular files are reported
    into `problems` and skipped; nothing here reads document bytes.
    """
    root = source.root.resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"source {source.name!r}: root folder {root} does not exist")
    problems = problems if problems is not None else []
    folder_meta: dict[Path, dict[str, Any]] = {}

    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        current = Path(dirpath)
        dirnames.sort()
        # Folder metadata inherits from the parent folder; the nearer folder wins key by key.
        inherited = dict(folder_meta.get(current.parent, {})) if current != root else {}
        if FOLDER_SIDECAR in filenames:
            try:
                inherited.update(_read_sidecar(current / FOLDER_SIDECAR))
            except ValueError as exc:
                problems.append(ScanProblem(current.relative_to(root).as_posix() or ".", str(exc)))
        folder_meta[current] = inherited

        for name in sorted(filenames):
            if is_sidecar(name):
                continue
            path = current / name
            rel_path = path.relative_to(root).as_posix()
            if not _matches(rel_path, source.include):
                continue
            try:
                resolved = confine(root, path)
            except UnsafePathError as exc:
                problems.append(ScanProblem(rel_path, str(exc)))
                continue
            if not resolved.is_file():
                problems.append(ScanProblem(rel_path, "not a regular file"))
                continue
            meta = dict(inherited)
            sidecar = current / (name + FILE_SIDECAR_SUFFIX)
            if sidecar.exists():
                try:
                    meta.update(_read_sidecar(sidecar))
                except ValueError as exc:
                    problems.append(ScanProblem(rel_path, str(exc)))
                    continue
            stat = resolved.stat()
            labels = parse_labels(meta.pop("acl_labels")) if "acl_labels" in meta else source.acl_labels
            title = meta.pop("title", None)
            yield DiscoveredFile(
                source=source.name,
                rel_path=rel_path,
                doc_id=ids.doc_id(source.name, rel_path),
                size_bytes=stat.st_size,
                mtime_ns=stat.st_mtime_ns,
                acl_labels=labels,
                title=str(title) if title is not None else None,
                metadata={k: v for k, v in meta.items() if k not in SECRET_KEYS},
            )


def source_digest(source: SourceConfig) -> str:
    """A digest of everything a refresh would see in a source (paths, fingerprints, labels, titles, metadata),
    without reading any document: it changes exactly when a refresh would have work to do."""
    digest = hashlib.sha256()
    if not source.root.is_dir():
        return "root-missing"
    problems: list[ScanProblem] = []
    for found in scan_source(source, problems):
        digest.update(json.dumps(
            [found.rel_path, found.fingerprint, found.acl_labels, found.title, found.metadata],
            sort_keys=True, default=str,
        ).encode())
        digest.update(b"\n")
    for problem in problems:
        digest.update(f"problem:{problem.rel_path}:{problem.problem}\n".encode())
    return digest.hexdigest()


def document_password(source: SourceConfig, rel_path: str) -> str | None:
    """The password a file's sidecar supplies for an encrypted PDF, read only when parsing needs it."""
    path = safe_join(source.root, rel_path)
    sidecar = path.with_name(path.name + FILE_SIDECAR_SUFFIX)
    if not sidecar.exists():
        return None
    try:
        password = _read_sidecar(sidecar).get("password")
    except ValueError:
        return None
    return str(password) if password is not None else None
