"""Source discovery: walk a source folder, confine every path to its root, read sidecar metadata.

Sidecars:
- `<file>.meta.json` next to a file applies to that file;
- `_meta.json` in a folder applies to every file below it (a nearer folder wins key by key).
Keys: `acl_labels` (a list of strings), `title`, `password` (kept out of stored metadata), anything else.
The most specific `acl_labels` replaces the inherited ones: an explicit `[]` means "nobody", and such a
document is held back (default-deny), never indexed.

Everything here fails closed. A sidecar that cannot be read or validated holds every file it would speak for
(a folder's: the whole subtree) instead of letting them fall back to wider labels. A bad directory entry is
reported and skipped on its own, never stopping the scan. Special files are never opened. Folders and files
that cannot be read keep their documents as they were. A link inside the root speaks with its target's labels.

Files are read exactly as they were judged: the scan records the identity of what it judged (device, inode, link
count, and the path inside the root it was read through: a link's target). Reading (`open_judged`, sidecars
included) walks from the root one component at a time without following any link, and compares the open
descriptor with that identity, so a name swapped for a link or for another file after the scan is never read
under the labels the scan gave the old one.
"""

from __future__ import annotations

import errno
import fnmatch
import functools
import hashlib
import json
import os
import re
import stat
import time
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from rag_pipeline.config import SourceConfig, parse_labels
from rag_pipeline.domain import ids
from rag_pipeline.domain.status import D, DocumentStatus

FILE_SIDECAR_SUFFIX = ".meta.json"
FOLDER_SIDECAR = "_meta.json"
# The clock that stamps files moves in ticks, and a file server's may be a second behind this host's (the margin
# rag_pipeline.stages.discover.RACY_MARGIN gives an object store's clock).
LISTING_TRUST_MARGIN_NS = 2_000_000_000
# Keys a sidecar may set that must never be stored or shown.
SECRET_KEYS = frozenset({"password"})
MAX_SIDECAR_BYTES = 64 * 1024
MAX_SIDECAR_DEPTH = 16  # nesting of JSON values in a sidecar
ETAG_ID = "etag:"  # an object's file_id: its ETag


class UnsafePathError(ValueError):
    """A path from a source resolves outside the source's root."""


class SidecarError(ValueError):
    """A sidecar that cannot be read or validated: the files it applies to are held, never widened."""


class ChangedSinceScanError(OSError):
    """The file at a path is not the one the scan judged (a link now, another inode, other size, time or links)."""


def file_id(info: os.stat_result) -> str:
    return f"{info.st_dev}:{info.st_ino}"


def open_beneath(root: Path, rel_path: str) -> int:
    """A read-only descriptor of the regular file at `rel_path` under `root`, reached without following any link
    in any component (each folder opened with O_NOFOLLOW relative to the one before, like openat(2)). Raises
    ChangedSinceScanError for a link or a special file on the way; FileNotFoundError when it is gone."""
    pure = PurePosixPath(rel_path)
    if pure.is_absolute() or not pure.parts or ".." in pure.parts:
        raise UnsafePathError(f"refusing relative path {rel_path!r}")
    nofollow = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    folder = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        for part in pure.parts[:-1]:
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | nofollow, dir_fd=folder)
            except NotADirectoryError:  # a link (O_NOFOLLOW on a link to a folder) or a file
                raise ChangedSinceScanError(f"{part!r} on the way is a link or not a folder") from None
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise ChangedSinceScanError(f"{part!r} on the way is a link") from None
                raise
            os.close(folder)
            folder = child
        try:
            # O_NONBLOCK: a FIFO swapped in must not hang the open; it is refused below.
            fd = os.open(pure.parts[-1], os.O_RDONLY | os.O_NONBLOCK | nofollow, dir_fd=folder)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ChangedSinceScanError("the file is a link now") from None
            raise
    finally:
        os.close(folder)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ChangedSinceScanError("not a regular file")
    os.set_blocking(fd, True)
    return fd


def open_judged(root: Path, read_path: str, size: int, mtime_ns: int, judged_id: str | None,
                judged_links: int | None) -> int:
    """`open_beneath`, then the descriptor's device, inode, size, mtime_ns and link count compared with what the
    scan recorded; any difference raises ChangedSinceScanError (the document waits for the next scan)."""
    fd = open_beneath(root, read_path)
    info = os.fstat(fd)
    differences = [what for what, now, then in (
        ("file", file_id(info), judged_id), ("size", info.st_size, size),
        ("modification time", info.st_mtime_ns, mtime_ns), ("link count", info.st_nlink, judged_links),
    ) if now != then]  # an identity the scan did not record (a row of the release before) is a difference too
    if differences:
        os.close(fd)
        raise ChangedSinceScanError(f"{', '.join(differences)} changed since the scan")
    return fd


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


def printable(text: str) -> str:
    """A path as it can be shown and stored: bytes that are not UTF-8 (kept by Python as surrogates) escaped."""
    return os.fsencode(text).decode("utf-8", "backslashreplace")


def _is_valid_name(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # not UTF-8: neither a document id nor a database row can hold it
        return False
    return True


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
    # Held back (default-deny): the status that says why, and the reason. Nothing of it is indexed.
    held: tuple[DocumentStatus, str] | None = None
    # What the scan judged, so that parsing reads exactly that file (open_judged): device and inode, link count,
    # and for a link the path inside the root of its target (None: rel_path itself).
    # An object's file_id is `etag:<ETag>`: the version the listing saw, the only one a download accepts.
    file_id: str | None = None
    file_links: int | None = None
    read_path: str | None = None
    # A second judgment of an object the same scan yielded before (a sidecar listed after it): it replaces the first.
    rejudged: bool = False

    @property
    def fingerprint(self) -> str:
        # Cheap by design: deciding to skip a file must not read it. `size:mtime_ns`, then an object's ETag.
        base = f"{self.size_bytes}:{self.mtime_ns}"
        return f"{base}:{self.file_id.removeprefix(ETAG_ID)}" if self.file_id and self.file_id.startswith(
            ETAG_ID) else base


@dataclass
class ScanProblem:
    rel_path: str  # printable
    problem: str


@dataclass
class ScanReport:
    """What one scan could not see. Paths under `unreadable` (walk or stat errors, which may be transient) keep
    their documents as they were: a scan must not delete what it merely failed to read."""

    problems: list[ScanProblem] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)  # relative paths; a folder covers everything below it

    def problem(self, rel_path: str, problem: str, unreadable: bool = False) -> None:
        self.problems.append(ScanProblem(printable(rel_path), problem))
        if unreadable:
            self.unreadable.append(rel_path)


def read_sidecar(path: Path, root: Path) -> dict[str, Any]:
    """A sidecar's JSON object. Refused (SidecarError) unless it is a regular file inside the root, reached
    without following a link, of at most MAX_SIDECAR_BYTES, decodes as UTF-8 (a byte-order mark is fine) and holds an object whose strings
    have no NUL and whose `acl_labels` is a list of non-empty strings (a string is refused: is "hr, staff" two
    labels or one?)."""
    name = printable(path.name)
    try:
        rel_path = path.relative_to(root).as_posix()
    except ValueError:
        raise SidecarError(f"sidecar {name} is outside the source root") from None
    try:
        fd = open_beneath(root, rel_path)  # never through a link: a sidecar is read only as the file it is
    except ChangedSinceScanError:
        raise SidecarError(f"sidecar {name} is a link or not a regular file (a sidecar is read only as a regular "
                           "file)") from None
    except OSError as exc:  # gone, no permission, a link on the way
        raise SidecarError(f"sidecar {name} cannot be read: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "rb") as handle:
            raw = handle.read(MAX_SIDECAR_BYTES + 1)
    except OSError as exc:
        raise SidecarError(f"sidecar {name} cannot be read: {exc.strerror or exc}") from None
    return parse_sidecar(raw, name)


def _not_json(constant: str) -> Any:
    # Python reads NaN and Infinity, which JSON (and PostgreSQL's jsonb) does not have.
    raise json.JSONDecodeError(f"{constant} is not a JSON value", constant, 0)


def _unique_keys(pairs: list[tuple[str, Any]], name: str) -> dict[str, Any]:
    """One JSON object, refused if it names a key twice: json.loads would keep the last silently, so a second
    `acl_labels` would decide the labels whatever the first said."""
    data = dict(pairs)
    if len(data) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise SidecarError(f"sidecar {name}: key {json.dumps(twice)[:80]} appears more than once in one object")
    return data


def parse_sidecar(raw: bytes, name: str) -> dict[str, Any]:
    """A sidecar's bytes (at most MAX_SIDECAR_BYTES + 1 of them read) as its validated object; the rules of
    `read_sidecar`, for every kind of source."""
    if len(raw) > MAX_SIDECAR_BYTES:
        raise SidecarError(f"sidecar {name} is larger than {MAX_SIDECAR_BYTES} bytes")
    try:
        data = json.loads(raw.decode("utf-8-sig"), parse_constant=_not_json,
                          object_pairs_hook=lambda pairs: _unique_keys(pairs, name))
    except UnicodeDecodeError as exc:
        raise SidecarError(f"sidecar {name} is not UTF-8: {exc}") from None
    except (json.JSONDecodeError, RecursionError) as exc:
        raise SidecarError(f"sidecar {name} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise SidecarError(f"sidecar {name} must hold a JSON object")
    _refuse_unstorable(data, name, 0)
    _refuse_label_lookalikes(data, name)
    if "acl_labels" in data:
        data["acl_labels"] = _labels(data["acl_labels"], name)
    return data


def _refuse_unstorable(value: Any, name: str, depth: int) -> None:
    """Strings the database cannot hold (NUL, lone surrogates from JSON escapes) make the sidecar unreadable."""
    if depth > MAX_SIDECAR_DEPTH:
        raise SidecarError(f"sidecar {name} nests deeper than {MAX_SIDECAR_DEPTH} levels")
    if isinstance(value, str):
        if "\x00" in value:
            raise SidecarError(f"sidecar {name} holds a NUL character")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise SidecarError(f"sidecar {name} holds a string that is not valid Unicode") from None
    if isinstance(value, dict):
        for key, item in value.items():
            _refuse_unstorable(key, name, depth + 1)
            _refuse_unstorable(item, name, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _refuse_unstorable(item, name, depth + 1)


def _refuse_label_lookalikes(data: dict[str, Any], name: str) -> None:
    """A key that reads like `acl_labels` but is not it (`acl-labels`, `ACL_Labels`, `labels`, `acl_label`) would
    leave the file with wider inherited labels: refused, as the configuration refuses unknown keys."""
    for key in data:
        folded = re.sub(r"[^a-z]", "", str(key).lower())
        if key != "acl_labels" and ("acl" in folded or "label" in folded):
            raise SidecarError(f"sidecar {name}: key {key!r} is not 'acl_labels' (the only key for labels)")


def _labels(value: Any, name: str) -> tuple[str, ...]:
    """Labels normalised as callers' labels are (parse_labels); anything but a list of strings is refused."""
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise SidecarError(f"sidecar {name}: acl_labels must be a list of strings, not {json.dumps(value)[:80]}")
    if any(not item.strip() for item in value):
        raise SidecarError(f"sidecar {name}: acl_labels holds an empty label")
    return parse_labels(value)


def sidecar_present(path: Path) -> bool:
    """Whether a sidecar exists (a dangling link does). Not knowing is not "absent": an error other than "no such
    file" (EIO, ESTALE, EACCES) raises SidecarError, so the files it would speak for are held, never widened."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise SidecarError(f"sidecar {printable(path.name)} cannot be checked: {exc.strerror or exc}") from None
    return True


@functools.lru_cache(maxsize=64)
def _include_pattern(patterns: tuple[str, ...]) -> re.Pattern[str]:
    # One regular expression for all of a source's globs: a scan of 100,000 names calls it twice per name instead
    # of fnmatch twice per name and pattern.
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))


def matches_include(rel_path: str, patterns: tuple[str, ...]) -> bool:
    """Whether the path or its file name matches one of the source's `include` globs (fnmatch's rules)."""
    pattern = _include_pattern(tuple(patterns))
    return bool(pattern.match(rel_path) or pattern.match(rel_path.rsplit("/", 1)[-1]))


def is_sidecar(name: str) -> bool:
    return name == FOLDER_SIDECAR or name.endswith(FILE_SIDECAR_SUFFIX)


@dataclass
class _Folder:
    """What a folder's sidecars (its own and its parents') say for the files below it."""

    meta: dict[str, Any]
    held: str | None = None  # a sidecar on the way cannot be read: every file below is held


class _FolderMeta:
    """Folder sidecars from the root down, read once per folder, for the walk and for link targets alike."""

    def __init__(self, root: Path):
        self.root = root
        self._folders: dict[Path, _Folder] = {}

    def of(self, folder: Path) -> _Folder:
        # From the nearest folder already read down to this one, without recursion (folders can nest deep).
        chain = []
        while folder not in self._folders and folder != self.root and folder != folder.parent:
            chain.append(folder)
            folder = folder.parent
        if folder not in self._folders:
            self._folders[folder] = self._read(folder, _Folder({}))
        for child in reversed(chain):
            self._folders[child] = self._read(child, self._folders[child.parent])
        return self._folders[chain[0] if chain else folder]

    def _read(self, folder: Path, parent: _Folder) -> _Folder:
        entry = _Folder(dict(parent.meta), parent.held)
        sidecar = folder / FOLDER_SIDECAR
        if entry.held is None:
            try:
                if sidecar_present(sidecar):
                    entry.meta.update(read_sidecar(sidecar, self.root))
            except SidecarError as exc:
                entry.held = f"{printable(sidecar.relative_to(self.root).as_posix())}: {exc}"
        return entry


def scan_source(source: SourceConfig, report: ScanReport | None = None) -> Iterator[DiscoveredFile]:
    """Yield every matching regular file under the source root, in a stable order; nothing here reads a
    document's bytes.

    Each entry is judged on its own and a bad one never stops the scan: names that are not UTF-8, files that
    resolve outside the root, special files (never opened) are reported into `report` and skipped; folders and
    files that cannot be read are reported as unreadable (their documents are kept as they were). Files a sidecar
    cannot speak for are yielded held (`held_bad_sidecar`), as are files with several hard links
    (`held_hard_link`) unless the source allows them. A link inside the root takes the labels of its target's
    location (or is refused: `symlinks: refuse`).
    """
    root = source.root.resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"source {source.name!r}: root folder {root} does not exist")
    report = report if report is not None else ScanReport()
    folders = _FolderMeta(root)

    def walk_error(exc: OSError) -> None:
        where = Path(exc.filename).relative_to(root).as_posix() if exc.filename else "."
        report.problem(where, f"cannot be read: {exc.strerror or exc}; its documents are kept as they were",
                       unreadable=True)

    # Whether a file has a sidecar is taken from its folder's listing only for a file changed before the scan
    # started; a newer one's sidecar is looked for on the disk (a listing is no snapshot: it may show a new file
    # and miss the sidecar written just before it).
    listing_trusted_before_ns = time.time_ns() - LISTING_TRUST_MARGIN_NS
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False, onerror=walk_error):
        current = Path(dirpath)
        listed = {*filenames, *dirnames}  # a sidecar that is a folder (or a link to one) is there too: it holds
        # A file system that ignores case or Unicode normalisation (macOS, SMB shares) finds a sidecar under a name
        # the listing spells otherwise: such a near match is asked of the disk, as every sidecar was before.
        folded = {_folded(listed_name) for listed_name in listed}
        for name in [d for d in dirnames if not _is_valid_name(d)]:
            dirnames.remove(name)
            report.problem((current / name).relative_to(root).as_posix(), "folder name is not valid UTF-8; skipped")
        dirnames.sort()
        folder = folders.of(current)
        rel_folder = current.relative_to(root).as_posix()
        for name in sorted(filenames):
            if is_sidecar(name):
                continue
            path = current / name
            rel_path = name if rel_folder == "." else f"{rel_folder}/{name}"
            if not _is_valid_name(name):
                report.problem(rel_path, "file name is not valid UTF-8; skipped")
                continue
            if not matches_include(rel_path, source.include):
                continue
            found = _discover_file(source, root, folders, folder, path, rel_path, report,
                                   _listed(name + FILE_SIDECAR_SUFFIX, listed, folded), listing_trusted_before_ns)
            if found is not None:
                yield found


def _folded(name: str) -> str:
    return unicodedata.normalize("NFC", name).casefold()


def _listed(name: str, listed: set[str], folded: set[str]) -> bool | None:
    """Whether the listing holds `name`: True, False, or None where it holds a name equal but for case or Unicode
    normalisation (the disk decides)."""
    if name in listed:
        return True
    return None if _folded(name) in folded else False


def _discover_file(source: SourceConfig, root: Path, folders: _FolderMeta, folder: _Folder, path: Path,
                   rel_path: str, report: ScanReport, sidecar_listed: bool | None,
                   listing_trusted_before_ns: int) -> DiscoveredFile | None:
    linked = False
    try:
        info = os.lstat(path)
        linked = stat.S_ISLNK(info.st_mode)
        if linked:
            resolved = confine(root, path)
            info = resolved.stat()
        else:
            # The walk starts at the resolved root and never enters a linked folder, so a path that is not a link
            # is already resolved (resolving it again was most of a scan's time). A folder on the way swapped for
            # a link since the walk would make this judge a file elsewhere; nothing of it is read: open_judged
            # opens beneath the root, refusing links on the way, and checks the identity judged here.
            resolved = path
    except UnsafePathError:
        report.problem(rel_path, "resolves outside the source root")
        return None
    except (OSError, RuntimeError) as exc:
        report.problem(rel_path, f"cannot be read: {getattr(exc, 'strerror', None) or exc}; kept as it was",
                       unreadable=True)
        return None
    if not stat.S_ISREG(info.st_mode):
        report.problem(rel_path, "not a regular file")
        return None
    named = path
    if linked:
        if is_sidecar(resolved.name):  # a sidecar read as a document would publish its labels and password
            report.problem(rel_path, "a link to a sidecar; skipped")
            return None
        if source.symlinks == "refuse":
            report.problem(rel_path, "a symbolic link, and this source refuses links (symlinks: refuse)")
            return None
        # A link speaks with its target's labels: the folder sidecars above the target and the target's own.
        folder, named = folders.of(resolved.parent), resolved
    held: tuple[DocumentStatus, str] | None = (D.HELD_BAD_SIDECAR, folder.held) if folder.held else None
    meta = dict(folder.meta)
    sidecar = named.with_name(named.name + FILE_SIDECAR_SUFFIX)
    if held is None:
        try:
            # Beside a file that is not a link and was there before the scan, its folder's listing says whether
            # the sidecar is (a stat less per file); otherwise it is looked for.
            listing_says = sidecar_listed is not None and not linked and info.st_ctime_ns < listing_trusted_before_ns
            if sidecar_listed if listing_says else sidecar_present(sidecar):
                meta.update(read_sidecar(sidecar, root))
        except SidecarError as exc:
            held = (D.HELD_BAD_SIDECAR, str(exc))
    if held is None and info.st_nlink > 1 and not source.allow_hard_links:
        held = (D.HELD_HARD_LINK, f"{info.st_nlink} hard links: its other names may carry other labels")
    labels = tuple(meta.pop("acl_labels")) if "acl_labels" in meta else source.acl_labels
    title = meta.pop("title", None)
    return DiscoveredFile(
        source=source.name,
        rel_path=rel_path,
        doc_id=ids.doc_id(source.name, rel_path),
        size_bytes=info.st_size,
        mtime_ns=info.st_mtime_ns,
        acl_labels=() if held else labels,
        title=str(title) if title is not None and not held else None,
        metadata={} if held else {k: v for k, v in meta.items() if k not in SECRET_KEYS},
        held=held,
        file_id=file_id(info),
        file_links=info.st_nlink,
        read_path=resolved.relative_to(root).as_posix() if linked else None,
    )


def source_digest(source: SourceConfig) -> str:
    """A digest of everything a refresh would see in a source (paths, fingerprints, labels, titles, metadata,
    holds), without reading any document: it changes exactly when a refresh would have work to do."""
    digest = hashlib.sha256()
    if not source.root.is_dir():
        return "root-missing"
    report = ScanReport()
    for found in scan_source(source, report):
        digest.update(json.dumps(
            [found.rel_path, found.fingerprint, found.acl_labels, found.title, found.metadata, found.held],
            sort_keys=True, default=str,
        ).encode())
        digest.update(b"\n")
    for problem in report.problems:
        digest.update(f"problem:{problem.rel_path}:{problem.problem}\n".encode())
    return digest.hexdigest()


def document_password(source: SourceConfig, read_path: str) -> str | None:
    """The password a file's sidecar supplies for an encrypted PDF, read only when parsing needs it (the sidecar
    beside the file the scan judged: a link's target's)."""
    root = source.root.resolve()
    sidecar = root.joinpath(*PurePosixPath(read_path).parts)
    sidecar = sidecar.with_name(sidecar.name + FILE_SIDECAR_SUFFIX)
    if not os.path.lexists(sidecar):
        return None
    try:
        password = read_sidecar(sidecar, root).get("password")
    except SidecarError:
        return None
    return str(password) if password is not None else None
