"""Stage 2: parse new and changed documents through the cascade, clean them, and gate on content_hash.

A document whose cleaned text did not change goes straight back to `indexed` (no chunking, no embedding), unless
its labels changed in the same scan: then it is chunked again from its pages, so that its chunks join the
near-duplicate groups of their new label set (vectors from the embedding cache).
Anything that cannot be parsed is dead-lettered with a specific reason; the run goes on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import psycopg

from rag_pipeline import store
from rag_pipeline.config import SourceConfig
from rag_pipeline.domain.refs import in_log
from rag_pipeline.domain.status import DocumentStatus
from rag_pipeline.parsing.cascade import Cascade, parse_document
from rag_pipeline.parsing.descriptions import PROMPT_VERSION, DescriptionCache, PictureDescriber
from rag_pipeline.parsing.limits import decode_content_encoding
from rag_pipeline.parsing.pages import DeadLetter, ParsedPage
from rag_pipeline.sources import kinds
from rag_pipeline.sources.folders import ChangedSinceScanError, UnsafePathError, open_judged
from rag_pipeline.sources.object_stores import SourceReadError, download_judged
from rag_pipeline.stages.common import StageStats, count
from rag_pipeline.store.queue import PendingDocument
from rag_pipeline.text import dedup
from rag_pipeline.text.cleaning import clean_parsed_pages, content_hash

log = logging.getLogger(__name__)
D = DocumentStatus


@dataclass
class ParseStats(StageStats):
    parsed: int = 0
    requeued_for_new_parser: int = 0  # PDFs and decks parsed again for what a newer parser keeps (REPARSE_PDFS_BELOW)
    content_unchanged: int = 0  # file changed, text did not: no chunking, no embedding
    regrouped: int = 0  # of those, relabelled too: chunked again into their label set's groups (nothing embedded)
    dead_lettered: int = 0
    vanished: int = 0
    changed_since_scan: int = 0  # left for the next scan: the file is not the one it judged
    unreadable: int = 0  # left for the next run: its object store could not be read (down, access denied)
    objects_downloaded: int = 0
    bytes_downloaded: int = 0
    pages: int = 0
    tiers: dict[str, int] = field(default_factory=dict)
    dead_letter_reasons: dict[str, int] = field(default_factory=dict)
    chars_removed: dict[str, int] = field(default_factory=dict)  # by cleaning rule
    escalated: int = 0  # pages that failed the structural check
    escalation_reasons: dict[str, int] = field(default_factory=dict)
    unresolved_pages: int = 0  # failed the check and no tier could do better
    tiers_unavailable: dict[str, str] = field(default_factory=dict)
    pictures: dict[str, int] = field(default_factory=dict)  # found, by kind (and whose words OCR read)
    # pictures a vision-language model described (parsing.vlm.describe_pictures): asked now, from the cache, left
    # without one (a budget spent), or not answered
    pictures_described: int = 0
    picture_descriptions_cached: int = 0
    pictures_over_budget: int = 0
    picture_description_failures: int = 0
    SUMMARY = ("parsed", "requeued_for_new_parser", "content_unchanged", "dead_lettered", "dead_letter_reasons",
               "pages", "objects_downloaded", "bytes_downloaded", "pictures_described")


def _describe_pictures(conn: psycopg.Connection, doc_id: str, path: Path, password: str | None,
                       parsed: list[ParsedPage], describer: PictureDescriber, stats: ParseStats) -> None:
    """The pictures' descriptions, from the document's cache in the database or the model (while the file is open)."""
    cache = DescriptionCache(
        lookup=lambda sha: store.pages.cached_description(conn, doc_id, sha, PROMPT_VERSION, describer.model),
        keep=lambda sha, text: store.pages.keep_description(conn, doc_id, sha, PROMPT_VERSION, describer.model, text))
    described = describer.describe(path, password, parsed, cache)
    stats.pictures_described += described.described
    stats.picture_descriptions_cached += described.cached
    stats.pictures_over_budget += described.over_budget
    stats.picture_description_failures += described.failed


def parse_one(
    conn: psycopg.Connection, doc: PendingDocument, source: SourceConfig, version: str, cascade: Cascade,
    stats: ParseStats, describer: PictureDescriber | None = None,
) -> None:
    read_path = doc.read_path or doc.rel_path
    size, mtime_ns = (int(part) for part in doc.fingerprint.split(":")[:2])  # an object's ETag follows
    try:
        if size > cascade.config.max_file_bytes:
            raise DeadLetter("too_large", f"{size:,} bytes; parsing.max_file_bytes is {cascade.config.max_file_bytes:,}")
        # Only a PDF opens with a sidecar's password: no sidecar read (for an object, a request) for anything else.
        password = kinds.password(source, read_path) if read_path.lower().endswith(".pdf") else None
        # Exactly what the scan judged: a folder's file reached without following a link (a name swapped since
        # for a link, to a file with other labels, or for another file is left for the next scan to judge
        # again), an object at exactly its listed ETag.
        with judged_copy(source, read_path, size, mtime_ns, doc.file_id, doc.file_links,
                         max_file_bytes=cascade.config.max_file_bytes) as path:
            # Only page text is kept in memory (pdfplumber frees each page's objects as it goes), because
            # furniture is found by comparing pages.
            if source.store_scheme is not None:
                stats.objects_downloaded += 1
                stats.bytes_downloaded += size
            parsed = parse_document(path, password, cascade)
            if describer is not None and any(page.signals.get("pictures") for page in parsed):
                _describe_pictures(conn, doc.doc_id, path, password, parsed, describer, stats)
        removed = clean_parsed_pages(parsed)
        new_hash = content_hash([page.markdown for page in parsed])
        unchanged = new_hash == doc.indexed_content_hash
        with conn.transaction():
            if not store.queue.claim(conn, doc.doc_id, D.PENDING_PARSE, doc.fingerprint, doc.file_id):
                stats.vanished += 1
                return
            # The labels read under the row lock: a scan that changed them with the bytes left the chunks in the
            # groups of the old label set, which must not be kept (a same-text document of that set would join
            # a group whose row speaks for these labels).
            regroup = unchanged and store.groups.in_other_groups(
                conn, doc.doc_id, dedup.acl_key(store.queue.current_labels(conn, doc.doc_id)))
            # the PDF's metadata is read into the document's identity when it is chunked: a change to it alone
            # (a fixed Author or Title) chunks the document again
            retitled = unchanged and parsed and store.pages.pdf_metadata(conn, doc.doc_id) != (
                parsed[0].signals.get("pdf_metadata") or {})
            # and so are the pictures it keeps beside its text (figure chunks)
            repictured = unchanged and store.pages.picture_records(conn, doc.doc_id) != [
                page.signals.get("pictures") for page in parsed]
            store.pages.replace_pages(conn, doc.doc_id, parsed, version)
            chunk_again = regroup or retitled or repictured
            store.queue.finish_parse(conn, doc.doc_id, new_hash, len(parsed), version,
                                   D.INDEXED if unchanged and not chunk_again else D.PENDING_CHUNK, removed)
            store.pages.clear_dead_letter(conn, doc.doc_id)
    except UnsafePathError as exc:
        dead_letter(conn, doc, DeadLetter("unsupported", str(exc)), stats)
        return
    except ChangedSinceScanError as exc:
        log.info("%s: %s; left for the next scan", *in_log(doc.source, doc.rel_path, doc.ref, exc))
        stats.changed_since_scan += 1
        return
    except SourceReadError as exc:
        log.warning("%s: %s; left for the next run", *in_log(doc.source, doc.rel_path, doc.ref, exc))
        stats.unreadable += 1
        return
    except FileNotFoundError:
        stats.vanished += 1  # deleted after discovery; the next scan logs the deletion
        return
    except DeadLetter as exc:
        dead_letter(conn, doc, exc, stats)
        return
    except Exception as exc:  # a parser bug must not stop the run or lose the document
        log.error("parser failed on %s: %s",
                  *in_log(doc.source, doc.rel_path, doc.ref, "".join(traceback.format_exception(exc))))
        dead_letter(conn, doc, DeadLetter("parser_error", f"{type(exc).__name__}: {exc}"), stats)
        return
    if unchanged:
        stats.content_unchanged += 1
        stats.regrouped += int(regroup)
    else:
        stats.parsed += 1
    stats.pages += len(parsed)
    for page in parsed:
        count(stats.tiers, page.tier)
        if "escalation" in page.signals:
            stats.escalated += 1
            count(stats.escalation_reasons, page.signals["escalation"])
        if page.signals.get("unresolved"):
            stats.unresolved_pages += 1
        for record in page.signals.get("pictures") or []:
            if isinstance(record, dict):
                read_by = " (words by OCR)" if record.get("text_read_by") == "ocr" else ""
                count(stats.pictures, f"{record.get('kind')}{read_by}")
    for rule, removed_chars in removed.items():
        count(stats.chars_removed, rule, removed_chars)


COPY_CHUNK_BYTES = 1 << 20
PRIVATE_COPY_PREFIX = "rag-parse-"


@contextlib.contextmanager
def judged_copy(source: SourceConfig, read_path: str, size: int, mtime_ns: int, file_id: str | None,
                file_links: int | None, *, max_file_bytes: int) -> Iterator[Path]:
    """The bytes the scan judged, in a private folder (mode 0700) named after this process (so that a worker
    killed mid-parse leaves nothing for long: remove_orphaned_copies), under the suffix the parsers dispatch on:
    nothing at the source can change what the parsers read. An object stored with a Content-Encoding (gzip,
    deflate) is decoded, at most `max_file_bytes` of it, so it is parsed as its type, not as compressed bytes."""
    suffix = PurePosixPath(read_path).suffix
    suffix = suffix if re.fullmatch(r"\.[A-Za-z0-9]{1,16}", suffix) else ""
    with tempfile.TemporaryDirectory(prefix=f"{PRIVATE_COPY_PREFIX}{os.getpid()}-") as folder:
        path = Path(folder) / f"document{suffix}"
        if source.store_scheme is None:
            fd = open_judged(source.folder.resolve(), read_path, size, mtime_ns, file_id, file_links)
            copy_descriptor(fd, size, path)
        else:
            encoding = download_judged(source, read_path, file_id, size, path)
            if encoding:
                decode_content_encoding(path, encoding, max_file_bytes)
        yield path


def copy_descriptor(fd: int, size: int, path: Path) -> None:
    """Copy the open file's bytes to `path`; `fd` is closed. A file whose length or modification time changed
    while it was copied is changed since the scan."""
    with os.fdopen(fd, "rb") as source:
        before = os.fstat(source.fileno())
        copied = 0
        with open(path, "wb") as target:
            while chunk := source.read(min(COPY_CHUNK_BYTES, size + 1 - copied)):
                copied += len(chunk)
                if copied > size:
                    raise ChangedSinceScanError("the file grew since the scan")
                target.write(chunk)
        after = os.fstat(source.fileno())
        if copied != size or after.st_size != size or after.st_mtime_ns != before.st_mtime_ns:
            raise ChangedSinceScanError("the file changed while it was read")


def remove_orphaned_copies(folder: Path | None = None) -> int:
    """Remove the private copies of processes that are gone (a worker killed over its time or memory budget
    has no chance to); returns how many."""
    import shutil

    import psutil

    removed = 0
    for entry in Path(folder or tempfile.gettempdir()).glob(f"{PRIVATE_COPY_PREFIX}*-*"):
        pid = entry.name[len(PRIVATE_COPY_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)) and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
            removed += 1
    return removed


def dead_letter(conn: psycopg.Connection, doc: PendingDocument, exc: DeadLetter, stats: ParseStats) -> bool:
    """Park the document with its reason; its old rows leave the index. It is retried when its file changes.
    Only a document still queued for parsing or chunking, and for the same file, is parked."""
    with conn.transaction():
        store.groups.lock_assignment(conn)  # before the row lock (see store.groups)
        status = store.queue.lock_queued(conn, doc.doc_id, doc.fingerprint, doc.file_id)
        if status not in (D.PENDING_PARSE, D.PENDING_CHUNK):
            return False
        store.scans.delete_derived_rows(conn, [doc.doc_id])
        store.pages.record_dead_letter(conn, doc.doc_id, exc.reason, exc.detail, doc.fingerprint)
        store.queue.mark_dead_letter(conn, doc.doc_id)
    log.warning("dead-lettered %s: %s", *in_log(doc.source, doc.rel_path, doc.ref, exc))
    stats.dead_lettered += 1
    count(stats.dead_letter_reasons, exc.reason)
    return True
