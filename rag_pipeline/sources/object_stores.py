"""Object-store sources: a prefix of an S3 (or S3-compatible), GCS or Azure Blob bucket, read through obstore.

obstore is one client for the three store families (the Rust object_store crate Apache Arrow keeps), with streamed
paginated listings, conditional reads (If-Match) and bounded retries; the fsspec family (s3fs, gcsfs, adlfs) is
three libraries with three async stacks. See docs/sources.md for the measurement.

A scan lists the prefix once, streamed, page by page, and judges objects as they come (see scan_objects): what is
kept in memory is the sidecars and the prefixes seen, so memory stays flat however many objects the listing holds;
objects go to a spool file on disk in case a late sidecar needs them judged again. Each object is judged as a
folder's file is
(rag_pipeline.sources.folders): sidecars (`<key>.meta.json`, `_meta.json` under a prefix) give labels, titles and
passwords under the same fail-closed rules, or the object's own user metadata gives its labels
(`labels_from: metadata`). Nothing of a document's bytes is read by a scan.

An object's identity is its ETag (`file_id = etag:<ETag>`); the fingerprint adds size and last-modified. A refresh
downloads only objects whose fingerprint changed, and a download asks for exactly the ETag the listing saw
(If-Match): a newer write fails the precondition and waits for the next scan, so the version judged is the version
read. Keys are untrusted: a key with '..', '.', empty or control-character segments is refused, never joined. The
client itself refuses to list a key with an empty, '.' or '..' segment (`a//b`), and its listing stops there: such a
key fails the whole listing, so the scan changes nothing and names the key until it is renamed (fail closed, never a
partial listing), and the run fails (rag_pipeline.stages.discover records the failure for the staleness check).
"""

from __future__ import annotations

import json
import os
import pickle
import queue
import random
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from rag_pipeline.config import SourceConfig, parse_labels
from rag_pipeline.domain import ids
from rag_pipeline.domain.status import D, DocumentStatus
from rag_pipeline.sources.folders import (
    ETAG_ID,
    FILE_SIDECAR_SUFFIX,
    FOLDER_SIDECAR,
    MAX_SIDECAR_BYTES,
    SECRET_KEYS,
    ChangedSinceScanError,
    DiscoveredFile,
    ScanReport,
    SidecarError,
    UnsafePathError,
    is_sidecar,
    matches_include,
    parse_sidecar,
)

LIST_PAGE = 1000  # keys per listing request (S3's and GCS's maximum, Azure's default is 5000)
MAX_KEY_CHARS = 1024
DOWNLOAD_CHUNK_BYTES = 1 << 20
BATCH = 256  # objects judged together: their sidecar and metadata reads run concurrently


class SourceReadError(OSError):
    """An object could not be read after the retries (the store is down, access denied): the document waits for
    the next run, as it was; nothing is dead-lettered for the store's trouble."""


@dataclass
class StoreCounters:
    """What one scan or download cost in requests and bytes, for the run's metadata."""

    listed: int = 0
    list_requests: int = 0
    sidecar_reads: int = 0
    metadata_reads: int = 0
    bytes_read: int = 0


def _obstore() -> Any:
    try:
        import obstore
    except ImportError:  # obstore is a core dependency; this is a broken install
        raise ImportError("object-store sources need the obstore package: pip install obstore") from None
    return obstore


def split_url(url: str) -> tuple[str, str, str]:
    """'s3://bucket/a/b/' -> ('s3', 'bucket', 'a/b'): scheme, bucket (or container) and prefix without slashes
    at either end."""
    scheme, _, rest = url.partition("://")
    bucket, _, prefix = rest.partition("/")
    return scheme, bucket, prefix.strip("/")


MIN_DOWNLOAD_BYTES_PER_SECOND = 100_000  # a download slower than this on average is given up


def build_store(source: SourceConfig, *, download_bytes: int | None = None) -> Any:
    """The obstore store of a source, credentials from the environment (the variables `credentials_env` names,
    then the cloud's standard chain). A listing's or a metadata read's request is bounded by the source's
    `request_timeout_seconds`; a download of `download_bytes` by that much per read (a stalled stream fails) and by
    that plus the time to move its bytes at MIN_DOWNLOAD_BYTES_PER_SECOND in all (a large file may take long)."""
    from obstore.store import AzureStore, GCSStore, S3Store

    scheme, bucket, prefix = split_url(str(source.root))
    timeout = timedelta(seconds=source.request_timeout_seconds)
    client: dict[str, Any] = {"connect_timeout": timedelta(seconds=min(30.0, source.request_timeout_seconds))}
    if source.allow_http:  # else the client's default, or the environment's (AWS_ALLOW_HTTP, as for an endpoint)
        client["allow_http"] = True
    if download_bytes is None:
        client["timeout"] = timeout
    else:
        client["read_timeout"] = timeout
        client["timeout"] = timeout + timedelta(seconds=download_bytes / MIN_DOWNLOAD_BYTES_PER_SECOND)
    retry = {"max_retries": source.max_retries, "retry_timeout": timedelta(minutes=3),
             "backoff": {"init_backoff": timedelta(milliseconds=200), "max_backoff": timedelta(seconds=15), "base": 2}}
    config: dict[str, Any] = {}
    for key, variable in source.credentials_env.items():
        value = os.environ.get(variable)
        if not value:
            raise SourceReadError(f"source {source.name!r}: credentials_env.{key} names ${variable}, which is not "
                                  "set")
        config[key] = value
    if scheme == "s3":
        if source.endpoint_url:
            config["endpoint"] = source.endpoint_url
        if source.region:
            config["region"] = source.region
        return S3Store(bucket, prefix=prefix or None, config=config, client_options=client, retry_config=retry,
                       credential_provider=_aws_profile_provider(source, config))
    if scheme == "gs":
        if source.endpoint_url:
            config["base_url"] = source.endpoint_url
        return GCSStore(bucket, prefix=prefix or None, config=config, client_options=client, retry_config=retry)
    if source.endpoint_url:
        config["endpoint"] = source.endpoint_url
    return AzureStore(bucket, prefix=prefix or None, config=config, client_options=client, retry_config=retry)


_PROFILE_PROVIDERS: dict[str, Any] = {}  # profile -> its provider: one session's cache for all of a process's stores
PROFILE_CREDENTIALS_TTL = timedelta(minutes=5)  # kept for this long, well inside any session's own expiry


def _aws_profile_provider(source: SourceConfig, config: dict[str, Any]) -> Any:
    """Credentials of an AWS profile (the source's `aws_profile`, else AWS_PROFILE), through boto3's own chain,
    which reads ~/.aws/config and ~/.aws/credentials (assume-role, SSO, static keys) and refreshes them; None
    without a profile (obstore's chain: AWS_* variables, web identity, container and instance roles). As the AWS
    SDKs do, keys in the environment (or named by credentials_env) come before AWS_PROFILE."""
    keys_given = "access_key_id" in config or os.environ.get("AWS_ACCESS_KEY_ID")
    profile = source.aws_profile or (None if keys_given else os.environ.get("AWS_PROFILE"))
    if not profile:
        return None
    if profile in _PROFILE_PROVIDERS:
        return _PROFILE_PROVIDERS[profile]
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError:
        # A profile silently ignored would read with whatever other identity the machine has.
        raise SourceReadError(f"source {source.name!r}: the AWS profile {profile!r} is read through boto3, which "
                              "is not installed: pip install 'dagster-rag-pipeline[aws]'") from None
    try:
        provider = Boto3CredentialProvider(boto3.Session(profile_name=profile), ttl=PROFILE_CREDENTIALS_TTL)
    except Exception as exc:  # noqa: BLE001 - botocore's ProfileNotFound and the like
        raise SourceReadError(f"source {source.name!r}: AWS profile {profile!r}: {exc}") from None
    _PROFILE_PROVIDERS[profile] = provider
    return provider


_CONTROL = re.compile("[\x00-\x1f\x7f\ufffd]")


def key_problem(key: str) -> str | None:
    """Why a key may not become a document (it would escape or alias the prefix, or cannot be stored), or None."""
    if not key or len(key) > MAX_KEY_CHARS:
        return f"key is empty or longer than {MAX_KEY_CHARS} characters"
    wrapped = f"/{key}/"
    if "//" in wrapped or "/./" in wrapped or "/../" in wrapped:
        return "key has an empty, '.' or '..' segment (it would escape or alias the prefix)"
    if _CONTROL.search(key):
        return "key holds control characters (the client lists them as U+FFFD)"
    return None


def _mtime_ns(meta: dict[str, Any]) -> int:
    return int(meta["last_modified"].timestamp() * 1_000_000) * 1000


PAGES_AHEAD = 4  # listing pages fetched while the pages before are judged: memory for 4,000 keys at most


def list_objects(store: Any, counters: StoreCounters) -> Iterator[dict[str, Any]]:
    """Every object under the store's prefix, one listing page at a time (never the whole listing in memory). A
    thread fetches the next pages (at most PAGES_AHEAD) while this one's objects are handled, so the network's wait
    and the per-object work overlap. An error of the listing is raised here, where the pages stop."""
    obstore = _obstore()
    pages: queue.Queue[list[dict[str, Any]] | BaseException | None] = queue.Queue(PAGES_AHEAD)
    stop = threading.Event()

    def fetch() -> None:
        try:
            for page in obstore.list(store, chunk_size=LIST_PAGE):
                while not stop.is_set():
                    try:
                        pages.put(page, timeout=0.5)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            pages.put(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            pages.put(exc)

    fetcher = threading.Thread(target=fetch, name="list-objects", daemon=True)
    fetcher.start()
    try:
        while (page := pages.get()) is not None:
            if isinstance(page, BaseException):
                raise page
            counters.list_requests += 1
            for meta in page:
                counters.listed += 1
                yield meta
    finally:
        stop.set()  # a consumer that stops early (an error, a closed generator) ends the fetching too


def _read_sidecar(store: Any, key: str, size: int, counters: StoreCounters) -> dict[str, Any]:
    """A sidecar's validated object. One larger than MAX_SIDECAR_BYTES by its listing is refused unread; the read
    stops after MAX_SIDECAR_BYTES + 1 bytes whatever the server sends."""
    if size > MAX_SIDECAR_BYTES:
        raise SidecarError(f"sidecar {key} is larger than {MAX_SIDECAR_BYTES} bytes")
    obstore = _obstore()
    try:
        result = obstore.get(store, key, options={"range": (0, MAX_SIDECAR_BYTES + 1)} if size else {})
        raw = bytearray()
        for chunk in result.stream(min_chunk_size=MAX_SIDECAR_BYTES + 1):
            raw += chunk
            if len(raw) > MAX_SIDECAR_BYTES:
                break
    except FileNotFoundError:
        raise SidecarError(f"sidecar {key} was listed but is gone") from None
    except Exception as exc:  # noqa: BLE001 - any failure to read a sidecar holds what it speaks for
        raise SidecarError(f"sidecar {key} cannot be read: {type(exc).__name__}: {str(exc)[:200]}") from None
    counters.sidecar_reads += 1
    return parse_sidecar(bytes(raw), key)


def metadata_labels(attributes: dict[str, str], key_name: str, key: str) -> tuple[str, ...] | None:
    """The labels an object's user metadata gives (None: the key is absent). The value must be a JSON list of
    non-empty strings: anything else is ambiguous ("hr, staff": one label or two?) and holds the object."""
    for name in attributes:
        folded = re.sub(r"[^a-z]", "", name.lower())
        if name.lower() != key_name and ("acl" in folded or "label" in folded):
            # As sidecars refuse `acl-labels` beside `acl_labels`: a near miss must not leave the default labels.
            raise SidecarError(f"object {key}: metadata key {name!r} is not {key_name!r} (the key this source reads "
                               "labels from)")
    found = [value for name, value in attributes.items() if name.lower() == key_name]
    if not found:
        return None
    if len(found) > 1:
        raise SidecarError(f"object {key}: metadata key {key_name!r} appears {len(found)} times")
    try:
        value = json.loads(found[0])
    except json.JSONDecodeError:
        raise SidecarError(f"object {key}: metadata {key_name} is not a JSON list of labels, e.g. "
                           '["hr", "staff"]') from None
    if (not isinstance(value, list) or not all(isinstance(item, str) and item.strip() for item in value)):
        raise SidecarError(f"object {key}: metadata {key_name} must be a JSON list of non-empty strings")
    return parse_labels(value)


class _ChangedSinceListing(Exception):
    """The object was rewritten between the listing and its metadata read: judged at the next scan."""


def _read_metadata(store: Any, key: str, etag: str | None, counters: StoreCounters) -> dict[str, str]:
    obstore = _obstore()
    from obstore.exceptions import PreconditionError

    options: dict[str, Any] = {"head": True}
    if etag:
        options["if_match"] = etag
    try:
        result = obstore.get(store, key, options=options)
    except PreconditionError:
        raise _ChangedSinceListing(key) from None
    except Exception as exc:  # noqa: BLE001 - unreadable metadata holds the object
        raise SidecarError(f"object {key}: its metadata cannot be read: {type(exc).__name__}: "
                           f"{str(exc).splitlines()[0][:200]}") from None
    counters.metadata_reads += 1
    return dict(result.attributes)


@dataclass
class _Listed:
    key: str
    size: int
    mtime_ns: int
    etag: str | None


# The labels a scan stored for objects, by key: (fingerprint, labels), for objects whose fingerprint did not change
# (a metadata change rewrites the object) and that are not racily clean: a metadata copy keeps the ETag, and one
# within the second the last scan listed the object keeps its listed time too. Given by the discover stage.
KnownLabels = Callable[[Sequence[str]], dict[str, tuple[str, tuple[str, ...]]]]


def scan_objects(source: SourceConfig, report: ScanReport | None = None, known: KnownLabels | None = None,
                 counters: StoreCounters | None = None, store: Any = None) -> Iterator[DiscoveredFile]:
    """Yield every matching object under the source's prefix, judged by its sidecars (or its metadata), in listing
    order. A listing that fails raises (the scan then changes nothing); a bad key or an unreadable sidecar is
    reported or holds what it speaks for, and never stops the scan.

    Objects are judged while the listing goes on, with the sidecars listed so far, so that the listing's network
    wait and the judging overlap. A sidecar can come after an object it speaks for (`_meta.json` sorts after
    `A.md` and `2024/` in its prefix; `a.md.meta.json` after `a.md-2.md`): those objects are judged again once the
    listing is complete, from a spool on disk, and yielded with `rejudged` set; that judgment replaces the first
    (rag_pipeline.store.scans.stage_scan)."""
    report = report if report is not None else ScanReport()
    counters = counters if counters is not None else StoreCounters()
    store = store if store is not None else build_store(source)
    sidecars: dict[str, int] = {}  # sidecar key -> its listed size
    judge = _Judge(source, store, sidecars, counters, known, report)
    late_objects: set[str] = set()  # objects judged before their own sidecar was listed
    # Prefixes whose `_meta.json` was listed after an object below them was judged -> spool pages written by then
    late_prefixes: dict[str, int] = {}
    pages_spooled = 0
    judged_under: set[str] = set()  # every prefix ('' is the root) with a judged object below it
    pending: list[_Listed] = []  # listed, not judged yet (at most BATCH)
    pending_keys: set[str] = set()
    with tempfile.TemporaryFile() as spool, \
            ThreadPoolExecutor(source.max_concurrency, thread_name_prefix=f"scan-{source.name}") as pool:

        def judge_pending() -> Iterator[DiscoveredFile]:
            nonlocal pages_spooled
            batch = list(pending)
            pending.clear()
            pending_keys.clear()
            pickle.dump([(item.key, item.size, item.mtime_ns, item.etag) for item in batch], spool)
            pages_spooled += 1
            for directory in dict.fromkeys(item.key.rpartition("/")[0] for item in batch):
                judged_under.update(_prefixes_down_to(directory))
            yield from judge.batch(batch, pool)

        for meta in list_objects(store, counters):
            key = meta["path"]
            problem = key_problem(key)
            if problem:
                report.problem(key.encode("utf-8", "backslashreplace").decode("utf-8")[:300], f"{problem}; skipped")
                continue
            name = key.rpartition("/")[2]
            if name == FOLDER_SIDECAR:
                sidecars[key] = meta["size"]
                prefix = key[:-len(FOLDER_SIDECAR)].rstrip("/")
                judge.forget_prefixes()  # what the prefixes below this one inherit has changed
                if prefix in judged_under:
                    late_prefixes[prefix] = pages_spooled  # objects judged later saw this sidecar
            elif name.endswith(FILE_SIDECAR_SUFFIX):
                sidecars[key] = meta["size"]
                own = key[:-len(FILE_SIDECAR_SUFFIX)]
                if own not in pending_keys and matches_include(own, source.include):
                    late_objects.add(own)  # judged already (or never listed: then nothing to judge again)
            elif matches_include(key, source.include):
                if len(pending) == BATCH:  # judged when the next object comes: its own sidecar is usually listed
                    yield from judge_pending()
                pending.append(_Listed(key, meta["size"], _mtime_ns(meta), meta.get("e_tag")))
                pending_keys.add(key)
        yield from judge_pending()
        if not late_objects and not late_prefixes:
            return
        judge.forget_prefixes()
        spool.seek(0)
        for page_number in range(pages_spooled):
            page = pickle.load(spool)  # noqa: S301 - this scan's own spool, written above
            again = [_Listed(*row) for row in page
                     if row[0] in late_objects
                     or any(late_prefixes.get(prefix, 0) > page_number
                            for prefix in _prefixes_down_to(row[0].rpartition("/")[0]))]
            yield from judge.batch(again, pool, rejudged=True)


def _prefixes_down_to(directory: str) -> list[str]:
    """The prefixes from the root ('') down to `directory` itself: 'a/b' -> ['', 'a', 'a/b']."""
    parts = directory.split("/") if directory else []
    return [""] + ["/".join(parts[:i + 1]) for i in range(len(parts))]


class _Judge:
    """Labels, titles and holds of listed objects, from the sidecars (read once each) or their metadata."""

    def __init__(self, source: SourceConfig, store: Any, sidecars: dict[str, int], counters: StoreCounters,
                 known: KnownLabels | None, report: ScanReport):
        self.source, self.store, self.sidecars, self.counters, self.known = source, store, sidecars, counters, known
        self.report = report
        self.prefixes: dict[str, tuple[dict[str, Any], str | None]] = {}  # prefix -> (inherited meta, held reason)
        self.read: dict[str, dict[str, Any] | SidecarError] = {}
        self.prefix_sidecars: dict[str, list[str]] = {}  # directory -> the folder sidecars above its objects

    def _sidecar(self, key: str) -> dict[str, Any] | SidecarError:
        if key not in self.read:
            try:
                self.read[key] = _read_sidecar(self.store, key, self.sidecars[key], self.counters)
            except SidecarError as exc:
                self.read[key] = exc
        return self.read[key]

    def _prefix(self, prefix: str) -> tuple[dict[str, Any], str | None]:
        """What the `_meta.json` sidecars from the root down to `prefix` ('' is the root) say below it."""
        chain = []
        while prefix not in self.prefixes:
            chain.append(prefix)
            if not prefix:
                break
            prefix = prefix.rpartition("/")[0]
        for current in reversed(chain):
            parent = current.rpartition("/")[0]
            meta, held = ({}, None) if not current else self.prefixes[parent]
            meta = dict(meta)
            sidecar = f"{current}/{FOLDER_SIDECAR}" if current else FOLDER_SIDECAR
            if held is None and sidecar in self.sidecars:
                read = self._sidecar(sidecar)
                if isinstance(read, SidecarError):
                    held = f"{sidecar}: {read}"
                else:
                    meta.update(read)
            self.prefixes[current] = (meta, held)
        return self.prefixes[chain[0] if chain else prefix]

    def forget_prefixes(self) -> None:
        """Drop what the prefixes inherit: a folder sidecar was listed (sidecars already read stay read)."""
        self.prefixes.clear()
        self.prefix_sidecars.clear()

    def batch(self, batch: list[_Listed], pool: ThreadPoolExecutor, rejudged: bool = False
              ) -> Iterator[DiscoveredFile]:
        if not batch:
            return
        if self.sidecars:  # the sidecars of the batch are fetched concurrently, then judged in order
            wanted = [sidecar for item in batch if (sidecar := f"{item.key}{FILE_SIDECAR_SUFFIX}") in self.sidecars]
            for directory in dict.fromkeys(item.key.rpartition("/")[0] for item in batch):
                wanted += self._prefix_sidecars(directory)
            wanted = [key for key in dict.fromkeys(wanted) if key not in self.read]
            for key, read in zip(wanted, pool.map(self._try_sidecar, wanted), strict=True):
                self.read[key] = read
        attributes: dict[str, dict[str, str] | SidecarError | _ChangedSinceListing] = {}
        if self.source.labels_from == "metadata":
            known = self.known([item.key for item in batch]) if self.known else {}
            stale = [item for item in batch if known.get(item.key, ("", ()))[0] != _fingerprint(item)]
            for item, read in zip(stale, pool.map(self._try_metadata, stale), strict=True):
                attributes[item.key] = read
            for item in batch:
                if item.key not in attributes:
                    attributes[item.key] = {self.source.labels_metadata_key: json.dumps(list(known[item.key][1]))}
        for item in batch:
            read = attributes.get(item.key)
            if isinstance(read, _ChangedSinceListing):
                self.report.problem(item.key, "rewritten since the listing; kept as it was until the next scan",
                                    unreadable=True)
                continue
            yield self._judge(item, read, rejudged)

    def _prefix_sidecars(self, directory: str) -> list[str]:
        """The `_meta.json` sidecars listed so far from the root down to `directory` ('' is the root)."""
        if directory not in self.prefix_sidecars:
            self.prefix_sidecars[directory] = [
                sidecar for prefix in _prefixes_down_to(directory)
                if (sidecar := f"{prefix}/{FOLDER_SIDECAR}" if prefix else FOLDER_SIDECAR) in self.sidecars]
        return self.prefix_sidecars[directory]

    def _try_sidecar(self, key: str) -> dict[str, Any] | SidecarError:
        try:
            return _read_sidecar(self.store, key, self.sidecars[key], self.counters)
        except SidecarError as exc:
            return exc

    def _try_metadata(self, item: _Listed) -> dict[str, str] | SidecarError | _ChangedSinceListing:
        try:
            return _read_metadata(self.store, item.key, item.etag, self.counters)
        except (SidecarError, _ChangedSinceListing) as exc:
            return exc

    def _judge(self, item: _Listed, attributes: dict[str, str] | SidecarError | None, rejudged: bool
               ) -> DiscoveredFile:
        meta, held_reason = self._prefix(item.key.rpartition("/")[0])
        meta = dict(meta)
        held: tuple[DocumentStatus, str] | None = (D.HELD_BAD_SIDECAR, held_reason) if held_reason else None
        if held is None and not item.etag:
            # Without an ETag a download cannot be pinned to the version judged here (If-Match).
            held = (D.HELD_BAD_SIDECAR, "the store lists no ETag for it: the version read could not be the one "
                    "judged")
        sidecar = f"{item.key}{FILE_SIDECAR_SUFFIX}"
        if held is None and sidecar in self.sidecars:
            read = self._sidecar(sidecar)
            self.read.pop(sidecar, None)  # one object's own: not needed again (memory stays flat)
            if isinstance(read, SidecarError):
                held = (D.HELD_BAD_SIDECAR, str(read))
            else:
                meta.update(read)
        labels = tuple(meta.pop("acl_labels")) if "acl_labels" in meta else None
        if held is None and self.source.labels_from == "metadata":
            # One place says who may read: labels in a sidecar beside metadata labels are ambiguous.
            if labels is not None:
                held = (D.HELD_BAD_SIDECAR, "a sidecar sets acl_labels, but this source takes labels from object "
                        "metadata (labels_from: metadata)")
            elif isinstance(attributes, SidecarError):
                held = (D.HELD_BAD_SIDECAR, str(attributes))
            else:
                try:
                    labels = metadata_labels(attributes or {}, self.source.labels_metadata_key, item.key)
                except SidecarError as exc:
                    held = (D.HELD_BAD_SIDECAR, str(exc))
        if labels is None:
            labels = self.source.acl_labels
        title = meta.pop("title", None)
        return DiscoveredFile(
            source=self.source.name, rel_path=item.key, doc_id=ids.doc_id(self.source.name, item.key),
            size_bytes=item.size, mtime_ns=item.mtime_ns,
            acl_labels=() if held else labels,
            title=str(title) if title is not None and not held else None,
            metadata={} if held else {k: v for k, v in meta.items() if k not in SECRET_KEYS},
            held=held, file_id=f"{ETAG_ID}{item.etag}" if item.etag else None, rejudged=rejudged,
        )


def _fingerprint(item: _Listed) -> str:
    base = f"{item.size}:{item.mtime_ns}"
    return f"{base}:{item.etag}" if item.etag else base


def objects_digest(source: SourceConfig) -> str:
    """A digest of the listing (keys, ETags, sizes, times; sidecars' too): it changes exactly when a refresh
    would have work to do, at the cost of the listing alone. Raises when the listing fails."""
    import hashlib

    digest = hashlib.sha256()
    for meta in list_objects(build_store(source), StoreCounters()):
        if not (is_sidecar(meta["path"].rsplit("/", 1)[-1]) or matches_include(meta["path"], source.include)):
            continue
        digest.update(json.dumps([meta["path"], meta["size"], _mtime_ns(meta), meta.get("e_tag")]).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def object_password(source: SourceConfig, key: str) -> str | None:
    """The password an object's sidecar gives for an encrypted PDF, read only when parsing needs it."""
    obstore = _obstore()
    store = build_store(source)
    sidecar = f"{key}{FILE_SIDECAR_SUFFIX}"
    try:
        size = obstore.head(store, sidecar)["size"]
    except FileNotFoundError:
        return None
    except Exception as exc:  # noqa: BLE001 - the store's trouble: the document waits, it is not dead-lettered
        raise SourceReadError(f"sidecar {sidecar} cannot be read: {str(exc).splitlines()[0][:200]}") from None
    try:
        password = _read_sidecar(store, sidecar, size, StoreCounters()).get("password")
    except SidecarError as exc:
        if "cannot be read" in str(exc):
            raise SourceReadError(str(exc)) from None
        return None  # malformed: the scan held the document already
    return str(password) if password is not None else None


def download_judged(source: SourceConfig, key: str, file_id: str | None, size: int, target: Path,
                    counters: StoreCounters | None = None, store: Any = None) -> str | None:
    """Write the object the scan judged to `target` (a private file), streamed: exactly its listed ETag
    (If-Match), exactly its listed size. A cut connection or a server error is retried with backoff; a newer
    version raises ChangedSinceScanError (it waits for the next scan), a deleted object FileNotFoundError.
    Returns the object's Content-Encoding (None without one): `target` holds the bytes as stored, which the caller
    decodes (rag_pipeline.parsing.limits.decode_content_encoding), bounded, before they are parsed."""
    obstore = _obstore()
    from obstore.exceptions import NotFoundError, PermissionDeniedError, PreconditionError

    if key_problem(key):
        raise UnsafePathError(f"refusing key {key!r}")
    counters = counters if counters is not None else StoreCounters()
    store = store if store is not None else build_store(source, download_bytes=size)
    options = {"if_match": file_id.removeprefix(ETAG_ID)} if file_id and file_id.startswith(ETAG_ID) else {}
    attempts = source.max_retries + 1
    for attempt in range(attempts):
        written = 0
        try:
            result = obstore.get(store, key, options=options)
            if options and _bare_etag(result.meta.get("e_tag")) != _bare_etag(options["if_match"]):
                # A server or gateway that ignores If-Match must not hand over another version unnoticed.
                raise ChangedSinceScanError("the store answered with another version than the one listed")
            with open(target, "wb") as out:
                for chunk in result.stream(min_chunk_size=DOWNLOAD_CHUNK_BYTES):
                    written += len(chunk)
                    if written > size:
                        raise ChangedSinceScanError("the object is larger than the listing said")
                    out.write(chunk)
            counters.bytes_read += written
            if written != size:
                raise _ShortRead(f"{written} of {size} bytes arrived")
            return result.attributes.get("Content-Encoding") or None
        except PreconditionError:
            raise ChangedSinceScanError("a newer version was written since the scan") from None
        except NotFoundError:
            raise FileNotFoundError(key) from None
        except PermissionDeniedError as exc:
            raise SourceReadError(f"access denied: {str(exc).splitlines()[0][:200]}") from None
        except ChangedSinceScanError:
            raise
        except Exception as exc:  # noqa: BLE001 - a cut stream, a timeout, 5xx after obstore's own retries
            counters.bytes_read += written
            if attempt + 1 == attempts:
                raise SourceReadError(f"download failed after {attempts} attempts: {type(exc).__name__}: "
                                      f"{str(exc).splitlines()[0][:200] if str(exc) else ''}") from None
            time.sleep(min(15.0, 0.5 * 2 ** attempt) * (0.5 + random.random() / 2))


def _bare_etag(etag: str | None) -> str | None:
    """An ETag as the stores disagree on writing it: without a weak marker and quotes (Azure lists it bare, answers a
    GET with it quoted)."""
    return etag.removeprefix("W/").strip('"') if etag else None


class _ShortRead(OSError):
    """The stream ended before the listed size: retried, never indexed half."""
