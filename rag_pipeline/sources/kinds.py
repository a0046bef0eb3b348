"""One entry point per thing a source does, whatever its kind: a folder (rag_pipeline.sources.folders) or an
object store's prefix (rag_pipeline.sources.object_stores). A new kind is one module and a branch here."""

from __future__ import annotations

from collections.abc import Iterator

from rag_pipeline.config import SourceConfig
from rag_pipeline.sources import folders
from rag_pipeline.sources.folders import DiscoveredFile, ScanReport


def root_problem(source: SourceConfig) -> str | None:
    """Why a source cannot be scanned at all right now (nothing of it may change), or None. An object store is
    only known to be reachable by listing it, which the scan does (a failed listing changes nothing)."""
    if source.store_scheme is None and not source.folder.is_dir():
        return f"root folder {source.folder} is missing"
    return None


def scan(source: SourceConfig, report: ScanReport, known: object = None,
         counters: object = None) -> Iterator[DiscoveredFile]:
    if source.store_scheme is None:
        return folders.scan_source(source, report)
    from rag_pipeline.sources import object_stores

    return object_stores.scan_objects(source, report, known, counters)  # type: ignore[arg-type]


def digest(source: SourceConfig) -> str:
    """What a refresh of the source would see, as a digest; raises when an object store cannot be listed."""
    if source.store_scheme is None:
        return folders.source_digest(source)
    from rag_pipeline.sources import object_stores

    return object_stores.objects_digest(source)


def password(source: SourceConfig, read_path: str) -> str | None:
    if source.store_scheme is None:
        return folders.document_password(source, read_path)
    from rag_pipeline.sources import object_stores

    return object_stores.object_password(source, read_path)
